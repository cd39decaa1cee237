"""Time to the first step (``make bench``): the README's training quick start
(smollm2-135m-instruct, 2 gloo ranks, one vLLM CPU server) as ``agentloop-train``, from the
command to its first step's metrics on the console, as it ran before issue 53 (the engine's
model in a worker process of its own, vLLM's CPU default ``VLLM_ENABLE_V1_MULTIPROCESSING=1``;
an old-log-prob pass before every update, ``actor.recompute_old_log_prob=true``; FSDP2
gathering the parameters for each micro-batch's forward and again for its backward,
``fsdp_config.reshard_after_forward=true``) and as it runs now (the model inside the
engine-core process, ``servers/cpu_layout.py``; a step of one optimizer step takes its old
log-probs from the update's own forward; on CPU the parameters gathered once per optimizer
step; vLLM's compiled sampler helpers run eagerly, ``TORCHDYNAMO_DISABLE=1``), and as now but
with those helpers compiled again (``TORCHDYNAMO_DISABLE=0``: inductor's C++ compile from a
cold cache in the engine's fresh temp dir, as every start did before). Runs alternate so
drift hits each alike; each mark is the seconds from the command to the first console line
holding its text. Writes bench_results/first_step.json."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.perf.quick_start import quick_start_overrides, write_task

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 2
# name: (environment, extra overrides)
SETTINGS = {
    "before": (
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "TORCHDYNAMO_DISABLE": "0"},
        [
            "actor_rollout_ref.actor.recompute_old_log_prob=true",
            "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=true",
        ],
    ),
    "now, sampler compiled": (
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TORCHDYNAMO_DISABLE": "0"},
        [],
    ),
    "now": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, []),
}
MARKS = {
    "ranks ready": "FSDP2 rank(s) on",
    "server ready": "vllm server(s) ready",
    "first step": "agentloop.train: step 1",
}


def _run(
    folder: Path, data: Path, reward: Path, setting: dict[str, str], extra: list[str]
) -> dict[str, float]:
    """Seconds from the command to each of ``MARKS``, and step 1's timings (0: not run)."""
    overrides = quick_start_overrides(data, reward, folder, 1, "[console,jsonl]") + extra
    env = {**os.environ, **setting}
    env.pop("RAY_ADDRESS", None)
    if "TORCHDYNAMO_DISABLE" not in setting:
        env.pop("TORCHDYNAMO_DISABLE", None)  # the server's own default
    start = time.monotonic()
    seen: dict[str, float] = {}
    with subprocess.Popen(
        [sys.executable, "-m", "trainer.cli.train", *overrides],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            for mark, text in MARKS.items():
                if mark not in seen and text in line:
                    seen[mark] = time.monotonic() - start
        code = proc.wait(timeout=900)
    assert code == 0 and len(seen) == len(MARKS), "".join(tail)
    record = json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor"):
        seen[key.split("/")[-1]] = record.get(key, 0.0)
    return seen


def test_bench_time_to_the_first_step(tmp_path):
    data, reward = write_task(tmp_path)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in SETTINGS}
    for r in range(ROUNDS):
        for i, (name, (setting, extra)) in enumerate(SETTINGS.items()):
            runs[name].append(_run(tmp_path / f"{i}-{r}", data, reward, setting, extra))
    keys = [*MARKS, "gen", "old_log_prob", "update_actor"]
    print(
        f"\ntime to the first step (README quick start; seconds since the command, median of "
        f"{ROUNDS} runs per setting, alternating)"
    )
    print(f"  {'':<22}" + "".join(f"{k:>14}" for k in keys) + "   each run")
    for name, values in runs.items():
        cells = "".join(f"{statistics.median(v[k] for v in values):>14.1f}" for k in keys)
        each = " / ".join(f"{v['first step']:.1f}" for v in values)
        print(f"  {name:<22}{cells}   {each}")
    before, compiled, after = (
        statistics.median(v["first step"] for v in runs[k]) for k in SETTINGS
    )
    print(
        f"  first step: {after:.1f} s now vs {before:.1f} s before, {after / before:.2f}x "
        f"({1 - after / before:.0%} less; issue 53's target: 30% less)"
    )
    ready, ready_compiled = (
        statistics.median(v["server ready"] for v in runs[k])
        for k in ("now", "now, sampler compiled")
    )
    print(
        f"  sampler helpers eager vs compiled: first step {after:.1f} s vs {compiled:.1f} s "
        f"({after / compiled:.2f}x), server ready {ready:.1f} s vs {ready_compiled:.1f} s"
    )
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "first_step.json").write_text(json.dumps(runs, indent=2) + "\n")
    assert all(v["first step"] > v["server ready"] for vs in runs.values() for v in vs)

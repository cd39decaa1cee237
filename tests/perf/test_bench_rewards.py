"""Reward benchmark (``make bench``): what parallel scoring buys, both sides in one run.

1. Rule, CPU-bound: the built-in math scorer (math-verify, symbolic) on 16 answers, one call at
   a time vs the process pool (one process per core) vs the thread pool (4 threads, GIL-bound).
2. Rule, I/O-bound: a scorer that waits 50 ms (a remote check), 64 samples, 1 thread vs 16.
3. Judge: a tiny-qwen3 judge group (one vLLM CPU server) scoring 16 responses with
   max_concurrency=1 vs 16 (the engine batches concurrent requests).

Each side is warmed up once, then timed. Writes bench_results/rewards.json. Target (printed):
the pools are >= 1.5x faster than one call at a time where the work allows it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import ray
from transformers import AutoTokenizer

from servers import stop_servers
from tests.ray_local import init_local_ray
from tests.unit.trainer.rewards.batch import make_batch
from trainer.config.reward import JudgeConfig, RewardFunctionConfig, RewardModelConfig
from trainer.launch.rollout import start_judge
from trainer.rewards import JudgeReward, RewardManager

REPO = Path(__file__).resolve().parents[2]
CORES = os.cpu_count() or 1

SLOW_IO = (
    "import time\n"
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    time.sleep(0.05)\n"
    "    return 1.0\n"
)


def timed(manager: RewardManager, batch, warm=None) -> tuple[float, list[float]]:
    """Seconds to score ``batch`` after a warm-up on ``warm`` (other samples, so that no side
    is timed on answers its caches have already seen)."""
    manager.score(warm if warm is not None else batch)
    start = time.perf_counter()
    out = manager.score(batch)
    return time.perf_counter() - start, out.scores.tolist()


def rule_manager(tokenizer, **rule) -> RewardManager:
    return RewardManager(RewardFunctionConfig(**rule), RewardModelConfig(), tokenizer)


@pytest.mark.slow
def test_bench_reward_parallelism(tmp_path, tiny_qwen3_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    results: dict[str, float] = {}
    lines = [f"reward benchmark ({CORES} cores)"]

    # 1. math-verify, CPU-bound
    n = 16

    def trig(offset: int):
        answers = [
            f"So \\boxed{{\\sin({i + 2}x)^2 + \\cos({i + 2}x)^2 + {i}}}"
            for i in range(offset, offset + n)
        ]
        truths = [str(i + 1) for i in range(offset, offset + n)]
        return make_batch(tokenizer, answers, truths=truths, data_source="math", response_length=64)

    batch, warm = trig(0), trig(100)
    sides = {
        "serial": {"num_workers": 1},
        "process": {"num_workers": CORES, "executor": "process"},
        "thread": {"num_workers": 4},
    }
    scores = {}
    for name, rule in sides.items():
        manager = rule_manager(tokenizer, timeout_s=120.0, **rule)
        try:
            results[f"math_{name}_s"], scores[name] = timed(manager, batch, warm)
        finally:
            manager.close()
    assert scores["serial"] == scores["process"] == scores["thread"]
    assert sum(scores["serial"]) == n  # every answer is equivalent to its truth
    s, p, t = (results[f"math_{k}_s"] for k in ("serial", "process", "thread"))
    lines.append(
        f"  math-verify x{n} (trig identities): serial {s:.2f} s | process pool ({CORES}) "
        f"{p:.2f} s ({s / p:.2f}x) | threads (4) {t:.2f} s ({s / t:.2f}x)"
    )

    # 2. I/O-bound scorer
    path = tmp_path / "slow_io.py"
    path.write_text(SLOW_IO)
    io_batch = make_batch(tokenizer, ["a"] * 64)
    for name, workers in (("serial", 1), ("threads", 16)):
        manager = rule_manager(tokenizer, path=str(path), num_workers=workers)
        try:
            results[f"io_{name}_s"], _ = timed(manager, io_batch)
        finally:
            manager.close()
    s, t = results["io_serial_s"], results["io_threads_s"]
    lines.append(f"  50 ms scorer x64: serial {s:.2f} s | threads (16) {t:.2f} s ({s / t:.2f}x)")

    # 3. judge group on tiny-qwen3
    init_local_ray()
    judge = JudgeConfig(
        enable=True, model_path=str(tiny_qwen3_path), max_model_len=512, max_tokens=32
    )
    servers, client, judge_tokenizer = start_judge(judge, "cpu")
    try:
        judge_batch = make_batch(tokenizer, [f"The answer is {i}." for i in range(16)])
        for name, concurrency in (("serial", 1), ("concurrent", 16)):
            judge.max_concurrency = concurrency
            manager = RewardManager(
                RewardFunctionConfig(),
                RewardModelConfig(judge=judge, weights={"rule": 0.0}),
                tokenizer,
                judge=JudgeReward(judge, client, judge_tokenizer),
            )
            try:
                results[f"judge_{name}_s"], _ = timed(manager, judge_batch)
            finally:
                manager.close()
    finally:
        stop_servers(servers)
        ray.shutdown()
    s, c = results["judge_serial_s"], results["judge_concurrent_s"]
    lines.append(
        f"  judge x16 (tiny-qwen3, 32 tokens): concurrency 1 {s:.2f} s | 16 {c:.2f} s "
        f"({s / c:.2f}x)"
    )
    lines.append("  target: pools >= 1.5x over one call at a time where the work allows it")
    print("\n" + "\n".join(lines))
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "rewards.json").write_text(json.dumps(results, indent=1))

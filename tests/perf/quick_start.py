"""The README's training quick start as the benchmarks run it: its arithmetic rows, its
reward file and its ``agentloop-train`` overrides (smollm2-135m-instruct, 4 prompts x 4
samples, 2 gloo ranks, one vLLM CPU server)."""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["REWARD", "quick_start_overrides", "write_task"]

REWARD = """import re

def compute_score(data_source, solution_str, ground_truth, extra_info):
    numbers = re.findall(r"-?\\d+", solution_str)
    return float(bool(numbers) and numbers[-1] == ground_truth)
"""


def write_task(folder: Path) -> tuple[Path, Path]:
    """The quick start's 64 seeded rows and its reward file in ``folder``: (data, reward)."""
    data, reward = folder / "arith.jsonl", folder / "reward.py"
    rng = random.Random(0)
    with data.open("w") as f:
        for _ in range(64):
            a, b = rng.randint(2, 20), rng.randint(2, 20)
            question = f"What is {a}+{b}? Reply with the number only."
            row = {
                "prompt": [{"role": "user", "content": question}],
                "data_source": "arith",
                "reward_model": {"ground_truth": str(a + b)},
            }
            f.write(json.dumps(row) + "\n")
    reward.write_text(REWARD)
    return data, reward


def quick_start_overrides(
    data: Path, reward: Path, folder: Path, steps: int, logger: str = "[jsonl]"
) -> list[str]:
    """The quick start's overrides for ``steps`` steps into run folder ``folder``, with no
    checkpoint."""
    return [
        f"data.train_files={data}", "data.train_batch_size=4",
        f"custom_reward_function.path={reward}",
        "actor_rollout_ref.model.path=smollm2-135m-instruct",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.response_length=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-6",
        "trainer.n_gpus_per_node=2", f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1", f"trainer.logger={logger}", f"trainer.default_local_dir={folder}",
    ]  # fmt: skip

"""Run a recipe's or example's CPU run script for one GRPO step on tiny-qwen3 (the shared
scaffolding of the run-script e2e tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

ONE_STEP = [
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.response_length=64",
    "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.total_training_steps=1",
    "trainer.test_freq=1",
]


def make_data(module: str, *args: str) -> None:
    """``python -m module *args`` from the repository root (a recipe's data script)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, check=True, env=env)


def run_script(
    script: str, data: Path, run: Path, *overrides: str, **env: str
) -> subprocess.CompletedProcess:
    """``bash script`` with MODEL=tiny-qwen3, DATA, RUN and ``env``, the one-step overrides
    plus ``overrides``; asserts it exits 0."""
    full_env = {
        **os.environ,
        "MODEL": "tiny-qwen3",
        "DATA": str(data),
        "RUN": str(run),
        "PY": sys.executable,
        "PYTHONPATH": str(REPO),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **env,
    }
    return run_bash([script, *ONE_STEP, *overrides], REPO, full_env)


def run_bash(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``bash *args`` in ``cwd`` with ``env``, output captured; asserts it exits 0."""
    proc = subprocess.run(
        ["bash", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc

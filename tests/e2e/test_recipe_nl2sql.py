"""The nl2sql recipe's run script for one GRPO step on tiny-qwen3: generated SQLite data,
tool_agent rows with the run_sql tool, the verify reward running gold and final SQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_run_script_trains_a_step_with_the_verify_reward(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.nl2sql.data",
            "--out",
            str(data),
            "--train",
            "4",
            "--val",
            "2",
        ],
        cwd=REPO,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    env = {
        **os.environ,
        "MODEL": "tiny-qwen3",
        "DATA": str(data),
        "RUN": str(run),
        "PY": sys.executable,
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    overrides = [
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
    ]
    proc = subprocess.run(
        ["bash", "recipes/nl2sql/run_cpu.sh", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1
    assert "reward/verify" in record and "reward/verify/executed" in record
    assert "reward/rule" not in record  # weight 0 turns the rule off
    assert "val/nl2sql/reward/mean" in record

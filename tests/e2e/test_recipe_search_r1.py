"""The search_r1 recipe's run script for one GRPO step on tiny-qwen3: the generated world,
the BM25 index served by the recipe's MCP server over stdio inside the rollout workers, the
exact-match reward with format terms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_run_script_trains_a_step_with_the_mcp_search_tool(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.search_r1.data",
            "--out",
            str(data),
            "--synthetic",
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
        ["bash", "recipes/search_r1/run_cpu.sh", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1
    assert {"reward/rule/em", "reward/rule/format"} <= set(record)
    assert "val/search_synthetic/reward/mean" in record

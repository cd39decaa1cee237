"""The langgraph_agent recipe's run script end to end on tiny-qwen3: data, one SFT warm-start
step on the solved conversations, then one GRPO step whose rollouts run the LangGraph
``math_expression`` loop in Ray workers against a vLLM CPU server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_run_script_trains_the_react_loop_from_an_sft_warm_start(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.langgraph_agent.data",
            "--out",
            str(data),
            "--train",
            "4",
            "--val",
            "2",
            "--sft",
            "16",
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
        "SFT_STEPS": "1",
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
        ["bash", "recipes/langgraph_agent/run_cpu.sh", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    export = run / "sft" / "global_step_1" / "actor" / "huggingface"
    assert f"SFT warm start: {export}" in proc.stdout
    assert (export / "config.json").is_file()
    records = [
        json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if "reward/rule/tool_use" in r]
    assert [r["step"] for r in train] == [1]
    assert train[0]["agent_loop/num_turns/mean"] >= 2
    # validation before RL (the SFT model) and after the step
    vals = [r for r in records if "val/langgraph_math/reward/mean" in r]
    assert [r["step"] for r in vals] == [0, 1]
    assert all(r["val/num_turns/mean"] >= 2 for r in vals)

"""The langgraph_agent recipe's run script end to end on tiny-qwen3: data, one SFT warm-start
step on the solved conversations, then one GRPO step whose rollouts run the LangGraph
``math_expression`` loop in Ray workers against a vLLM CPU server."""

from __future__ import annotations

import json

import pytest

from tests.e2e.run_script import make_data, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_script_trains_the_react_loop_from_an_sft_warm_start(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    make_data(
        "recipes.langgraph_agent.data",
        "--out",
        str(data),
        "--train",
        "4",
        "--val",
        "2",
        "--sft",
        "16",
    )
    proc = run_script("recipes/langgraph_agent/run_cpu.sh", data, run, SFT_STEPS="1")
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
    # verl's validation names beside ours: one greedy response per prompt (rollout.val_kwargs)
    for r in vals:
        core = r["val-core/langgraph_math/reward/mean@1"]
        assert core == pytest.approx(r["val/langgraph_math/reward/mean"])
        assert r["val-aux/num_turns/mean"] == pytest.approx(r["val/num_turns/mean"])

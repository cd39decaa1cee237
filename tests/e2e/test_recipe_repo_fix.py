"""The repo_fix recipe's run script end to end on tiny-qwen3: generated tasks, then one GRPO
step whose tool_agent samples each run in a fresh sandboxed workspace with the workspace tools,
rewarded by the package's pytest check. The SFT warm start is left out here (``SFT_STEPS=0``,
one whole command start less): the script's SFT call is checked in
tests/unit/recipes/test_run_scripts.py, its rows encode in tests/unit/recipes/test_repo_fix.py,
and a run script's SFT export feeding GRPO runs for real in test_recipe_langgraph.py."""

from __future__ import annotations

import json

import pytest

from tests.e2e.run_script import make_data, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_script_trains_a_step_rewarded_by_the_workspace_check(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    make_data("recipes.repo_fix.make_tasks", "--out", str(data), "--train", "16", "--val", "2")
    proc = run_script("recipes/repo_fix/run_cpu.sh", data, run, SFT_STEPS="0")
    assert "SFT warm start" not in proc.stdout and not (run / "sft").exists()
    records = [
        json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if "workspace/check_s/mean" in r and "reward/rule" in r]
    assert [r["step"] for r in train] == [1]
    # an untrained tiny model fixes nothing: each check ran (its time is in the metrics) and
    # failed, and scores 0 (all or nothing)
    assert train[0]["reward/rule"] == 0.0 and train[0]["reward/errors"] == 0
    assert train[0]["workspace/samples"] == 4
    vals = [r for r in records if "val/repo_fix/reward/mean" in r]
    assert [r["step"] for r in vals] == [0, 1]

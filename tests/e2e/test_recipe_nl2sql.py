"""The nl2sql recipe's run script for one GRPO step on tiny-qwen3: generated SQLite data,
tool_agent rows with the run_sql tool, the verify reward running gold and final SQL."""

from __future__ import annotations

import json

import pytest

from tests.e2e.run_script import make_data, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_script_trains_a_step_with_the_verify_reward(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    make_data("recipes.nl2sql.data", "--out", str(data), "--train", "4", "--val", "2")
    run_script("recipes/nl2sql/run_cpu.sh", data, run)
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1
    assert "reward/verify" in record and "reward/verify/executed" in record
    assert "reward/rule" not in record  # weight 0 turns the rule off
    assert "val/nl2sql/reward/mean" in record

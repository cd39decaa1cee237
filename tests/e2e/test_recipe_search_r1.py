"""The search_r1 recipe's run script for one GRPO step on tiny-qwen3: the generated world,
the BM25 index served by the recipe's MCP server over stdio inside the rollout workers, the
exact-match reward with format terms."""

from __future__ import annotations

import json

import pytest

from tests.e2e.run_script import make_data, run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_script_trains_a_step_with_the_mcp_search_tool(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    make_data(
        "recipes.search_r1.data", "--out", str(data), "--synthetic", "--train", "4", "--val", "2"
    )
    run_script("recipes/search_r1/run_cpu.sh", data, run)
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1
    assert {"reward/rule/em", "reward/rule/format"} <= set(record)
    assert "val/search_synthetic/reward/mean" in record
    # The MCP server's stderr went to its own log in the run folder, not to the console.
    logs = sorted((run / "logs").glob("mcp-*.log"))
    assert logs, "no MCP server log in the run folder"

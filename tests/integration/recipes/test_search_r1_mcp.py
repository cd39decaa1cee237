"""The search_r1 retriever as a real MCP server over stdio, loaded from the MCP config file
the data script writes, called the way the rollout calls tools."""

from __future__ import annotations

import json

import pytest

from agentloop.parsers import ToolCall
from agentloop.tools import ToolRunner, load_tool_config
from recipes.search_r1.data import main as data_main

pytestmark = pytest.mark.integration


async def test_search_tool_over_mcp_returns_the_evidence_passages(tmp_path):
    assert data_main(["--out", str(tmp_path), "--synthetic", "--train", "20", "--val", "4"]) == 0
    tools = load_tool_config(tmp_path / "mcp_search.json")
    assert list(tools) == ["retriever-search"]
    schema = tools["retriever-search"].tool_schema["function"]
    assert schema["parameters"]["required"] == ["query"]
    passages = [json.loads(x) for x in (tmp_path / "index/passages.jsonl").read_text().splitlines()]
    titles = [p["title"] for p in passages[:8]]
    runner = ToolRunner(tools, timeout_s=30)
    instance = await tools["retriever-search"].create("s0")
    outcomes = await runner.run(
        [ToolCall("retriever-search", {"query": t, "topk": 2}, "") for t in titles],
        {"retriever-search": instance},
    )
    for title, outcome in zip(titles, outcomes, strict=True):
        assert outcome.ok, outcome.text
        assert outcome.text.startswith(f"Doc 1 (Title: {title}) ")
        assert outcome.text.count("\nDoc ") == 1  # topk=2
    await tools["retriever-search"].release(instance)
    tools["retriever-search"].connection.close()  # the server process exits

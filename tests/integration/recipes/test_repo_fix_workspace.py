"""A generated repo_fix task in the real bubblewrap workspace pool: the workspace tools answer
exactly what the task's SFT trace says they answer (``read_file``, ``str_replace``,
``run_check``), the trace's fix scores 1, and a sample that changes nothing scores 0 (the
check is all or nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentloop.tools.sandbox import bwrap_problem
from agentloop.workspace import (
    Workspace,
    WorkspaceConfig,
    WorkspacePool,
    run_workspace_sample,
    tasks_of_rows,
)
from agentloop.workspace import tools as workspace_tools
from recipes.repo_fix.make_tasks import make_tasks

pytestmark = pytest.mark.integration

if (_problem := bwrap_problem()) is not None:
    pytest.skip(
        f"bwrap sandbox unavailable here: {_problem} (apt-get install bubblewrap)",
        allow_module_level=True,
    )


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_traced_tool_answers_are_the_real_ones_and_the_fix_scores_one(tmp_path):
    data = tmp_path / "data"
    make_tasks(data, train=1, val=0, seed=0)
    (row,) = _read(data / "train.jsonl")
    (sft,) = _read(data / "sft.jsonl")
    (task,) = tasks_of_rows([row], data)
    assert task is not None
    messages = sft["messages"]
    calls = [
        (i, m["tool_calls"][0]["function"]) for i, m in enumerate(messages) if "tool_calls" in m
    ]
    answers: list[str] = []

    async def traced_agent(ws: Workspace) -> None:
        for _, call in calls:
            tool = getattr(workspace_tools, call["name"])
            answers.append(await tool(**call["arguments"]))

    async def idle_agent(ws: Workspace) -> None:
        return None

    pool = WorkspacePool(WorkspaceConfig(root=str(tmp_path / "ws"), sandbox="bwrap"))
    try:
        _, fixed = await run_workspace_sample(pool, task, traced_agent, agent_timeout_s=300)
        _, idle = await run_workspace_sample(pool, task, idle_agent, agent_timeout_s=300)
    finally:
        await pool.close()
    (read, replace, check) = answers
    assert read == messages[calls[0][0] + 1]["content"]
    assert replace == messages[calls[1][0] + 1]["content"]
    head = messages[calls[2][0] + 1]["content"].splitlines()[0]
    assert check.splitlines()[0] == head
    for node in row["extra_info"]["repo_fix"]["failing_tests"]:
        assert f"PASSED {node}" in check
    assert fixed.score == 1.0 and fixed.agent_error is None
    assert idle.score == 0.0 and idle.agent_error is None

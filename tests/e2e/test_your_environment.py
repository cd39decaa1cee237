"""docs/your-environment.md, run as written: its files are written into an empty folder and
its commands are run there, in order, with the venv's bin first on PATH (as the page's
``source .venv/bin/activate`` makes it), so the page cannot drift from what works.

The page marks what is run by the info string of its fenced blocks:

- ```` ```python file=units_env/server.py ````: a file, written at that path;
- ```` ```bash run ````: a command, run with bash in the folder;
- ```` ```text output ```` right after a command: lines its stdout must contain;
- ```` ```json first-row=units_env/train.jsonl ````: the first row that file must hold;
- ```` ```json example=units_env/mcp.json ````: a file the commands write, with these keys.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainer.launch.console import MOVED_LOG, ConsoleRoute

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "your-environment.md"
FENCE = re.compile(r"^```(\S*)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
ROLLOUT_HEADER = "| samples | accuracy (reward >= 1) | valid tool-call rate | reward mean |"
TRACES_HEADER = re.compile(r"^trace_id\s+sample\s+rollout_n\s+validate\s+agent_name\s+reward", re.M)
# A warning line on the console: Python logging's and vLLM's level, Python warnings, C++ ones.
WARNING_LINE = re.compile(r"\bWARNING\b|Warning\b|\[W\d{4} ")
ACTIONABLE = (
    # tiny-qwen3 is random: it writes no tool call; the warning says what to check
    "WARNING agentloop.train: step 1: no sample attempted a tool call although tools are",
)
"""Warnings a user can act on, allowed on the console of the page's run."""


@dataclass(frozen=True, slots=True)
class Block:
    lang: str
    attrs: dict[str, str]
    """``key=value`` words of the info string; a bare word maps to ``""``."""
    body: str


def page_blocks(text: str) -> list[Block]:
    """Every fenced block of the page, in order."""
    blocks = []
    for lang, info, body in FENCE.findall(text):
        attrs = dict(w.split("=", 1) if "=" in w else (w, "") for w in info.split())
        blocks.append(Block(lang, attrs, body))
    return blocks


def same_keys(example: Any, actual: Any, where: str) -> None:
    """``actual`` has the nesting and keys of ``example`` (values may differ)."""
    if isinstance(example, dict):
        assert isinstance(actual, dict) and set(actual) == set(example), where
        for key, value in example.items():
            same_keys(value, actual[key], f"{where}.{key}")


def test_page_builds_a_tool_environment_that_trains_rolls_out_and_traces(tmp_path):
    blocks = page_blocks(PAGE.read_text())
    files = [b for b in blocks if "file" in b.attrs]
    assert {b.attrs["file"] for b in files} == {
        "units_env/server.py",
        "units_env/make_data.py",
        "units_env/reward.py",
        "units_env/run.sh",
    }
    for block in files:
        path = tmp_path / block.attrs["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.body)

    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGENTLOOP_RUN_DIR")}
    env |= {"PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    stdout, console = "", ""
    for i, block in enumerate(blocks):
        if block.lang != "bash" or "run" not in block.attrs:
            continue
        proc = subprocess.run(
            ["bash", "-c", block.body],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, f"{block.body}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
        stdout += proc.stdout
        console += proc.stdout + proc.stderr
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        if after is not None and "output" in after.attrs:
            for line in filter(None, after.body.splitlines()):
                assert line in proc.stdout, f"{line!r} not printed by:\n{block.body}"

    # The row and the MCP config the page shows are the ones the data script writes.
    (row_block,) = [b for b in blocks if "first-row" in b.attrs]
    first_line = (tmp_path / row_block.attrs["first-row"]).read_text().splitlines()[0]
    assert json.loads(first_line) == json.loads(row_block.body)
    (mcp_block,) = [b for b in blocks if "example" in b.attrs]
    mcp = json.loads((tmp_path / mcp_block.attrs["example"]).read_text())
    same_keys(json.loads(mcp_block.body), mcp, "mcp.json")
    assert mcp["mcpServers"]["units"]["command"] == str(venv_bin / "python")
    assert mcp["mcpServers"]["units"]["args"] == [str(tmp_path / "units_env" / "server.py")]

    # agentloop-train: one step with the reward's keys and the agent-loop tool metrics.
    run = tmp_path / "checkpoints" / "units"
    assert "done: 1 steps" in stdout
    (record,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1
    assert {"reward/rule", "reward/rule/used_tool", "agent_loop/tool_calls/mean"} <= set(record)
    # The MCP server ran under the trainer, its stderr in the run folder's logs.
    assert sorted((run / "logs").glob("mcp-units-*.log")), "no MCP server log in the run folder"

    # The console holds no warning but actionable ones; the known-benign ones of the training
    # run and of the rollout (vLLM's CPU notices, Ray's token notice) are in the run's logs/.
    warnings = [x for x in console.splitlines() if WARNING_LINE.search(x)]
    assert all(any(a in x for a in ACTIONABLE) for x in warnings), "\n".join(warnings)
    assert "force killing" not in console  # the engines exited at the end of each run
    moved = (run / "logs" / MOVED_LOG).read_text().splitlines()
    assert any("Model Runner V2 requires Triton" in x for x in moved), moved
    if "RAY_AUTH_MODE" not in env:  # Ray's notice on the driver's own logger
        assert any("[driver] WARNING" in x and "Token authentication" in x for x in moved), moved
    route = ConsoleRoute(run / "logs" / "unused.log")
    assert all(route.matches(x) or x.split("] ", 1)[1][:1] == " " for x in moved), moved

    # agentloop-rollout: the table, and the tool offered in every prompt.
    assert ROLLOUT_HEADER in stdout
    lines = (run / "val_trajectories.jsonl").read_text().splitlines()
    trajectories = [json.loads(x) for x in lines]
    assert len(trajectories) == 4
    assert all('"name": "units-convert"' in t["prompt_text"] for t in trajectories)
    assert all(t["agent_name"] == "tool_agent" and "rule" in t["scores"] for t in trajectories)

    # agentloop-traces --step 1: step 1's traced samples as a table.
    assert TRACES_HEADER.search(stdout)
    # What the page promises is what was checked, and the README's quick starts link it.
    assert ROLLOUT_HEADER in PAGE.read_text() and TRACES_HEADER.search(PAGE.read_text())
    assert "(docs/your-environment.md)" in (REPO / "README.md").read_text()

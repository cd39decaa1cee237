"""``tool_agent`` on workspace-task rows, through the real ``AgentLoopWorker``: the tools from a
real tool YAML (``type: workspace``), the real bubblewrap sandbox and a real pytest check as
the reward. tiny-qwen3 makes no useful tool calls, so the model's turns are scripted
(``ScriptedServer``, the real tokenizer and chat template); everything after the model's text
is the real path: parsing, the tools in the sample's own workspace copy, the check's score as
``reward_score``, the step's ``workspace/*`` metrics, and no copy left after the sample."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from agentloop import AgentLoopWorker, MultiTurnConfig, RolloutConfig
from agentloop.batch import rollout_metrics
from agentloop.tools.sandbox import bwrap_problem
from tests.unit.agentloop.scripted import ScriptedServer

pytestmark = pytest.mark.slow  # real sandboxes and pytest runs: seconds each

if (_problem := bwrap_problem()) is not None:
    pytest.skip(
        f"bwrap sandbox unavailable here: {_problem} (apt-get install bubblewrap)",
        allow_module_level=True,
    )

CHECK = "python -m pytest -q -rA -p no:cacheprovider -p no:asyncio tests/"
TESTS = textwrap.dedent(
    """\
    from calc import add


    def test_add():
        assert add(1, 2) == 3


    def test_zero():
        assert add(0, 0) == 0
    """
)


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_texts(tokenizer, out) -> list[str]:
    """The tool messages of the sample (the <tool_response> blocks of its mask-0 tokens)."""
    ids = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return [p.split("\n</tool_response>")[0] for p in text.split("<tool_response>\n")[1:]]


@pytest.fixture()
def setup(tmp_path, tokenizer):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    root = tmp_path / "workspaces"
    entry = {"type": "workspace", "workspace": {"root": str(root), "sandbox": "bwrap"}}
    tools_yaml = tmp_path / "tools.yaml"
    tools_yaml.write_text(yaml.safe_dump({"tools": [{"class_name": "workspace", "config": entry}]}))
    config = RolloutConfig(
        prompt_length=4096,
        response_length=4096,
        multi_turn=MultiTurnConfig(tool_config_path=str(tools_yaml), max_tool_response_length=4000),
    )

    server = ScriptedServer(tokenizer, [])
    worker = AgentLoopWorker(config, server, tokenizer)
    row = {
        "agent_name": "tool_agent",
        "raw_prompt": [{"role": "user", "content": "Fix add() in calc.py."}],
        "extra_info": {"workspace_task": {"workspace": str(repo), "check": CHECK}},
    }
    return worker, server, tokenizer, row, root


async def test_tool_agent_fixes_the_task_in_its_workspace_and_the_check_scores_it(setup):
    worker, server, tokenizer, row, root = setup
    server.turns = [
        call("read_file", path="calc.py"),
        call("str_replace", path="calc.py", old="a - b", new="a + b"),
        call("write_file", path="notes/todo.txt", content="hi\n"),
        call("bash", command="echo more >> notes/todo.txt && cat notes/todo.txt"),
        call("read_file", path="../../../etc/passwd"),
        call("run_check"),
        "Fixed.",
    ]
    [out] = await worker.generate_sequences([row], {"temperature": 0.0})
    texts = tool_texts(tokenizer, out)
    assert texts[:5] == [
        "     1\tdef add(a, b):\n     2\t    return a - b",
        "replaced 1 occurrence in calc.py",
        "created notes/todo.txt (3 characters)",
        "[exit code 0]\nhi\nmore\n",  # the sandbox's user may change what write_file created
        "Error: '../../../etc/passwd' is outside the workspace; give a path inside it "
        "(relative to the workspace folder)",
    ]
    assert texts[5].startswith("check passed: score 1 (2 passed, 0 failed)\n")
    assert out.record.stop_reason == "no_tool_call" and out.record.tool_calls == 6
    assert out.reward_score == 1.0
    reward = out.extra["workspace"]
    assert (reward["score"], reward["passed"], reward["failed"]) == (1.0, 2, 0)
    assert reward["agent_error"] is None and reward["timed_out"] is False
    assert out.metrics["workspace/check_s"] > 0 and out.metrics["workspace/sandbox_errors"] == 0
    metrics = rollout_metrics([out], wall_s=1.0)
    assert metrics["workspace/samples"] == 1.0 and metrics["workspace/check_timeouts"] == 0.0
    # its copy is gone (the others are the warm pool's); the next sample gets a fresh one, taken
    # warm, and the unchanged task scores 0
    [run] = root.iterdir()
    assert not any(p.name.startswith("ws-1-") for p in run.iterdir())
    server.turns = [call("bash", command="cat calc.py"), "I give up."]
    [again] = await worker.generate_sequences([row], {"temperature": 0.0})
    assert tool_texts(tokenizer, again) == ["[exit code 0]\ndef add(a, b):\n    return a - b\n"]
    assert again.reward_score == 0.0  # test_zero passes with a - b, test_add does not
    assert (again.extra["workspace"]["passed"], again.extra["workspace"]["failed"]) == (1, 1)
    assert again.extra["workspace"]["warm"] is True and out.extra["workspace"]["warm"] is False
    await worker.close_workspaces()
    assert not root.exists()


async def test_a_compacted_workspace_sample_gives_every_segment_the_checks_reward(setup):
    """Long bash outputs past ``multi_turn.max_context_tokens``: the sample compacts, goes on
    fixing the task in the same workspace copy, and every segment carries the check's score."""
    worker, server, tokenizer, row, _ = setup
    worker.config.multi_turn.max_context_tokens = 1400
    worker.config.multi_turn.max_tokens_per_turn = 64
    server.turns = [
        call("bash", command="seq 1000 1100"),
        call("bash", command="seq 2000 2100"),
        call("str_replace", path="calc.py", old="a - b", new="a + b"),
        "Fixed.",
    ]
    try:
        [out] = await worker.generate_sequences([row], None)
    finally:
        await worker.close_workspaces()
    samples = [out, *out.segments]
    assert len(samples) == 2 and out.metrics["compactions"] == 1.0
    assert [o.reward_score for o in samples] == [1.0] * len(samples)
    assert [o.record.weight for o in samples] == pytest.approx([1 / len(samples)] * len(samples))
    assert samples[-1].record.stop_reason == "no_tool_call"
    assert all(o.record.branch_reason.startswith("compaction: ") for o in samples[1:])
    assert all(len(o.prompt_ids) + len(o.response_ids) <= 1400 for o in samples)

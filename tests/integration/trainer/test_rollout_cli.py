"""`agentloop-rollout`: bad input fails at start-up with a message naming what to change (no
server started), and a real run (vLLM CPU, Ray workers) writes one JSON line per trajectory
with ids, mask, log-probs and decoded text that agree, each scored with the configured reward
(rows nothing scores written unscored, said once), and ends with the accuracy /
valid-tool-call table. The same run scores Claude Code and Codex, unmodified, on held-out
repo_fix tasks (each sample in its sandboxed workspace, the package's check its reward): their
first prompts (~12k and ~8.5k tokens) pass tiny-qwen3's 8,192-token window, so the model is
``tiny-qwen3-long`` (the same weights, Qwen3's 40,960), made to end its turns
(tests/turn_ending_model.py; Claude Code retries a reply cut at its token limit, then fails)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from agentloop.gateway.harness import HarnessNotInstalled, HarnessSpec, resolve_binary
from recipes.repo_fix.make_tasks import make_tasks
from tests.integration.agentloop.helpers import ECHO_SCHEMA, max_line_logprob_gap
from tests.turn_ending_model import ending_anywhere_copy
from trainer.cli.rollout import main
from trainer.models import prepare

REPO = Path(__file__).resolve().parents[3]
USER = [{"role": "user", "content": "Add 2 and 3."}]
CLIS = {"claude_code": "claude-code", "codex": "codex"}  # recipes/repo_fix/harness_loops.yaml
OLD_WINDOW = 8192  # tiny-qwen3's
HARNESS_LOOPS = "recipes/repo_fix/harness_loops.yaml"
# tiny-qwen3 in the asset cache before a test reads stderr: on a fresh machine the first use
# builds it, with progress lines on stderr
pytestmark = pytest.mark.usefixtures("tiny_qwen3_path")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def tool_yaml(tmp_path) -> Path:
    path = tmp_path / "tools.yaml"
    spec = {
        "class_name": "tests.integration.agentloop.helpers.EchoTool",
        "config": {"type": "native"},
        "tool_schema": ECHO_SCHEMA,
    }
    path.write_text(yaml.safe_dump({"tools": [spec]}))
    return path


def run_main(capsys, *overrides: str) -> tuple[int, str]:
    code = main(["actor_rollout_ref.model.path=tiny-qwen3", *overrides])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (
            [{"question": "no prompt column"}],
            [],
            "row 0 has neither 'raw_prompt' nor 'prompt' (chat messages); set data.prompt_key "
            "to the column holding them",
        ),
        (
            [{"prompt": USER, "agent_name": "nope"}],
            [],
            "agent_name 'nope' is not a registered agent loop; registered: react_agent, "
            "single_turn_agent, tool_agent, verifiers (add yours to "
            "actor_rollout_ref.rollout.agent.agent_loop_config_path)",
        ),
        (
            [
                {
                    "prompt": USER,
                    "agent_name": "tool_agent",
                    "extra_info": {"tools_kwargs": {"web": {}}},
                }
            ],
            ["TOOLS"],
            "row 0: tools_kwargs names tool 'web', which is not configured; configured tools: "
            "echo (actor_rollout_ref.rollout.multi_turn.tool_config_path)",
        ),
        (
            [{"prompt": USER}],
            ["actor_rollout_ref.rollout.mode=sync"],
            "actor_rollout_ref.rollout.mode='sync' is not supported: agent loops run against "
            "servers; set actor_rollout_ref.rollout.mode=async",
        ),
        (
            [{"prompt": USER}],
            ["data.return_raw_chat=false"],
            "row 0 has no 'raw_prompt' and data.return_raw_chat is False; agent loops need the "
            "chat messages: set data.return_raw_chat=True",
        ),
        (
            [{"prompt": USER}],
            ["actor_rollout_ref.rollout.agent.bogus=1"],
            "unknown config key actor_rollout_ref.rollout.agent.bogus: check its spelling against "
            "trainer/config/ppo_trainer.yaml and, for verl's keys, docs/verl-migration.md (extras "
            "for a command take a +, e.g. +output=out.jsonl)",
        ),
        (
            [{"prompt": USER}],
            ["custom_reward_function.path=no_such_reward.py"],
            "custom_reward_function.path='no_such_reward.py': there is no file "
            f"{str(Path('no_such_reward.py').absolute())!r}; point it at an existing .py file (a "
            "relative path starts at the working directory)",
        ),
        (
            [{"prompt": USER}],
            ["+correct_at=high"],
            "+correct_at must be a number, got 'high'",
        ),
    ],
    ids=[
        "no_prompt",
        "unknown_agent",
        "unconfigured_tool",
        "sync_mode",
        "raw_chat_off",
        "bad_key",
        "missing_reward_file",
        "bad_correct_at",
    ],
)
def test_bad_input_fails_at_start_up_with_what_to_change(
    tmp_path, capsys, tool_yaml, rows, extra, message
):
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    extra = [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_yaml}" if e == "TOOLS" else e
        for e in extra
    ]
    code, err = run_main(capsys, f"data.train_files={data}", f"+output={tmp_path}/o.jsonl", *extra)
    assert code == 2
    assert err.startswith("agentloop-rollout: error: ")
    assert err.endswith(message)


def test_agent_loop_target_that_does_not_import_fails_at_start_up(tmp_path, capsys):
    loops = tmp_path / "loops.yaml"
    loops.write_text(yaml.safe_dump([{"name": "mine", "_target_": "no_such_pkg.loops.Mine"}]))
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": USER}])
    code, err = run_main(
        capsys,
        f"data.train_files={data}",
        f"+output={tmp_path}/o.jsonl",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
    )
    assert code == 2
    assert err == (
        f"agentloop-rollout: error: {loops}: agent loop 'mine': _target_="
        "'no_such_pkg.loops.Mine': cannot import module 'no_such_pkg.loops' "
        "(ModuleNotFoundError: No module named 'no_such_pkg'); install the package that provides "
        "'no_such_pkg', put its folder on PYTHONPATH, or correct the name"
    )


def test_missing_output_and_missing_data_file_are_start_up_errors(tmp_path, capsys):
    code, err = run_main(capsys, "data.train_files=x.jsonl")
    assert (code, err) == (
        2,
        "agentloop-rollout: error: set +output=PATH for the trajectories JSONL",
    )
    code, err = run_main(capsys, f"data.train_files={tmp_path}/none.jsonl", "+output=o.jsonl")
    assert (code, err) == (
        2,
        f"agentloop-rollout: error: data file '{tmp_path}/none.jsonl' does not exist",
    )


@pytest.mark.integration
def test_rollout_writes_consistent_trajectories(tmp_path, tool_yaml, tiny_qwen3_path):
    for name in CLIS.values():
        try:
            resolve_binary(HarnessSpec.of(name))
        except HarnessNotInstalled as e:
            pytest.skip(f"the harness CLIs are not installed (make harnesses needs npm): {e}")
    model = ending_anywhere_copy(prepare("tiny-qwen3-long"), tmp_path / "model", end_prob=0.4)
    make_tasks(tmp_path / "tasks", train=0, val=2, seed=0)
    tasks = [json.loads(line) for line in (tmp_path / "tasks" / "val.jsonl").open()]
    for task, agent in zip(tasks, CLIS, strict=True):
        task["agent_name"] = agent
        spec = task["extra_info"]["workspace_task"]
        spec["workspace"] = str(tmp_path / "tasks" / spec["workspace"])
    rows = [
        {"prompt": USER, "data_source": "toy", "extra_info": {"index": 7}},
        {"prompt": "Say hi.", "data_source": "openai/gsm8k", "reward_model": {"ground_truth": "5"}},
        {
            "prompt": USER,
            "agent_name": "tool_agent",
            "extra_info": {"tools_kwargs": {"echo": {"create_kwargs": {"prefix": "p"}}}},
        },
        *tasks,
    ]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "traj.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # No reward file: the gsm8k row is scored by the built-in scorer, the 'toy' row and the
    # row without a data_source have no scorer and are written unscored, said once.
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "agentloop-rollout"),
            f"data.train_files={data}",
            f"actor_rollout_ref.model.path={model}",
            "data.max_prompt_length=16384",
            "actor_rollout_ref.rollout.response_length=24",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.agent.num_workers=2",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_yaml}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={REPO}/{HARNESS_LOOPS}",
            f"+output={out}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "written unscored" in line]
    assert len(said) == 1 and "data_source 'toy' (1 row), missing (1 row)" in said[0]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # a random tiny model does not write "#### 5": the built-in gsm8k scorer gives 0; nor
    # does it fix a package: each CLI sample's check scores 0
    assert [(r["score"], r["scores"]) for r in records] == [(None, {})] * 2 + [
        (0.0, {"rule": 0.0})
    ] * 2 + [(None, {})] * 2 + [(0.0, {"rule": 0.0})] * (len(records) - 6)
    n = len(records)  # 6 + each CLI sample's segments (below)
    valid = sum(r["tool_calls"] >= 1 and r["tool_errors"] == 0 for r in records) / n
    # The command's own lines: Ray forwards worker logs (e.g. vLLM's shutdown warnings) to
    # the same stdout, prefixed "(ActorName pid=N)", whenever they arrive.
    own = [
        line
        for line in result.stdout.splitlines()
        if not re.match(r"^(\x1b\[[0-9;]*m)?\(\w+ pid=\d+\)", line)
    ]
    assert own[-4:] == [
        f"wrote {n} trajectories to {out}",
        "| samples | accuracy (reward >= 1) | valid tool-call rate | reward mean | unscored |",
        "|---------|------------------------|----------------------|-------------|----------|",
        f"| {n:7d} |                   0.0% | {valid:20.1%} |      0.0000 |        4 |",
    ]
    tok = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    agents = [r["agent_name"] for r in records]
    assert agents[:6] == ["single_turn_agent"] * 4 + ["tool_agent"] * 2
    assert sorted(set(agents[6:])) == sorted(CLIS)
    assert [r["index"] for r in records[:4]] == [7, 7, 1, 1]
    assert [r["rollout_n"] for r in records[:6]] == [0, 1] * 3
    assert records[0]["uid"] == records[1]["uid"] != records[2]["uid"]
    for r in records:
        n = len(r["response_ids"])
        assert 1 <= n <= 24
        assert len(r["response_mask"]) == len(r["response_log_probs"]) == n
        assert r["response_text"] == tok.decode(r["response_ids"], skip_special_tokens=False)
        assert r["prompt_text"] == tok.decode(r["prompt_ids"], skip_special_tokens=False)
        assert r["prompt_text"].endswith("<|im_start|>assistant\n")
        assert r["num_turns"] >= 2 and r["stop_reason"]
    tool_prompt = records[5]["prompt_text"]
    assert '"name": "echo"' in tool_prompt and "<tools>" in tool_prompt
    sessions: dict[str, list[dict]] = {}
    for r in records[6:]:
        sessions.setdefault(r["session_id"], []).append(r)
    assert sorted(s[0]["agent_name"] for s in sessions.values()) == sorted([*CLIS] * 2)
    for segments in sessions.values():
        # the CLI exited 0 and its check scored the sample; each turn ended with its own
        # sampled <|im_end|>, so a next call could extend its segment, except that Claude
        # Code answers a reply with no text by calling again with a history that differs at
        # that reply: a new segment (Codex takes an empty reply as final)
        assert [r["segment"] for r in segments] == list(range(len(segments)))
        assert segments[0]["branch_reason"] is None
        for before, r in zip(segments, segments[1:], strict=False):
            assert r["agent_name"] == "claude_code"
            assert r["branch_reason"] == "the history differs from segment 0's at message 1"
            assert tok.decode(before["response_ids"], skip_special_tokens=True).strip() == ""
        for r in segments:
            assert r["error"] is None and r["stop_reason"] == "stop", r["error"]
            assert r["weight"] == 1 / len(segments)  # a session weighs one sample
            assert len(r["prompt_ids"]) > OLD_WINDOW
            assert r["response_ids"][-1] == tok.convert_tokens_to_ids("<|im_end|>")
        logs = out.parent / "gateway" / segments[0]["session_id"]  # under the output's folder
        assert (logs / "transcript.txt").is_file()
        session_log = ("home/.claude/projects/*/*.jsonl" if r["agent_name"] == "claude_code"
                       else "home/codex/sessions/*/*/*/rollout-*.jsonl")  # fmt: skip
        assert list(logs.glob(session_log)), sorted(logs.rglob("*"))
    # every sampled token's engine log-prob is transformers' over the same ids
    assert max_line_logprob_gap(records, model) < 1e-3

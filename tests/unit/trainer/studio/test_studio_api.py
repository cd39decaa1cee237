"""The studio's pages and JSON API on the real app (FastAPI's test client, real tool loaders,
real reward files): tools listed with their schema and source and called as the model would
see them, a crashing tool's error text, bad configs and missing files with the CLI's text, a
reward file scored and one with a wrong signature refused, and the token off loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainer.cli.studio import parse_args
from trainer.studio import create_app

REPO = Path(__file__).resolve().parents[4]
CALCULATOR = REPO / "recipes" / "calculator" / "tool_config.yaml"


@pytest.fixture
def client():
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def functions(tmp_path) -> Path:
    path = tmp_path / "my_tools.py"
    path.write_text(
        "from agentloop.tools import function_tool\n\n"
        "@function_tool\n"
        "def add(a: int, b: int) -> int:\n"
        '    """Add two integers."""\n'
        "    return a + b\n\n"
        "@function_tool\n"
        "def boom(text: str) -> str:\n"
        '    """Always fails."""\n'
        "    raise RuntimeError('kaput: ' + text)\n"
    )
    return path


def test_a_tool_yaml_lists_each_tool_and_a_call_shows_what_the_model_reads(client):
    loaded = client.post("/api/tools/load", json={"path": str(CALCULATOR)}).json()
    (tool,) = loaded["tools"]
    assert tool["name"] == "calculator"
    assert tool["source"] == "tool_config.yaml: agentloop.tools.calculator.CalculatorTool"
    assert "expression" in tool["parameters"]["properties"]
    call = client.post(
        "/api/tools/call", json={"name": "calculator", "arguments": {"expression": "6 * 7"}}
    ).json()
    assert (call["text"], call["ok"], call["error_kind"]) == ("42", True, None)
    bad = client.post(
        "/api/tools/call", json={"name": "calculator", "arguments": {"expression": "6 *"}}
    ).json()
    assert bad["ok"] is False and bad["text"].startswith("Error: ")
    assert client.get("/api/tools").json()["tools"] == loaded["tools"]


def test_a_module_of_functions_is_a_tool_source_and_a_crash_is_an_error_message(client, functions):
    tools = client.post("/api/tools/load", json={"path": str(functions)}).json()["tools"]
    assert [(t["name"], t["source"]) for t in tools] == [
        ("add", "my_tools.py: function add"),
        ("boom", "my_tools.py: function boom"),
    ]
    assert tools[0]["parameters"]["required"] == ["a", "b"]
    crashed = client.post("/api/tools/call", json={"name": "boom", "arguments": {"text": "x"}})
    assert crashed.json()["text"] == "Error: tool 'boom' failed: RuntimeError: kaput: x"
    assert crashed.json()["error_kind"] == "tool_failed"
    unknown = client.post("/api/tools/call", json={"name": "nope", "arguments": {}})
    assert unknown.status_code == 400
    assert unknown.json() == {"error": "no tool named 'nope'; loaded: add, boom"}


def test_bad_tool_configs_give_the_clis_error_and_keep_what_was_loaded(client, tmp_path):
    client.post("/api/tools/load", json={"path": str(CALCULATOR)})
    missing = client.post("/api/tools/load", json={"path": "/nowhere/tools.yaml"})
    assert missing.status_code == 400
    assert missing.json() == {
        "error": "multi_turn.tool_config_path '/nowhere/tools.yaml' does not exist"
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("tool: []\n")
    refused = client.post("/api/tools/load", json={"path": str(bad)}).json()
    assert refused == {"error": f"{bad}: expected a top-level 'tools:' list"}
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    assert client.post("/api/tools/load", json={"path": str(empty)}).json() == {
        "error": f"tool module {str(empty)!r} defines no tool: decorate functions with "
        "@agentloop.tools.function_tool"
    }
    gone = client.post("/api/tools/load", json={"path": "/nowhere/tools.py"}).json()
    assert gone == {
        "error": "tool module='/nowhere/tools.py': there is no file '/nowhere/tools.py'; point "
        "it at an existing .py file (a relative path starts at the working directory)"
    }
    assert [t["name"] for t in client.get("/api/tools").json()["tools"]] == ["calculator"]


def test_the_tools_page_loads_a_config_and_calls_a_tool_from_its_form(client, functions):
    page = client.post("/tools/load", data={"path": str(functions)})
    assert page.status_code == 200 and 'id="tool-add"' in page.text
    assert 'id="arg-add-a"' in page.text and "my_tools.py: function add" in page.text
    called = client.post("/tools/call", data={"name": "add", "arg:a": "2", "arg:b": "3"})
    assert '<pre id="call-text">5</pre>' in called.text and 'class="ok"' in called.text
    typo = client.post("/tools/call", data={"name": "add", "arg:a": "two", "arg:b": "3"})
    assert typo.status_code == 400
    assert "argument &#39;a&#39; must be integer, got &#39;two&#39;" in typo.text


def test_a_reward_file_scores_an_answer_against_a_row(client, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': float(solution_str.strip() == ground_truth), 'source': data_source}\n"
    )
    assert client.post("/api/reward/load", json={"path": str(reward)}).status_code == 200
    row = {"data_source": "calc", "reward_model": {"ground_truth": "42"}}
    scored = client.post("/api/reward/score", json={"row": row, "answer": " 42 "}).json()
    assert scored == {"result": {"score": 1.0, "source": "calc"}, "score": 1.0, "error": None}
    page = client.post("/reward/score", data={"row": json.dumps(row), "answer": "41"})
    assert 'id="reward-score">score: 0.0</p>' in page.text


def test_reward_files_with_a_wrong_signature_or_a_crash_say_so(client, tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def compute_score(answer):\n    return 1.0\n")
    refused = client.post("/api/reward/load", json={"path": str(wrong)})
    assert refused.status_code == 400
    assert refused.json()["error"] == (
        f"{wrong}:compute_score cannot take the keywords data_source, solution_str, "
        "ground_truth, extra_info: reward functions are called by keyword, as verl calls "
        "them; define it as def compute_score(data_source, solution_str, ground_truth, "
        "extra_info, **kwargs) -> float | dict"
    )
    missing = client.post("/api/reward/load", json={"path": "/nowhere/r.py"}).json()
    assert missing == {
        "error": "custom_reward_function.path='/nowhere/r.py': there is no file '/nowhere/r.py'; "
        "point it at an existing .py file (a relative path starts at the working directory)"
    }
    crash = tmp_path / "crash.py"
    crash.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return 1 / 0\n"
    )
    client.post("/api/reward/load", json={"path": str(crash)})
    scored = client.post("/api/reward/score", json={"row": {}, "answer": "x"}).json()
    assert scored == {"result": None, "score": None, "error": "ZeroDivisionError: division by zero"}


def test_off_loopback_the_studio_needs_its_token():
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--host", "0.0.0.0"])
    assert exit_.value.code == 2
    assert parse_args(["--host", "0.0.0.0", "--token", "s3"]).token == "s3"
    with TestClient(create_app(token="s3")) as c:
        assert c.get("/api/tools").status_code == 401
        assert 'id="token"' in c.get("/tools").text  # the page asks for it
        ok = c.get("/api/tools", headers={"Authorization": "Bearer s3"})
        assert ok.status_code == 200
        c.post("/login", data={"token": "s3"})  # sets the cookie
        assert c.get("/tools").status_code == 200


def test_the_training_form_is_checked_by_the_clis_config_code_and_written_as_its_file(
    client, tmp_path
):
    settings = {
        "actor_rollout_ref.model.path": "tiny-qwen3",
        "data.train_files": "/data/train.jsonl",
        "actor_rollout_ref.rollout.n": "4",
        "data.train_batch_size": "8",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
        "algorithm.adv_estimator": "rloo",
        "async_training.enable": "False",
        "data.val_files": "",
        "trainer.default_local_dir": str(tmp_path / "run"),
    }
    checked = client.post("/api/train/check", json=settings).json()
    file = Path(checked["config_file"])
    assert file == tmp_path / "run" / "studio_run.yaml"
    assert checked["command"] == [
        "agentloop-train",
        "--config-path",
        str(tmp_path / "run"),
        "--config-name",
        "studio_run",
    ]
    from trainer.config import load_config

    config, _ = load_config(checked["command"][1:])  # the file is one the CLI reads
    assert (config.actor_rollout_ref.rollout.n, config.algorithm.adv_estimator) == (4, "rloo")
    assert config.data.val_files is None and config.trainer.logger == ["console", "jsonl"]
    bad = client.post("/api/train/check", json={**settings, "actor_rollout_ref.rollout.n": "1"})
    assert bad.status_code == 400
    assert bad.json()["error"] == (
        "algorithm.adv_estimator=rloo with actor_rollout_ref.rollout.n=1: every group has one "
        "sample, so every advantage is 0; set actor_rollout_ref.rollout.n=2 or more (or "
        "algorithm.adv_estimator=reinforce_plus_plus)"
    )
    page = client.post("/train/check", data=settings)
    assert 'id="checked"' in page.text and "--config-name studio_run" in page.text
    typo = client.post("/api/train/check", json={**settings, "trainer.nnodes": "0"})
    assert typo.json() == {"error": "trainer.nnodes and trainer.n_gpus_per_node must be >= 1"}


def test_a_run_that_fails_its_start_up_shows_the_clis_line_in_the_log(client, tmp_path):
    """The child is the real ``agentloop-train``: a missing data file stops it at start-up,
    and the page's status has its exit code and its one-line error."""
    import time

    settings = {
        "actor_rollout_ref.model.path": "tiny-qwen3",
        "data.train_files": str(tmp_path / "missing.jsonl"),
        "actor_rollout_ref.rollout.n": "2",
        "trainer.default_local_dir": str(tmp_path / "run"),
    }
    started = client.post("/api/train/start", json=settings).json()
    assert started["command"].startswith("agentloop-train --config-path")
    deadline = time.monotonic() + 120
    while (status := client.get("/api/train").json())["running"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert status["returncode"] == 2 and status["steps"] == [] and status["checkpoints"] == []
    assert (
        f"agentloop-train: error: data file '{tmp_path / 'missing.jsonl'}' does not exist"
        in status["log"]
    )
    page = client.get("/train")
    assert "ended (exit 2)" in page.text and 'http-equiv="refresh"' not in page.text

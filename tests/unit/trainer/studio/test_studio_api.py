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
        "error": "custom_reward_function.path='/nowhere/r.py' does not exist: point it at a "
        ".py file"
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

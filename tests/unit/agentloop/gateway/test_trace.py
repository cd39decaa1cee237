"""A traced gateway session is one MLflow trace (real sqlite store) with a ``chat_call`` span
per call beside its ``generate`` and ``parse_tool_calls`` spans (a call that opened a new
segment with its ``branch_reason``), and an ``agent_error`` span holding the traceback when
the agent fails; the failing agent's batch keeps its other samples."""

from __future__ import annotations

import mlflow
import pytest
import yaml

from agentloop import RolloutConfig, TraceContext
from agentloop.config import AgentConfig, TraceConfig
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.gateway.helpers import hermes_call
from tests.unit.agentloop.scripted import ScriptedServer

PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture()
def store(tmp_path):
    previous = mlflow.get_tracking_uri()
    yield f"sqlite:///{tmp_path / 'mlruns.db'}"
    mlflow.set_tracking_uri(previous)


async def test_a_traced_session_has_a_span_per_call_and_the_agent_error(tokenizer, store, tmp_path):
    loops = [
        {"name": f"gw_{name}", "_target_": "agentloop.gateway.GatewayAgentLoop", "agent": target}
        for name, target in (
            ("weather", "tests.unit.agentloop.gateway.agents:weather_agent"),
            ("failing", "tests.unit.agentloop.gateway.agents:raising_agent"),
            ("summary", "tests.unit.agentloop.gateway.agents:summarizing_agent"),
        )
    ]
    (tmp_path / "loops.yaml").write_text(yaml.safe_dump(loops))
    trace = TraceConfig(backend="mlflow", tracking_uri=store, experiment_name="gw-traces")
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        trace=trace,
        agent=AgentConfig(agent_loop_config_path=str(tmp_path / "loops.yaml")),
    )
    turns = [
        hermes_call("weather", city="Paris"),
        "It is sunny.",
        hermes_call("weather", city="Paris"),
        "Sunny.",
    ]
    server = ScriptedServer(tokenizer, turns, end_token="<|im_end|>")
    worker = AgentLoopWorker(config, server, tokenizer, tools={})
    rows = [
        {"raw_prompt": PROMPT, "agent_name": "gw_weather", "data_source": "t"},
        {"raw_prompt": PROMPT, "agent_name": "gw_failing", "data_source": "t"},
    ]
    # one batch: the failing agent fails its own sample, the other's is whole
    ok, failed = await worker.generate_sequences(rows, None, TraceContext(step=1))
    worker.tracer.flush()
    assert ok.reward_score == 1.0 and ok.record.stop_reason == "stop"
    assert failed.reward_score == 0.0 and failed.record.stop_reason == "agent_error"

    spans = mlflow.get_trace(ok.record.trace_id).data.spans
    root = next(s for s in spans if s.parent_id is None)
    children = sorted(
        (s for s in spans if s.parent_id == root.span_id), key=lambda s: s.start_time_ns
    )
    calls = [s for s in children if s.name == "chat_call"]
    assert root.name == "gw_weather" and len(calls) == 2
    assert [s.name for s in children].count("generate") == 2
    first = calls[0]
    assert first.outputs["tool_calls"][0]["function"]["name"] == "weather"
    assert first.attributes["segment"] == "0" and first.attributes["finish_reason"] == "tool_calls"
    assert calls[1].outputs["content"] == "It is sunny."
    assert "branch_reason" not in calls[0].attributes | calls[1].attributes  # one segment

    # a call that opens a segment carries the reason (the summary replaced the history)
    server.turns = [hermes_call("weather", city="Paris"), "Sunny."]
    row = {"raw_prompt": PROMPT, "agent_name": "gw_summary", "data_source": "t"}
    (summary,) = await worker.generate_sequences([row], None, TraceContext(step=2))
    worker.tracer.flush()
    spans = mlflow.get_trace(summary.record.trace_id).data.spans
    calls = sorted((s for s in spans if s.name == "chat_call"), key=lambda s: s.start_time_ns)
    assert [c.attributes["segment"] for c in calls] == ["0", "1"]
    assert "branch_reason" not in calls[0].attributes
    assert calls[1].attributes["branch_reason"] == summary.segments[0].record.branch_reason
    assert summary.segments[0].record.branch_reason == "the system prompt changed"

    spans = mlflow.get_trace(failed.record.trace_id).data.spans
    (error,) = [s for s in spans if s.name == "agent_error"]
    assert error.status.status_code == "ERROR"
    assert "RuntimeError: the agent's own bug" in error.outputs["traceback"]

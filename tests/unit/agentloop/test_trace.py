"""Rollout traces: a traced multi-turn tool rollout (scripted turns, real tools) writes the
expected MLflow span tree to a real sqlite store, read back with the MLflow client; samples
beyond ``max_samples_per_step_per_worker`` are not traced; tracing off costs nothing and a
broken tracer never fails a rollout."""

from __future__ import annotations

import json

import mlflow
import pytest

from agentloop import MultiTurnConfig, RolloutConfig, TraceContext
from agentloop.config import AgentConfig, TraceConfig
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.scripted import BrokenTool, CalcTool, ScriptedServer

PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture()
def store(tmp_path):
    previous = mlflow.get_tracking_uri()
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    yield uri
    mlflow.set_tracking_uri(previous)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def worker_for(tokenizer, turns, trace: TraceConfig) -> AgentLoopWorker:
    config = RolloutConfig(
        prompt_length=1024,
        response_length=1024,
        multi_turn=MultiTurnConfig(max_parallel_calls=2),
        trace=trace,
        agent=AgentConfig(default_agent_loop="tool_agent"),
    )
    tools = {"calc": CalcTool(), "broken": BrokenTool()}
    return AgentLoopWorker(config, ScriptedServer(tokenizer, turns), tokenizer, tools=tools)


async def test_a_traced_rollout_writes_the_span_tree(tokenizer, store):
    turns = [
        f"Let me add.\n{call('calc', a=2, b=3)}\n{call('broken')}",
        call("nope", x=1),  # unknown tool: a parse error
        "The answer is 5.",
    ]
    trace = TraceConfig(
        backend="mlflow", token2text=True, tracking_uri=store, experiment_name="traces-test"
    )
    worker = worker_for(tokenizer, turns, trace)
    row = {"raw_prompt": PROMPT, "uid": "u7", "rollout_n": 1, "data_source": "arith"}
    (out,) = await worker.generate_sequences([row], None, TraceContext(step=3), offset=5)
    worker.tracer.flush()

    trace_id = out.record.trace_id
    got = mlflow.get_trace(trace_id)
    tags = got.info.tags
    assert {k: tags[k] for k in ("step", "sample_index", "rollout_n", "validate")} == {
        "step": "3",
        "sample_index": "5",
        "rollout_n": "1",
        "validate": "false",
    }
    assert tags["agent_name"] == "tool_agent" and tags["uid"] == "u7"
    spans = got.data.spans
    root = next(s for s in spans if s.parent_id is None)
    assert root.name == "tool_agent" and root.span_type == "AGENT"
    assert root.outputs["num_turns"] == out.num_turns and root.outputs["tool_calls"] == 1
    assert "The answer is 5." in root.outputs["response"]  # token2text
    children = sorted(
        (s for s in spans if s.parent_id == root.span_id), key=lambda s: s.start_time_ns
    )
    assert [s.name for s in children] == [
        "generate",
        "parse_tool_calls",
        "tool:calc",
        "tool:broken",
        "generate",
        "parse_tool_calls",
        "generate",
        "parse_tool_calls",  # the final answer, no calls in it
    ]
    gen = children[0]
    assert gen.span_type == "LLM" and gen.attributes["finish_reason"] == "stop"
    assert gen.outputs["response_tokens"] > 0 and "Let me add." in gen.outputs["text"]
    calc, broken = children[2], children[3]
    assert calc.span_type == "TOOL" and calc.inputs == {"arguments": {"a": 2, "b": 3}}
    assert calc.outputs["result"] == "5" and calc.status.status_code == "OK"
    assert broken.status.status_code == "ERROR"
    assert broken.attributes["error_kind"] == "tool_failed"
    assert "disk on fire" in broken.outputs["result"]
    bad_parse = children[5]
    assert bad_parse.status.status_code == "ERROR" and bad_parse.attributes["errors"] == "1"
    assert bad_parse.outputs["errors"][0]["kind"] == "unknown_tool"
    assert children[7].status.status_code == "OK" and children[7].outputs["calls"] == []


async def test_only_the_first_samples_of_a_worker_are_traced(tokenizer, store):
    trace = TraceConfig(
        backend="mlflow",
        tracking_uri=store,
        experiment_name="sampled",
        max_samples_per_step_per_worker=2,
    )
    worker = worker_for(tokenizer, [], trace)
    rows = [{"raw_prompt": PROMPT, "uid": f"u{i}"} for i in range(5)]
    outs = await worker.generate_sequences(rows, None, TraceContext(step=1, validate=True))
    worker.tracer.flush()
    assert [o.record.trace_id is not None for o in outs] == [True, True, False, False, False]
    found = mlflow.search_traces(
        locations=[worker.tracer.experiment_id],
        filter_string="tags.validate = 'true'",
        return_type="list",
    )
    assert sorted(t.info.tags["sample_index"] for t in found) == ["0", "1"]


async def test_tracing_off_makes_no_tracer_and_no_trace_ids(tokenizer):
    worker = worker_for(tokenizer, [], TraceConfig())
    assert worker.tracer is None
    (out,) = await worker.generate_sequences([{"raw_prompt": PROMPT}], None, TraceContext())
    assert out.record.trace_id is None


async def test_a_failing_trace_store_never_fails_the_rollout(tokenizer, store, monkeypatch):
    trace = TraceConfig(backend="mlflow", tracking_uri=store, experiment_name="broken")
    worker = worker_for(tokenizer, [call("calc", a=1, b=1), "2"], trace)

    def boom(*args, **kwargs):
        raise RuntimeError("store is down")

    monkeypatch.setattr(mlflow, "start_span_no_context", boom)
    (out,) = await worker.generate_sequences([{"raw_prompt": PROMPT}], None, TraceContext())
    assert out.record.tool_calls == 1 and out.record.trace_id is None

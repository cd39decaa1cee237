"""A real sqlite MLflow store with rollout traces written by the real tracer (the tests of
``agentloop-traces``)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from agentloop.base import AgentLoopOutput
from agentloop.config import TraceConfig
from agentloop.records import SampleRecord
from agentloop.trace import MlflowTracer, TraceContext

__all__ = ["write_traces"]


def write_traces(db: Path) -> list[str]:
    """Three traced samples of step 2 (written out of order, one validation sample, one
    scored) and one of step 1, by the real tracer into a real sqlite store."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    try:
        config = TraceConfig(backend="mlflow", tracking_uri=f"sqlite:///{db}", experiment_name="t")
        tracer = MlflowTracer(config, None)
        ids = []
        samples = [
            (2, 1, 1, False, 3),
            (2, 0, 0, False, 2),
            (2, 0, 0, True, 4),
            (1, 0, 0, False, 2),
        ]
        for step, index, rollout_n, validate, turns in samples:
            fields = {"raw_prompt": [{"role": "user", "content": "hi"}], "rollout_n": rollout_n}
            trace = tracer.start(TraceContext(step=step, validate=validate), index, fields, "a")
            assert trace is not None
            record = SampleRecord(stop_reason="no_tool_call", tool_calls=turns - 2)
            out = AgentLoopOutput([1], [2, 3], [1, 1], [0.0, 0.0], turns, record=record)
            trace_id = trace.finish(out)
            assert trace_id is not None
            ids.append(trace_id)
        tracer.flush()
        MlflowClient(tracking_uri=f"sqlite:///{db}").set_trace_tag(ids[1], "reward", "0.5")
    finally:
        mlflow.set_tracking_uri(previous)
    return ids

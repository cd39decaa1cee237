"""Rollout traces as MLflow spans (``actor_rollout_ref.rollout.trace.backend=mlflow``).

One trace per traced sample: a root ``AGENT`` span (tags ``step``, ``sample_index``,
``rollout_n``, ``validate``, ``agent_name``, ``uid``; linked to the training run), with child
spans per generate call (``LLM``: prompt/response tokens, finish reason, server, latency;
decoded text with ``trace.token2text``), per tool-call parse (``PARSER``: calls, errors),
per tool execution (``TOOL``: arguments, result preview, latency, error), per context
compaction (``MEMORY``: tokens before and after, outputs dropped). The trainer adds the
reward and its breakdown as trace tags once the batch is scored.

Spans are built in memory while the agent loop runs (timestamps taken around the awaited
calls, ~0.2 ms per span); the root spans of a batch are ended after the batch returns, in a
background thread, and MLflow's asynchronous trace logging writes them to the store while the
trainer scores and updates, so tracing never waits on the store nor competes with
generation; any tracing error is logged once and the rollout goes on. With ``backend: null`` no
tracer exists and the agent loops skip every tracing call.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["MlflowTracer", "SampleTrace", "TraceContext", "make_tracer"]

logger = logging.getLogger(__name__)

PREVIEW_CHARS = 500


@dataclass(slots=True)
class TraceContext:
    """Where a batch of samples belongs: the training step and whether it is validation."""

    step: int = 0
    validate: bool = False


def _preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class SampleTrace:
    """The spans of one sample; every method swallows (and logs once) tracing errors."""

    def __init__(self, tracer: MlflowTracer, root: Any) -> None:
        self.tracer = tracer
        self.root = root

    def _child(self, name: str, kind: str, start_ns: int, **fields: Any) -> Any:
        import mlflow

        return mlflow.start_span_no_context(
            name, span_type=kind, parent_span=self.root, start_time_ns=start_ns, **fields
        )

    def generate(
        self,
        start_ns: int,
        prompt_ids: list[int],
        out: Any,
        server: int | None,
    ) -> None:
        try:
            end_ns = time.time_ns()
            inputs: dict[str, Any] = {"prompt_tokens": len(prompt_ids)}
            outputs: dict[str, Any] = {
                "response_tokens": len(out.token_ids),
                "finish_reason": out.finish_reason,
            }
            if self.tracer.token2text:
                tok = self.tracer.tokenizer
                inputs["prompt_tail"] = _preview(tok.decode(prompt_ids[-200:]))
                outputs["text"] = tok.decode(out.token_ids)
            span = self._child(
                "generate",
                "LLM",
                start_ns,
                inputs=inputs,
                attributes={
                    "server": str(server),
                    "latency_s": f"{(end_ns - start_ns) / 1e9:.4f}",
                    "finish_reason": out.finish_reason,
                },
            )
            span.end(outputs=outputs, end_time_ns=end_ns)
        except Exception:  # noqa: BLE001 - tracing must never fail a rollout
            self.tracer.failed("generate span")

    def parse(self, start_ns: int, text: str, calls: list[Any], errors: list[Any]) -> None:
        try:
            span = self._child(
                "parse_tool_calls",
                "PARSER",
                start_ns,
                inputs={"text": _preview(text)},
                attributes={"calls": str(len(calls)), "errors": str(len(errors))},
            )
            span.end(
                outputs={
                    "calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
                    "errors": [{"kind": e.kind, "message": e.message} for e in errors],
                },
                status="ERROR" if errors else "OK",
            )
        except Exception:  # noqa: BLE001
            self.tracer.failed("parse span")

    def tool(self, start_ns: int, name: str, arguments: Any, outcome: Any) -> None:
        try:
            span = self._child(
                f"tool:{name}",
                "TOOL",
                start_ns,
                inputs={"arguments": arguments},
                attributes={
                    "latency_s": f"{outcome.seconds:.4f}",
                    "ok": str(outcome.ok),
                    "error_kind": outcome.error_kind or "",
                },
            )
            span.end(
                outputs={"result": _preview(outcome.text)},
                status="OK" if outcome.ok else "ERROR",
                end_time_ns=start_ns + int(outcome.seconds * 1e9),
            )
        except Exception:  # noqa: BLE001
            self.tracer.failed("tool span")

    def chat_call(
        self, start_ns: int, messages: list[Any], completion: Any, error: str | None = None
    ) -> None:
        """One gateway call: the messages the agent sent, the completion it got back (its
        tool calls, segment and token counts, and the branch reason of a call that opened a
        segment), or the error it was answered with."""
        try:
            attributes = {"messages": str(len(messages))}
            if completion is not None:
                attributes |= {
                    "segment": str(completion.segment),
                    "prompt_tokens": str(completion.prompt_tokens),
                    "completion_tokens": str(completion.completion_tokens),
                    "finish_reason": completion.finish_reason,
                }
                if completion.branch_reason is not None:  # the call opened a new segment
                    attributes["branch_reason"] = completion.branch_reason
            span = self._child(
                "chat_call",
                "CHAT_MODEL",
                start_ns,
                inputs={"messages": [_preview(str(m)) for m in messages]},
                attributes=attributes,
            )
            outputs = (
                {"content": completion.content, "tool_calls": completion.tool_calls}
                if completion is not None
                else {"error": error}
            )
            span.end(outputs=outputs, status="OK" if error is None else "ERROR")
        except Exception:  # noqa: BLE001
            self.tracer.failed("chat call span")

    def user(self, start_ns: int, name: str, reply: Any, error: str | None = None) -> None:
        """One simulated-user turn (an interaction's ``generate_response``): its text, score
        and whether it ended the episode, or the error that failed the sample."""
        try:
            end_ns = time.time_ns()
            attributes = {"latency_s": f"{(end_ns - start_ns) / 1e9:.4f}"}
            if reply is not None:
                attributes |= {"terminate": str(reply.terminate), "score": str(reply.score)}
            span = self._child(f"user:{name}", "AGENT", start_ns, inputs={}, attributes=attributes)
            outputs = {"text": _preview(reply.text)} if reply is not None else {"error": error}
            span.end(outputs=outputs, status="OK" if error is None else "ERROR", end_time_ns=end_ns)
        except Exception:  # noqa: BLE001
            self.tracer.failed("user span")

    def compaction(self, start_ns: int, event: Any) -> None:
        """A ``tool_agent`` history compacted to fit ``multi_turn.max_context_tokens``
        (``agentloop.compaction.Compaction``): the segment it opened, the tokens before
        and after, what was dropped or the summary's length."""
        try:
            span = self._child(
                "compaction",
                "MEMORY",
                start_ns,
                inputs={"tokens": event.before_tokens, "messages": event.messages},
                attributes={
                    "segment": str(event.segment),
                    "mode": event.mode,
                    "dropped": str(event.dropped),
                    "before_tokens": str(event.before_tokens),
                    "after_tokens": str(event.after_tokens),
                    **(
                        {
                            "summary_tokens": str(event.summary_tokens),
                            "kept_turn": str(event.kept_turn).lower(),
                        }
                        if event.mode == "summarize"
                        else {}
                    ),
                },
            )
            span.end(outputs={"tokens": event.after_tokens, "reason": event.reason})
        except Exception:  # noqa: BLE001
            self.tracer.failed("compaction span")

    def environment(
        self, name: str, outputs: dict[str, Any], attributes: dict[str, Any], start_ns: int = 0
    ) -> None:
        """An environment's part of the sample (a verifiers rubric's scores, an OpenEnv
        step's reward): one span with its outputs and state numbers as attributes."""
        try:
            now = time.time_ns()
            span = self._child(
                name,
                "EVALUATOR",
                start_ns or now,
                inputs={},
                attributes={k: str(v) for k, v in attributes.items()},
            )
            span.end(outputs=outputs, end_time_ns=now)
        except Exception:  # noqa: BLE001
            self.tracer.failed("environment span")

    def agent_error(self, error: str) -> None:
        """The agent of a gateway session failed: its traceback as an error span."""
        try:
            span = self._child("agent_error", "AGENT", time.time_ns(), inputs={})
            span.end(outputs={"traceback": error}, status="ERROR")
        except Exception:  # noqa: BLE001
            self.tracer.failed("agent error span")

    def finish(self, out: Any, error: BaseException | None = None) -> str | None:
        """Close the sample's trace; returns its id (None if tracing failed). The root span is
        ended (which queues the trace for export) once the whole batch is done, so that
        writing traces to the store does not compete with generation."""
        try:
            outputs = None
            if out is not None:
                outputs = {
                    "num_turns": out.num_turns,
                    "response_tokens": len(out.response_ids),
                    "stop_reason": out.record.stop_reason,
                    "tool_calls": out.record.tool_calls,
                }
                if self.tracer.token2text:
                    outputs["response"] = self.tracer.tokenizer.decode(out.response_ids)
            self.tracer.defer(self.root, outputs, "ERROR" if error else "OK", time.time_ns())
            return self.root.trace_id
        except Exception:  # noqa: BLE001
            self.tracer.failed("root span")
            return None


class MlflowTracer:
    """Makes ``SampleTrace`` s in one MLflow experiment (and run, when given)."""

    def __init__(self, config: Any, tokenizer: Any) -> None:
        import mlflow

        self.config = config
        self.tokenizer = tokenizer
        self.token2text = bool(config.token2text)
        if config.tracking_uri:
            mlflow.set_tracking_uri(config.tracking_uri)
        name = config.experiment_name or "agentloop-rollouts"
        experiment = mlflow.get_experiment_by_name(name)
        self.experiment_id = (
            experiment.experiment_id if experiment else mlflow.create_experiment(name)
        )
        self._warned: set[str] = set()
        self._pending: list[tuple[Any, Any, str, int]] = []
        self._lock = threading.Lock()

    def failed(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning("tracing failed (%s); the rollout goes on", what, exc_info=True)

    def start(
        self, context: TraceContext, index: int, fields: dict[str, Any], agent_name: str
    ) -> SampleTrace | None:
        import mlflow

        try:
            tags = {
                "step": str(context.step),
                "validate": str(context.validate).lower(),
                "sample_index": str(index),
                "rollout_n": str(fields.get("rollout_n", 0)),
                "agent_name": agent_name,
                "uid": str(fields.get("uid", "")),
                "data_source": str(fields.get("data_source", "")),
            }
            metadata = {"mlflow.sourceRun": self.config.run_id} if self.config.run_id else None
            messages = fields.get("raw_prompt") or []
            root = mlflow.start_span_no_context(
                agent_name,
                span_type="AGENT",
                inputs={"messages": messages[-4:]},
                tags=tags,
                metadata=metadata,
                experiment_id=self.experiment_id,
            )
            return SampleTrace(self, root)
        except Exception:  # noqa: BLE001
            self.failed("trace start")
            return None

    def defer(self, root: Any, outputs: Any, status: str, end_ns: int) -> None:
        with self._lock:
            self._pending.append((root, outputs, status, end_ns))

    def end_pending(self) -> None:
        """End the finished samples' root spans (export then runs in MLflow's queue)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for root, outputs, status, end_ns in pending:
            try:
                root.end(outputs=outputs, status=status, end_time_ns=end_ns)
            except Exception:  # noqa: BLE001
                self.failed("root span end")

    def release(self) -> None:
        """``end_pending`` in a background thread (the batch's caller does not wait)."""
        threading.Thread(target=self.end_pending, name="trace-end", daemon=True).start()

    def flush(self) -> None:
        """Wait until every finished trace is in the store (so it can be tagged, or before
        the worker stops)."""
        import mlflow

        self.end_pending()
        try:
            mlflow.flush_trace_async_logging()
        except Exception:  # noqa: BLE001
            self.failed("flush")


def make_tracer(config: Any, tokenizer: Any) -> MlflowTracer | None:
    """The tracer for ``trace.backend`` (None when tracing is off)."""
    if config.backend is None:
        return None
    if config.backend != "mlflow":
        raise ValueError(
            f"actor_rollout_ref.rollout.trace.backend={config.backend!r} is not supported; "
            "use mlflow or null"
        )
    return MlflowTracer(config, tokenizer)

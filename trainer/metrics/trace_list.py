"""One training step's rollout traces as a table, read headless from the MLflow store
(``agentloop-traces --step N``). The query is the one ``docs/traces.md`` shows for scripts:

    MlflowClient(tracking_uri=store).search_traces(
        locations=[experiment_id], filter_string="tags.step = '3'", include_spans=True)

Ids, step, sample index, ``rollout_n``, ``validate``, agent and reward are trace tags (the
reward once the trainer scored the batch); turns, stop reason and tool calls are the outputs
of the root ``AGENT`` span (``agentloop/trace.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceRow", "experiment_ids", "format_trace_table", "step_traces", "traced_steps"]

PAGE = 500
COLUMNS = (
    "trace_id",
    "sample",
    "rollout_n",
    "validate",
    "agent_name",
    "reward",
    "stop_reason",
    "turns",
    "tool_calls",
)


@dataclass(frozen=True, slots=True)
class TraceRow:
    trace_id: str
    sample: int
    rollout_n: int
    validate: bool
    agent_name: str
    reward: str | None
    """The ``reward`` tag as written (None: the batch was not scored, e.g. a rollout run)."""
    stop_reason: str | None
    turns: int | None
    tool_calls: int | None


def experiment_ids(client: Any, run_dir: Path | None) -> list[str]:
    """The run's experiment (from ``<run dir>/mlflow_run_id``), else every experiment."""
    id_file = run_dir / "mlflow_run_id" if run_dir else None
    if id_file is not None and id_file.is_file():
        return [client.get_run(id_file.read_text().strip()).info.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


def _search(client: Any, experiment: str, filter_string: str | None, spans: bool) -> list[Any]:
    traces: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment],
            filter_string=filter_string,
            max_results=PAGE,
            page_token=token,
            include_spans=spans,
        )
        traces.extend(page)
        token = page.token
        if not token or not page:
            return traces


def traced_steps(client: Any, experiments: list[str]) -> list[int]:
    """Every step with at least one trace, ascending."""
    steps = {
        int(t.info.tags["step"])
        for exp in experiments
        for t in _search(client, exp, None, spans=False)
        if t.info.tags.get("step", "").isdigit()
    }
    return sorted(steps)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) or str(value).isdigit() else None


def step_traces(client: Any, experiments: list[str], step: int) -> list[TraceRow]:
    """The traces tagged ``step``, training samples first, by sample index and rollout_n."""
    rows = []
    for exp in experiments:
        for trace in _search(client, exp, f"tags.step = '{step}'", spans=True):
            tags = trace.info.tags
            root = next((s for s in trace.data.spans if s.parent_id is None), None)
            outputs = root.outputs if root is not None and isinstance(root.outputs, dict) else {}
            rows.append(
                TraceRow(
                    trace_id=trace.info.trace_id,
                    sample=_int(tags.get("sample_index")) or 0,
                    rollout_n=_int(tags.get("rollout_n")) or 0,
                    validate=tags.get("validate") == "true",
                    agent_name=tags.get("agent_name", ""),
                    reward=tags.get("reward"),
                    stop_reason=outputs.get("stop_reason"),
                    turns=_int(outputs.get("num_turns")),
                    tool_calls=_int(outputs.get("tool_calls")),
                )
            )
    return sorted(rows, key=lambda r: (r.validate, r.sample, r.rollout_n, r.trace_id))


def format_trace_table(rows: list[TraceRow]) -> str:
    """A header and one line per trace, columns two spaces apart, ``-`` where unknown."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return str(value).lower() if isinstance(value, bool) else str(value)

    table = [list(COLUMNS)]
    table += [[cell(getattr(r, c)) for c in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in table
    )

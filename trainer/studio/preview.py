"""The preview: a few rows run through the real servers and agent loops by ``agentloop-rollout``
(a child process, so the page stays responsive and a cancel is a signal), then shown turn by
turn: each model turn (the tokens the loss trains, mask 1) and each tool or user reply between
them (mask 0), the parsed tool calls, token counts, the stop reason, the reward and the group's
advantages under the chosen estimator. The form is checked first by the CLI's own start-up
code, so a bad row, model or reward file shows the CLI's text."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.algos import compute_advantages, estimator_for
from trainer.studio.child import ChildJob

__all__ = [
    "PREVIEW_FIELDS",
    "PreviewJob",
    "SampleView",
    "Span",
    "check_estimator",
    "preview_overrides",
    "sample_views",
    "spans_of",
]

logger = logging.getLogger(__name__)

# (key, label, default): the form, in order; empty values are left out of the command.
PREVIEW_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("actor_rollout_ref.model.path", "model (asset name, folder or hub id)", "tiny-qwen3"),
    ("data.train_files", "rows file (jsonl or parquet; or type rows below)", ""),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tool config", ""),
    ("custom_reward_function.path", "reward file (empty: the built-in scorers)", ""),
    ("custom_reward_function.name", "reward function", "compute_score"),
    ("+max_samples", "rows to run (the first N)", "2"),
    ("actor_rollout_ref.rollout.n", "samples per row (n)", "2"),
    ("actor_rollout_ref.rollout.response_length", "response tokens", "256"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "max model turns", ""),
    ("actor_rollout_ref.rollout.agent.num_workers", "agent-loop workers", "1"),
)
ESTIMATOR_KEY = "algorithm.adv_estimator"
NEEDS_MORE = {"gae": "the critic's values", "remax": "a greedy rollout's scores"}
_PROGRESS = re.compile(r"rollout:\s+\d+%\|[^\r\n]*?\|\s*(\d+)/(\d+)")


def preview_overrides(settings: dict[str, str], folder: Path) -> tuple[list[str], Path, str | None]:
    """The ``agentloop-rollout`` overrides of the form: its non-empty fields; typed rows
    (``rows``: JSON lines) written to ``folder/rows.jsonl``; the output in ``folder``; one
    batch holding every row, so a row's samples form one group; ``overrides`` lines appended
    as given. Returns the overrides, the output file and the error when the typed rows are
    not JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    values = {k: settings.get(k, "").strip() for k, _, _ in PREVIEW_FIELDS}
    typed = settings.get("rows", "").strip()
    if typed:
        error = _check_rows(typed)
        if error:
            return [], folder / "preview.jsonl", error
        (folder / "rows.jsonl").write_text(typed + "\n")
        values["data.train_files"] = str(folder / "rows.jsonl")
    elif not values["data.train_files"]:
        return [], folder / "preview.jsonl", "give a rows file or type rows (JSON lines)"
    if values["custom_reward_function.name"] in ("", "compute_score"):
        values["custom_reward_function.name"] = ""  # the default: left out of the command
    output = folder / "preview.jsonl"
    overrides = [f"{k}={v}" for k, v in values.items() if v]
    rows = int(values["+max_samples"]) if values["+max_samples"].isdigit() else 0
    if rows:  # one generate call for every row: each row's n samples are one group
        overrides.append(f"data.train_batch_size={rows}")
    overrides.append(f"+output={output}")
    overrides += [
        line.strip() for line in settings.get("overrides", "").splitlines() if line.strip()
    ]
    return overrides, output, None


def _check_rows(text: str) -> str | None:
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"typed row {i + 1} is not JSON: {exc}"
        if not isinstance(row, dict):
            return f"typed row {i + 1} must be a JSON object (one row per line)"
    return None


@dataclass(slots=True)
class Span:
    """A run of response tokens with one loss-mask value."""

    trained: bool
    """The model sampled these tokens (loss mask 1); False: a tool or user reply (mask 0)."""
    text: str
    tokens: int
    calls: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls parsed from this model turn (name, arguments, ok, seconds)."""


@dataclass(slots=True)
class SampleView:
    uid: str
    rollout_n: int
    index: Any
    data_source: str | None
    agent_name: str
    stop_reason: str
    prompt_text: str
    prompt_tokens: int
    response_tokens: int
    trained_tokens: int
    score: float | None
    scores: dict[str, float]
    advantage: float | None
    """The mean advantage over the sample's trained tokens (None: unscored or not computed)."""
    tool_calls: int
    tool_errors: int
    spans: list[Span]


def spans_of(mask: list[int]) -> list[tuple[bool, int, int]]:
    """(trained, start, end) runs of equal mask values."""
    runs: list[tuple[bool, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((bool(mask[start]), start, i))
            start = i
    return runs


def sample_views(
    records: list[dict[str, Any]], tokenizer: Any, estimator: str
) -> tuple[list[SampleView], str | None]:
    """The page's view of ``agentloop-rollout``'s JSON lines, with advantages of ``estimator``
    over each group whose samples are all scored; and a note when none could be computed."""
    advantages, note = _advantages(records, estimator)
    views = []
    for record, advantage in zip(records, advantages, strict=True):
        ids, mask = record["response_ids"], record["response_mask"]
        spans = []
        turn = 0
        for trained, a, b in spans_of(mask):
            text = tokenizer.decode(ids[a:b], skip_special_tokens=False)
            calls = []
            if trained:
                calls = [c for c in record["calls"] if c.get("turn") == turn]
                turn += 1
            spans.append(Span(trained, text, b - a, calls))
        views.append(
            SampleView(
                uid=record["uid"],
                rollout_n=record["rollout_n"],
                index=record["index"],
                data_source=record["data_source"],
                agent_name=record["agent_name"],
                stop_reason=record["stop_reason"],
                prompt_text=record["prompt_text"],
                prompt_tokens=len(record["prompt_ids"]),
                response_tokens=len(ids),
                trained_tokens=sum(mask),
                score=record.get("score"),
                scores=record.get("scores") or {},
                advantage=advantage,
                tool_calls=record["tool_calls"],
                tool_errors=record["tool_errors"],
                spans=spans,
            )
        )
    return views, note


def _advantages(
    records: list[dict[str, Any]], estimator: str
) -> tuple[list[float | None], str | None]:
    out: list[float | None] = [None] * len(records)
    if estimator in NEEDS_MORE:
        return out, f"{estimator} advantages need {NEEDS_MORE[estimator]}: not previewed"
    unscored = {r["uid"] for r in records if r.get("score") is None}
    keep = [i for i, r in enumerate(records) if r["uid"] not in unscored]
    if not keep:
        return out, "no group is scored: no advantages"
    width = max(max(len(records[i]["response_mask"]) for i in keep), 1)
    mask = torch.zeros(len(keep), width)  # [scored samples, response]
    for row, i in enumerate(keep):
        m = records[i]["response_mask"]
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
    scores = torch.tensor([float(records[i]["score"]) for i in keep])
    adv = compute_advantages(estimator, scores, mask, [records[i]["uid"] for i in keep])
    means = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    for row, i in enumerate(keep):
        out[i] = float(means[row])
    return out, None


def check_estimator(name: str) -> str:
    """``name`` if it is a registered advantage estimator; else ValueError as training says."""
    estimator_for(name)
    return name


class PreviewJob(ChildJob):
    """One ``agentloop-rollout`` child of the page and what it wrote."""

    def __init__(
        self,
        overrides: list[str],
        output: Path,
        tokenizer: Any,
        estimator: str,
        notes: list[str],
        settings: dict[str, str] | None = None,
    ) -> None:
        self.overrides, self.output, self.tokenizer = overrides, output, tokenizer
        self.estimator, self.notes = estimator, notes
        self.settings = settings or {}
        """The form it was started from (the page shows it again)."""
        super().__init__("trainer.cli.rollout", overrides, output.parent / "preview.log")
        self.cancelled = False
        self._views: tuple[list[SampleView], str | None] | None = None

    @property
    def command(self) -> str:
        return shlex.join(["agentloop-rollout", *self.overrides])

    def cancel(self, grace_s: float = 30.0) -> None:
        """SIGINT to the command alone (it stops its servers and Ray on the way out; helper
        processes in its group, such as a semaphore tracker, must outlive it to clean up);
        SIGKILL to its process group if it is still there after ``grace_s``. Once."""
        if not self.running or self.cancelled:
            return
        self.cancelled = True
        self.process.send_signal(signal.SIGINT)

        def _kill() -> None:
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("the preview did not stop in %.0f s: killing it", grace_s)
                os.killpg(self.process.pid, signal.SIGKILL)

        threading.Thread(target=_kill, name="preview-cancel", daemon=True).start()

    def progress(self) -> tuple[int, int] | None:
        """(trajectories done, total) from the command's progress bar; None before it shows."""
        found = _PROGRESS.findall(self.log_text())
        return (int(found[-1][0]), int(found[-1][1])) if found else None

    def views(self) -> tuple[list[SampleView], str | None]:
        """The samples (empty until the command ended well) and the advantages' note."""
        if self.returncode != 0 or not self.output.is_file():
            return [], None
        if self._views is None:
            lines = self.output.read_text().splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            self._views = sample_views(records, self.tokenizer, self.estimator)
        return self._views

    def status(self) -> dict[str, Any]:
        views, note = self.views()
        done = self.progress()
        return {
            "running": self.running,
            "returncode": self.returncode,
            "cancelled": self.cancelled,
            "command": self.command,
            "output": str(self.output),
            "progress": list(done) if done else None,
            "notes": self.notes,
            "advantage_note": note,
            "estimator": self.estimator,
            "samples": [asdict(v) for v in views],
            "log": self.log_tail(),
        }

"""The repository-task row: a workspace, a problem, a check and how the check becomes a reward.

A row names its task in ``extra_info.workspace_task`` (one struct column, so parquet keeps it
and verl's ``extra_info``/``tools_kwargs`` stay beside it untouched), or, for hand-written jsonl,
with the same keys at the top level of the row. A row with both is refused. Keys:

- ``workspace``: a folder, or a ``.tar``/``.tar.gz``/``.tgz``/``.zip`` archive; a relative path
  resolves against the data file's folder;
- ``problem``: the user prompt (optional where the row already has a ``prompt``);
- ``check``: a command run in the workspace after the agent: a string (run by ``sh -c``) or an
  argv list, e.g. ``python -m pytest -q tests/``; ``check_timeout_s`` its limit (default 300);
- ``setup``: optional command run once when a copy of the workspace is prepared;
- ``partial``: false (default): the check's exit code 0 scores 1, anything else 0; true: the
  fraction of ``tests`` (pytest node ids) reported passed, or without ``tests`` the fraction of
  pytest's summary line (passed / (passed + failed + errors)).

``tasks_of_rows`` validates every row; a bad one is refused naming its index and key.
``resolve_task_rows`` does so at the start-up of ``agentloop-train`` and ``agentloop-rollout``
and writes each task's resolved ``workspace`` path into its row, so the agent-loop workers
(whatever their folder) find it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ARCHIVE_SUFFIXES",
    "WorkspaceTask",
    "WorkspaceTaskError",
    "has_workspace_task",
    "resolve_task_rows",
    "task_of_row",
    "tasks_of_rows",
]

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
"""Archive names a ``workspace`` may have (besides a folder)."""
_KEYS = ("workspace", "problem", "check", "check_timeout_s", "setup", "partial", "tests")


class WorkspaceTaskError(ValueError):
    """A row's workspace task is malformed; the message names the row index and the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkspaceTask:
    """One repository task, validated and with its paths resolved."""

    workspace: Path
    """Absolute path of the folder or archive."""
    problem: str | None
    """The user prompt (None: the row's own ``prompt`` is used)."""
    check: tuple[str, ...]
    """The check's argv (a string became ``sh -c <string>``)."""
    check_timeout_s: float = 300.0
    """Wall-clock limit of the check (and of ``setup``); past it the sandbox is killed."""
    setup: tuple[str, ...] | None = None
    """Run once in each fresh copy, before the agent."""
    partial: bool = False
    """Score the fraction of tests passed instead of all-or-nothing."""
    tests: tuple[str, ...] = ()
    """Pytest node ids whose outcomes count with ``partial``."""

    @property
    def key(self) -> str:
        """Copies of tasks with the same key are interchangeable (the warm pool's key)."""
        text = f"{self.workspace}\0{self.setup!r}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def messages(self) -> list[dict[str, str]]:
        """The chat prompt of the task: the problem as one user message."""
        return [{"role": "user", "content": self.problem or ""}]


def _command(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) and value.strip():
        return ("sh", "-c", value)
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and value
        and all(isinstance(part, str) and part for part in value)
    ):
        return tuple(value)
    raise WorkspaceTaskError(
        f"{where} must be a command: a non-empty string or a list of non-empty strings, "
        f"got {value!r}"
    )


def _workspace(value: Any, where: str, base_dir: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise WorkspaceTaskError(f"{where} must be a folder or archive path, got {value!r}")
    path = Path(value)
    path = (path if path.is_absolute() else base_dir / path).resolve()
    if not path.exists():
        raise WorkspaceTaskError(f"{where}: {path} does not exist")
    if not path.is_dir() and not path.name.endswith(ARCHIVE_SUFFIXES):
        raise WorkspaceTaskError(
            f"{where}: {path} is neither a folder nor a {'/'.join(ARCHIVE_SUFFIXES)} archive"
        )
    return path


def has_workspace_task(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` gives a workspace task (``extra_info.workspace_task``, or ``workspace``
    / ``check`` at its top level); ``task_of_row`` says whether the task is whole."""
    extra = row.get("extra_info")
    nested = isinstance(extra, Mapping) and extra.get("workspace_task") is not None
    return nested or "workspace" in row or "check" in row


def task_of_row(row: Mapping[str, Any], index: int, base_dir: str | Path) -> WorkspaceTask | None:
    """The row's task (None: the row has none); raises ``WorkspaceTaskError`` naming
    ``row {index}`` and the key at fault."""
    if not has_workspace_task(row):
        return None
    extra = row.get("extra_info")
    nested = extra.get("workspace_task") if isinstance(extra, Mapping) else None
    top = "workspace" in row or "check" in row
    if nested is not None and top:
        raise WorkspaceTaskError(
            f"row {index}: the task is given twice (top-level workspace/check and "
            "extra_info.workspace_task); keep one"
        )
    if nested is not None and not isinstance(nested, Mapping):
        raise WorkspaceTaskError(
            f"row {index}: extra_info.workspace_task must be a mapping, got {type(nested).__name__}"
        )
    fields: Mapping[str, Any] = nested if nested is not None else row
    prefix = f"row {index}: " + ("extra_info.workspace_task." if nested is not None else "")
    if nested is not None and (unknown := sorted(set(fields) - set(_KEYS))):
        raise WorkspaceTaskError(f"{prefix}{unknown[0]} is not a task key (keys: {_KEYS})")
    for key in ("workspace", "check"):
        if key not in fields:
            raise WorkspaceTaskError(f"{prefix}{key} is missing")
    problem = fields.get("problem")
    if problem is None and "prompt" not in row and "raw_prompt" not in row:
        raise WorkspaceTaskError(f"{prefix}problem is missing (and the row has no prompt)")
    if problem is not None and not isinstance(problem, str):
        raise WorkspaceTaskError(f"{prefix}problem must be a string, got {problem!r}")
    timeout = fields.get("check_timeout_s", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise WorkspaceTaskError(f"{prefix}check_timeout_s must be a number > 0, got {timeout!r}")
    partial = fields.get("partial", False)
    if not isinstance(partial, bool):
        raise WorkspaceTaskError(f"{prefix}partial must be true or false, got {partial!r}")
    tests = fields.get("tests") or ()
    if isinstance(tests, str) or not all(isinstance(t, str) and t for t in tests):
        raise WorkspaceTaskError(f"{prefix}tests must be a list of pytest node ids, got {tests!r}")
    setup = fields.get("setup")
    return WorkspaceTask(
        workspace=_workspace(fields["workspace"], f"{prefix}workspace", Path(base_dir)),
        problem=problem,
        check=_command(fields["check"], f"{prefix}check"),
        check_timeout_s=float(timeout),
        setup=None if setup is None else _command(setup, f"{prefix}setup"),
        partial=partial,
        tests=tuple(tests),
    )


def tasks_of_rows(
    rows: Sequence[Mapping[str, Any]], base_dir: str | Path
) -> list[WorkspaceTask | None]:
    """Every row's task, validated at start-up (the first bad row raises)."""
    return [task_of_row(row, i, base_dir) for i, row in enumerate(rows)]


def resolve_task_rows(rows: list[dict[str, Any]], base_dir: str | Path) -> int:
    """Validate every row's task (``tasks_of_rows``) and write its absolute ``workspace``
    path into the row (a new ``extra_info`` mapping; the row's other keys untouched); returns
    how many rows have a task."""
    tasks = tasks_of_rows(rows, base_dir)
    for row, task in zip(rows, tasks, strict=True):
        if task is None:
            continue
        extra = row.get("extra_info")
        nested = extra.get("workspace_task") if isinstance(extra, Mapping) else None
        if nested is not None:
            assert isinstance(extra, Mapping)
            row["extra_info"] = {
                **extra,
                "workspace_task": {**nested, "workspace": str(task.workspace)},
            }
        else:
            row["workspace"] = str(task.workspace)
    return sum(task is not None for task in tasks)

"""Workspace tools: what an agent uses inside its sample's workspace (``current_workspace()``).

Five plain async functions, each answering with text for the model:

- ``bash(command)``: ``sh -c command`` in the sandbox, in the workspace, under
  ``WorkspaceConfig.agent_timeout_s``; the exit code and the output (stdout and stderr together);
- ``read_file(path, start_line=None, end_line=None)``: the file's lines, numbered (``cat -n``);
- ``write_file(path, content)``: create or overwrite the file, parent folders created;
- ``str_replace(path, old, new)``: replace ``old``, which must occur exactly once;
- ``run_check()``: the task's check now, under its own limit, without ending the sample.

Any native loop gets them as tools from a tool config entry ``{class_name: workspace, config:
{type: workspace}}`` (``workspace_tools``); a LangGraph or gateway agent calls the functions
themselves while its sample runs in a workspace. A mistake (a path outside the workspace, a
string found 0 or 2 times, a missing file) is answered as ``Error: ...`` text, not raised, so
every framework shows it to the model the same way. Answers longer than
``tool_output_chars`` keep their head and tail around a marker saying how much was cut.

The file tools act on the workspace's host folder (the sandbox's only writable folder) from the
worker: a path is resolved with its symlinks, and one that leaves the workspace is refused. A
file they create is given to the sandbox's user, so the agent's commands can still change it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from agentloop.tools.function import FunctionTool
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.pool import SandboxError, Workspace, current_workspace

__all__ = [
    "TOOL_NAMES",
    "WorkspaceTool",
    "bash",
    "clip",
    "read_file",
    "run_check",
    "str_replace",
    "workspace_tools",
    "write_file",
]

CALL_TIMEOUT_S = 86400.0
"""The runner's per-call limit of these tools: a backstop only, since ``bash`` and
``run_check`` run under the workspace's own limits."""


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its head and tail around a marker."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def _limit() -> int:
    return current_workspace().pool.config.tool_output_chars


class _Refused(ValueError):
    """A path the file tools will not touch; the message is the model's answer."""


def _resolve(ws: Workspace, path: str) -> Path:
    """``path`` (relative to the workspace, or absolute inside it) with symlinks resolved;
    one that leaves the workspace raises ``_Refused``."""
    root = ws.path.resolve()
    if not path:
        raise _Refused("Error: path is empty; give a path relative to the workspace")
    given = Path(path)
    target = (given if given.is_absolute() else root / given).resolve()
    if target != root and not target.is_relative_to(root):
        raise _Refused(
            f"Error: {path!r} is outside the workspace; give a path inside it "
            "(relative to the workspace folder)"
        )
    return target


def _give_to_sandbox(ws: Workspace, created: list[Path]) -> None:
    """Folders and files the worker made belong to the sandbox's user, as the rest do."""
    if ws.uid is not None:
        for made in created:
            os.chown(made, ws.uid, ws.uid)


def _read(ws: Workspace, path: str, start: int | None, end: int | None) -> str:
    target = _resolve(ws, path)
    if target.is_dir():
        return f"Error: {path!r} is a folder, not a file"
    if not target.exists():
        return f"Error: {path!r} does not exist"
    lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
    first = max(start or 1, 1)
    last = len(lines) if end is None else min(end, len(lines))
    if first > max(len(lines), 1) or last < first:
        return f"Error: lines {first}-{last} are out of range: {path!r} has {len(lines)} lines"
    return "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(first, last + 1))


def _write(ws: Workspace, path: str, content: str) -> str:
    target = _resolve(ws, path)
    if target.is_dir():
        return f"Error: {path!r} is a folder, not a file"
    created = [p for p in reversed(target.parents) if not p.exists()]
    existed = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    _give_to_sandbox(ws, created + ([] if existed else [target]))
    verb = "overwrote" if existed else "created"
    return f"{verb} {path} ({len(content)} characters)"


def _replace(ws: Workspace, path: str, old: str, new: str) -> str:
    target = _resolve(ws, path)
    if not target.is_file():
        return f"Error: {path!r} does not exist or is not a file"
    if not old:
        return "Error: old is empty; give the exact text to replace"
    text = target.read_text(encoding="utf-8")
    count = text.count(old)
    if count != 1:
        return (
            f"Error: old occurs {count} times in {path}; it must occur exactly once "
            "(include more of the surrounding text to make it unique)"
        )
    target.write_text(text.replace(old, new, 1), encoding="utf-8")
    return f"replaced 1 occurrence in {path}"


async def _file_op(fn: Callable[..., str], *args: Any) -> str:
    """A file tool's work in a thread (file I/O never blocks the event loop)."""
    ws = current_workspace()
    try:
        text = await asyncio.to_thread(fn, ws, *args)
    except _Refused as e:
        return str(e)
    except UnicodeDecodeError:
        return f"Error: {args[0]!r} is not UTF-8 text"
    except OSError as e:
        return f"Error: {e.strerror or e} ({args[0]!r})"
    return clip(text, ws.pool.config.tool_output_chars)


async def bash(command: str) -> str:
    """Run a shell command in the workspace (sh -c) and return its exit code and output.

    Args:
        command: The shell command, run with the workspace folder as the working directory.
    """
    ws = current_workspace()
    try:
        result = await ws.run(["sh", "-c", command])
    except SandboxError as e:
        return f"Error: {e}"
    output = result.output.decode("utf-8", "replace")
    status = result.reason or f"exit code {result.exit_code}"
    return clip(f"[{status}]\n{output}" if output else f"[{status}]", _limit())


async def read_file(path: str, start_line: int | None = None, end_line: int | None = None) -> str:
    """Read a text file of the workspace; lines come numbered.

    Args:
        path: The file, relative to the workspace folder.
        start_line: The first line to show (1-based; default the first).
        end_line: The last line to show (inclusive; default the last).
    """
    return await _file_op(_read, path, start_line, end_line)


async def write_file(path: str, content: str) -> str:
    """Create or overwrite a file of the workspace (its folders are created).

    Args:
        path: The file, relative to the workspace folder.
        content: The whole new content of the file.
    """
    return await _file_op(_write, path, content)


async def str_replace(path: str, old: str, new: str) -> str:
    """Replace text in a file of the workspace; the old text must occur exactly once.

    Args:
        path: The file, relative to the workspace folder.
        old: The exact text to replace (whitespace included).
        new: The text to put in its place.
    """
    return await _file_op(_replace, path, old, new)


async def run_check() -> str:
    """Run the task's check (its tests) on the workspace now and return whether it passes."""
    ws = current_workspace()
    result = await ws.check()
    verdict = "passed" if result.score == 1.0 else "failed"
    lines = [f"check {verdict}: score {result.score:g} ({result.passed} passed, "
             f"{result.failed} failed)"]  # fmt: skip
    if result.reason:
        lines.append(result.reason)
    if result.output_tail:
        lines.append(result.output_tail)
    return clip("\n".join(lines), _limit())


_FUNCTIONS: dict[str, Callable[..., Awaitable[str]]] = {
    "bash": bash,
    "read_file": read_file,
    "write_file": write_file,
    "str_replace": str_replace,
    "run_check": run_check,
}
TOOL_NAMES = tuple(_FUNCTIONS)
"""The workspace tools, by the names the model calls them."""


class WorkspaceTool(FunctionTool):
    """One workspace tool; ``workspace`` is the pool config its tool entry gave (the worker
    runs workspace samples with it)."""

    def __init__(self, name: str, config: dict[str, Any], workspace: WorkspaceConfig) -> None:
        super().__init__(_FUNCTIONS[name], config=config)
        self.workspace = workspace


def workspace_tools(
    names: Sequence[str] | None = None, config: dict[str, Any] | None = None
) -> dict[str, WorkspaceTool]:
    """The workspace tools (``names``: a subset) for a tool entry's ``config``: its
    ``workspace`` mapping is the worker's ``WorkspaceConfig``; ``call_timeout_s`` defaults to
    a day (the tools keep their own limits). Raises ``ValueError`` naming a bad key."""
    config = dict(config or {})
    config.pop("type", None)
    chosen = list(config.pop("tools", None) or names or TOOL_NAMES)
    if unknown := [n for n in chosen if n not in _FUNCTIONS]:
        raise ValueError(f"workspace tools: {unknown[0]!r} is not one (tools: {TOOL_NAMES})")
    fields = config.pop("workspace", None) or {}
    if not isinstance(fields, dict):
        raise ValueError(f"workspace tools: workspace must be a mapping, got {fields!r}")
    known = set(WorkspaceConfig.__dataclass_fields__)
    if bad := sorted(set(fields) - known):
        raise ValueError(
            f"workspace tools: workspace.{bad[0]} is not a WorkspaceConfig key "
            f"(keys: {', '.join(sorted(known))})"
        )
    workspace = WorkspaceConfig(**fields)
    config.setdefault("call_timeout_s", CALL_TIMEOUT_S)
    return {name: WorkspaceTool(name, dict(config), workspace) for name in chosen}

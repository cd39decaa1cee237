"""Coding-agent CLIs as gateway agents: ``harness: claude-code`` or ``harness: codex``.

Per sample: a fresh copy of the row's workspace task (``agentloop.workspace``), the CLI run in
the project's bubblewrap sandbox with only that copy and a private home beside it writable, its
environment set for its dialect (Claude Code: ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``;
Codex: a generated ``$CODEX_HOME/config.toml`` naming the session as a Responses provider;
``OPENAI_*`` for both), telemetry, update checks and other traffic off, a wall-clock limit that
kills the sandbox (its whole process tree), and its transcript and home (the CLI's own session
log) kept in the session's log folder. Then the task's check runs in the same sandbox under its
own limit; its score is the sample's reward. The sandbox keeps the host's network namespace so
the CLI reaches the gateway on loopback (docs/harnesses.md says what that allows).

The CLIs come from ``make harnesses`` (``harnesses/package.json``, pinned); the loop checks at
start-up that the binary is there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentloop.gateway.command import session_log_dir
from agentloop.gateway.endpoint import AgentFailed, LLMEndpoint
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.pool import Workspace, WorkspacePool
from agentloop.workspace.runner import CommandResult, run_command
from agentloop.workspace.source import chown_tree, remove_tree
from agentloop.workspace.task import task_of_row

if TYPE_CHECKING:
    from agentloop.config import GatewayConfig

__all__ = [
    "HARNESS_DIR_ENV",
    "INSTALL_COMMAND",
    "HarnessNotInstalled",
    "HarnessSpec",
    "codex_config",
    "harness_argv",
    "harness_dir",
    "harness_env",
    "resolve_binary",
    "run_harness",
]

logger = logging.getLogger(__name__)

HARNESS_DIR_ENV = "AGENTLOOP_HARNESS_DIR"
"""Overrides the folder ``make harnesses`` installs into (default ``<repo>/harnesses``)."""
INSTALL_COMMAND = "make harnesses"

_BINARIES = {  # the native binaries npm puts in each CLI's linux-x64 optional package
    "claude-code": "node_modules/@anthropic-ai/claude-code-linux-x64/claude",
    "codex": "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
}
_CODEX_PATH = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/codex-path"
_KEYS = ("name", "model", "args", "timeout_s", "memory_mb", "binary", "workspace_dir", "sandbox")

# Everything that phones home, checks for updates or reports errors, off (found in 2.1.328).
_CLAUDE_QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root (we sandbox it)
}


class HarnessNotInstalled(ValueError):
    """The CLI's binary is not where ``make harnesses`` puts it."""


def harness_dir() -> Path:
    """The folder the CLIs are installed in (``$AGENTLOOP_HARNESS_DIR`` or the repo's)."""
    given = os.environ.get(HARNESS_DIR_ENV)
    return Path(given) if given else Path(__file__).resolve().parents[2] / "harnesses"


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessSpec:
    """A ``harness:`` entry: a name, or a mapping with ``name`` and these options."""

    name: Literal["claude-code", "codex"]
    model: str | None = None
    """The model name the CLI sends (default: the gateway's served name)."""
    args: tuple[str, ...] = ()
    """More arguments after the ones the runner passes."""
    timeout_s: float = 600.0
    """Wall-clock limit of the CLI; past it its sandbox is killed and the sample fails."""
    memory_mb: int = 16384
    """Address space per process (the CLIs reserve more virtual memory than a check)."""
    binary: str | None = None
    """A program to run instead of the installed CLI (a stand-in in the tests)."""
    workspace_dir: str = "."
    """Folder that relative ``workspace`` paths in rows are taken from."""
    sandbox: Literal["auto", "bwrap", "process"] = "auto"

    @classmethod
    def of(cls, value: str | Mapping[str, Any]) -> HarnessSpec:
        """The spec of a ``harness:`` value; a bad one raises ``ValueError`` naming the key."""
        entry: dict[str, Any] = {"name": value} if isinstance(value, str) else dict(value)
        if unknown := sorted(set(entry) - set(_KEYS)):
            raise ValueError(f"harness: {unknown[0]!r} is not a harness option (options: {_KEYS})")
        name = entry.get("name")
        if name not in _BINARIES:
            raise ValueError(f"harness: name must be one of {sorted(_BINARIES)}, got {name!r}")
        args = entry.get("args", ())
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"harness: args must be a list of strings, got {args!r}")
        timeout = entry.get("timeout_s", 600.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"harness: timeout_s must be a number > 0, got {timeout!r}")
        if entry.get("sandbox", "auto") not in ("auto", "bwrap", "process"):
            given = entry["sandbox"]
            raise ValueError(f"harness: sandbox must be auto, bwrap or process, got {given!r}")
        return cls(**{**entry, "args": tuple(args), "timeout_s": float(timeout)})


def resolve_binary(spec: HarnessSpec) -> Path:
    """The program to run; raises ``HarnessNotInstalled`` with the install command."""
    if spec.binary is not None:
        path = Path(spec.binary)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise HarnessNotInstalled(
                f"harness {spec.name!r}: binary {path} is not an executable file"
            )
        return path.resolve()
    path = harness_dir() / _BINARIES[spec.name]
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HarnessNotInstalled(
            f"harness {spec.name!r}: {path} is not installed; install the pinned CLIs with "
            f"`{INSTALL_COMMAND}` (npm ci in {harness_dir()}), or set {HARNESS_DIR_ENV}"
        )
    return path


def codex_config(base_url: str, model: str) -> str:
    """``$CODEX_HOME/config.toml``: the session as the provider, update checks, analytics,
    feedback and OpenTelemetry export off."""
    return (
        f'model = "{model}"\n'
        'model_provider = "agentloop"\n'
        "check_for_update_on_startup = false\n"
        "[analytics]\nenabled = false\n"
        "[feedback]\nenabled = false\n"
        '[otel]\nexporter = "none"\n'
        "[model_providers.agentloop]\n"
        'name = "agentloop gateway"\n'
        f'base_url = "{base_url}"\n'
        'env_key = "AGENTLOOP_API_KEY"\n'
        'wire_api = "responses"\n'
    )


def harness_argv(spec: HarnessSpec, binary: Path, prompt: str, model: str) -> list[str]:
    """The CLI's command line: one non-interactive task, its own approvals and sandbox off
    (the runner's sandbox holds it), ``spec.args`` last."""
    if spec.name == "claude-code":
        head = ["-p", prompt, "--model", model, "--dangerously-skip-permissions"]
        head += ["--output-format", "stream-json", "--verbose"]
    else:
        head = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        head += ["-m", model, prompt]
    return [str(binary), *head, *spec.args]


def harness_env(
    spec: HarnessSpec, llm: LLMEndpoint, home: Path, binary: Path, python_env: str | None
) -> dict[str, str]:
    """The sandbox's environment: the session for both dialects, a private home, quiet."""
    path = [str(binary.parent)]
    if spec.name == "codex" and spec.binary is None:
        path.append(str(harness_dir() / _CODEX_PATH))  # the rg Codex ships
    if python_env:
        path.append(os.path.join(os.path.realpath(python_env), "bin"))
    env = {
        "PATH": ":".join([*path, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "TMPDIR": "/tmp",
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": llm.api_key,
        "OPENAI_MODEL": llm.model,
        "AGENTLOOP_SESSION_ID": llm.session_id,
        "NO_COLOR": "1",
    }
    if spec.name == "claude-code":
        env |= {"ANTHROPIC_BASE_URL": llm.anthropic_base_url, "ANTHROPIC_API_KEY": llm.api_key}
        env |= {"CLAUDE_CONFIG_DIR": str(home / ".claude"), **_CLAUDE_QUIET}
    else:
        env |= {"CODEX_HOME": str(home / "codex"), "AGENTLOOP_API_KEY": llm.api_key}
    return env


def _pool(spec: HarnessSpec, resources: dict[str, Any]) -> WorkspacePool:
    """The worker's workspace pool for this sandbox and memory limit, kept in its
    ``AgentLoopContext.resources`` (closed with the worker: its copies and run folder go)."""
    key = f"harness-workspaces:{spec.sandbox}:{spec.memory_mb}"
    pool = resources.get(key)
    if pool is None:
        config = WorkspaceConfig(sandbox=spec.sandbox, memory_mb=spec.memory_mb)
        pool = resources[key] = WorkspacePool(config)
    return pool


def _prompt(row: Mapping[str, Any], problem: str | None) -> str:
    if problem:
        return problem
    messages = row.get("prompt") or row.get("raw_prompt") or []
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _failure(spec: HarnessSpec, result: CommandResult) -> str | None:
    if result.timed_out:
        return (
            f"the harness {spec.name!r} passed its {spec.timeout_s:g} s limit and was killed "
            "with its process tree"
        )
    if result.reason is not None:
        return f"the harness {spec.name!r} {result.reason}"
    if result.exit_code != 0:
        return f"the harness {spec.name!r} exited with {result.exit_code}: {result.tail(1500)}"
    return None


async def _run_in(
    ws: Workspace, spec: HarnessSpec, llm: LLMEndpoint, prompt: str, folder: Path
) -> CommandResult:
    """The CLI in ``ws``'s sandbox with a private home beside it; its transcript and home
    are copied into ``folder`` whatever happens."""
    pool = ws.pool
    config = pool.config
    binary = resolve_binary(spec)
    home = ws.path.parent / f"{ws.path.name}.home"
    (home / "codex").mkdir(parents=True)
    (home / "codex" / "config.toml").write_text(codex_config(llm.base_url, spec.model or llm.model))
    if ws.uid is not None:
        await chown_tree(home, ws.uid)
    package = binary.parent if spec.binary is not None else harness_dir() / "node_modules"
    ro = [] if str(package).startswith("/usr/") else [str(package.resolve())]
    try:
        argv = harness_argv(spec, binary, prompt, spec.model or llm.model)
        result = await run_command(  # the launcher starts in $HOME; the CLI in the workspace
            ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(ws.path), *argv],
            workdir=str(ws.path),
            uid=ws.uid,
            backend=pool.backend,
            limits=config.limits,
            timeout_s=spec.timeout_s,
            max_output_bytes=config.max_output_bytes,
            python_env=config.python_env,
            env=harness_env(spec, llm, home, binary, config.python_env),
            share_net=True,
            binds=[str(home)],
            ro_binds=ro,
        )
        (folder / "transcript.txt").write_bytes(result.output)
        return result
    finally:
        await asyncio.to_thread(_keep_home, home, folder / "home")


def _keep_home(home: Path, dest: Path) -> None:
    shutil.copytree(home, dest, symlinks=True, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    remove_tree(home)


async def run_harness(
    spec: HarnessSpec,
    llm: LLMEndpoint,
    row: dict[str, Any],
    config: GatewayConfig,
    resources: dict[str, Any],
) -> dict[str, Any]:
    """One sample: the CLI on the row's task, then the check. Returns the reward dict
    (``reward`` is the check's score); raises ``AgentFailed`` when the CLI failed, passed its
    limit or the check could not give a verdict, with the check's outcome in the message.
    ``resources``: the worker's shared objects (``AgentLoopContext.resources``), where the
    workspace pool is kept."""
    if "prompt" not in row and "raw_prompt" in row:  # the loop's row has the chat as raw_prompt
        row = {**row, "prompt": row["raw_prompt"]}
    task = task_of_row(row, 0, spec.workspace_dir)
    if task is None:
        raise AgentFailed(
            "the row has no workspace task (workspace/check or extra_info.workspace_task)"
        )
    folder = session_log_dir(config, llm.session_id)
    pool = _pool(spec, resources)
    async with pool.sample(task) as ws:
        try:
            result = await _run_in(ws, spec, llm, _prompt(row, task.problem), folder)
            failure = _failure(spec, result)
            seconds = result.seconds
        except OSError as e:
            failure, seconds = f"the harness {spec.name!r} could not start: {e}", 0.0
        check = await ws.check()
    outcome = {
        **check.as_reward(),
        "reward": check.score,
        "harness": spec.name,
        "harness_s": seconds,
        "harness_error": failure,
        "prepare_s": ws.prepare_s,
        "log_dir": str(folder),
    }
    logger.info("harness %s: %s, check %s", spec.name, failure or "exited 0", check.score)
    if failure is not None:
        raise AgentFailed(f"{failure}; the check then scored {check.score:g}")
    if check.reason is not None:
        raise AgentFailed(f"the workspace {check.reason}; reward 0")
    return outcome

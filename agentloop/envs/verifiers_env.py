"""Prime Intellect ``verifiers`` environments, reached through their own interpreter.

A verifiers environment is a Python package with ``load_environment(**kwargs)`` (the classic
API of ``verifiers`` 0.3: ``SingleTurnEnv``, ``ToolEnv``, ``MultiTurnEnv``, a ``Rubric`` of
named reward functions). verifiers pins ``mcp<2`` and cannot share this stack's interpreter, so
its environments live in their own venv (``make verifiers`` makes ``.venv-verifiers``) and run
there as ``agentloop/envs/verifiers_runner.py``, a script that imports nothing of ours:

- ``check``: the environment loads (else exit 3: not installed);
- ``dataset``: the environment's own rows as our JSONL rows (``trainer.data.env_rows``);
- ``serve``: a long-lived process per worker (``VerifiersRunner``) taking rollouts as JSON lines:
  each the environment's own rollout against a session gateway's OpenAI endpoint, scored by its
  rubric (``VerifiersResult``); environments are loaded once, not per sample (a process start
  costs seconds of imports);
- ``rollout``: the same for one sample in a process of its own (by hand, for debugging);
- ``score``: the rubric's score of a given completion (its own evaluation, for comparison).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PYTHON_ENV",
    "RUNNER",
    "VerifiersNotInstalled",
    "VerifiersResult",
    "VerifiersRunner",
    "VerifiersSpec",
    "check_installed",
    "runner_argv",
    "verifiers_python",
]

PYTHON_ENV = "AGENTLOOP_VERIFIERS_PYTHON"
"""Overrides the interpreter verifiers environments run in (default ``.venv-verifiers``)."""
RUNNER = Path(__file__).with_name("verifiers_runner.py")
_NOT_INSTALLED = 3  # the runner's exit code for an environment it cannot import


class VerifiersNotInstalled(ValueError):
    """The environment (or verifiers itself) is not installed where it would run."""


def verifiers_python(given: str | None = None) -> str:
    """The interpreter of verifiers environments: ``given``, ``$AGENTLOOP_VERIFIERS_PYTHON``,
    the repo's ``.venv-verifiers`` (``make verifiers``), else this interpreter."""
    if given:
        return given
    if os.environ.get(PYTHON_ENV):
        return os.environ[PYTHON_ENV]
    venv = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def runner_argv(python: str, mode: str, *args: str) -> list[str]:
    return [python, str(RUNNER), mode, *args]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiersSpec:
    """Which environment a sample runs: ``verifiers: <env id>`` or a mapping with these keys
    (on an agent-loop entry, or in a row's ``verifiers`` field)."""

    env_id: str
    """The environment's id as ``verifiers.load_environment`` takes it (``vf-calc``)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of its ``load_environment``."""
    python: str | None = None
    """Its interpreter (default ``verifiers_python()``)."""
    paths: tuple[str, ...] = ()
    """Folders put first on its ``PYTHONPATH`` (an environment not installed as a package)."""

    @classmethod
    def of(cls, value: str | dict[str, Any], where: str) -> VerifiersSpec:
        if isinstance(value, str):
            return cls(env_id=value)
        if not isinstance(value, dict) or not isinstance(value.get("env_id"), str):
            raise ValueError(
                f"{where}: verifiers takes an environment id or a mapping with env_id "
                f"(and env_args, python, paths); got {value!r}"
            )
        unknown = set(value) - {"env_id", "env_args", "python", "paths", "example"}
        if unknown:
            raise ValueError(f"{where}: unknown verifiers keys {sorted(unknown)}")
        args = value.get("env_args") or {}
        if not isinstance(args, dict):
            raise ValueError(f"{where}: verifiers.env_args must be a mapping, got {args!r}")
        paths = value.get("paths") or ()
        return cls(
            env_id=value["env_id"],
            env_args=dict(args),
            python=value.get("python"),
            paths=(paths,) if isinstance(paths, str) else tuple(paths),
        )

    @property
    def interpreter(self) -> str:
        return verifiers_python(self.python)

    def child_env(self) -> dict[str, str]:
        """The environment variables its processes get (besides the session's)."""
        env = {
            "AGENTLOOP_VERIFIERS": json.dumps({"env_id": self.env_id, "env_args": self.env_args})
        }
        if self.paths:
            extra = [str(Path(p).expanduser().resolve()) for p in self.paths]
            env["PYTHONPATH"] = os.pathsep.join([*extra, os.environ.get("PYTHONPATH", "")])
        return env

    def as_row_field(self) -> dict[str, Any]:
        row: dict[str, Any] = {"env_id": self.env_id, "env_args": self.env_args}
        if self.python:
            row["python"] = self.python
        if self.paths:
            row["paths"] = list(self.paths)
        return row

    def run(self, mode: str, *args: str, timeout_s: float = 600) -> str:
        """Run the runner in ``mode`` (``check``, ``dataset``, ``score``) on this environment
        to its end (a blocking call: start-up and data only), ``args`` after its id and
        arguments; returns its stdout. Not installed -> ``VerifiersNotInstalled``; another
        failure -> RuntimeError with the tail of its stderr."""
        python = self.interpreter
        if not Path(python).exists() and not _on_path(python):
            raise VerifiersNotInstalled(
                f"verifiers environment {self.env_id!r}: its interpreter {python} does not "
                "exist: run `make verifiers` (or set AGENTLOOP_VERIFIERS_PYTHON)"
            )
        proc = subprocess.run(
            runner_argv(
                python,
                mode,
                "--env-id",
                self.env_id,
                "--env-args",
                json.dumps(self.env_args),
                *args,
            ),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **self.child_env()},
        )
        if proc.returncode == _NOT_INSTALLED:
            raise VerifiersNotInstalled(
                f"verifiers environment {self.env_id!r} is not installed in {python}: "
                f"install it with `{python} -m pip install {self.env_id}` (or "
                f"`prime env install {self.env_id}` from the Environments Hub, in that "
                f"interpreter); the runner said: {proc.stderr.strip().splitlines()[-1:]}"
            )
        if proc.returncode != 0:
            raise RuntimeError(
                f"verifiers environment {self.env_id!r}: `{mode}` exited with "
                f"{proc.returncode}:\n{proc.stderr[-2000:]}"
            )
        return proc.stdout


def _on_path(python: str) -> bool:
    return shutil.which(python) is not None


_checked: set[tuple[str, str, tuple[str, ...]]] = set()


def check_installed(spec: VerifiersSpec) -> None:
    """Start-up check that the environment loads (once per interpreter and id)."""
    key = (spec.interpreter, spec.env_id, spec.paths)
    if key not in _checked:
        spec.run("check")
        _checked.add(key)


@dataclass(frozen=True, slots=True)
class VerifiersResult:
    """What one ``rollout`` of the runner wrote."""

    reward: float
    """The rubric's reward: its named functions' scores, weighted as the rubric sets."""
    scores: dict[str, float]
    """Each named reward function's score (unweighted)."""
    weights: dict[str, float]
    state: dict[str, float]
    """The environment's state, numbers only (turns, tool calls, ...)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> VerifiersResult:
        state = {
            k: float(v)
            for k, v in (data.get("state") or {}).items()
            if isinstance(v, (int, float))  # bools count as 0/1
        }
        return cls(
            float(data["reward"]),
            {k: float(v) for k, v in (data.get("scores") or {}).items()},
            {k: float(v) for k, v in (data.get("weights") or {}).items()},
            state,
        )


class VerifiersRunner:
    """One worker's long-lived runner (``verifiers_runner.py serve``) for one interpreter and
    path list: rollouts are sent as JSON lines and answered by id, concurrently. A runner that
    exits fails the rollouts it was running (with the end of its log) and is started again by
    the next one; ``close`` ends it."""

    def __init__(self, spec: VerifiersSpec) -> None:
        self.spec = spec
        self.log = Path(tempfile.mkdtemp(prefix="verifiers-runner-")) / "runner.log"
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.starts = 0

    async def _ensure(self) -> asyncio.subprocess.Process:
        async with self._lock:
            if self._proc is None or self._proc.returncode is not None:
                with self.log.open("ab") as log:
                    self._proc = await asyncio.create_subprocess_exec(
                        *runner_argv(self.spec.interpreter, "serve"),
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=log,
                        env={**os.environ, **self.spec.child_env()},
                        limit=1 << 26,  # a result line holds the whole completion
                        start_new_session=True,
                    )
                self.starts += 1
                self._reader = asyncio.create_task(self._read(self._proc))
            return self._proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            message = json.loads(line)
            future = self._pending.pop(str(message.get("id")), None)
            if future is not None and not future.done():
                future.set_result(message)
        code = await proc.wait()
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(
                    RuntimeError(f"the verifiers runner exited with {code}; its log:\n{tail}")
                )
        self._pending.clear()

    @staticmethod
    def key(spec: VerifiersSpec) -> str:
        """Samples whose specs have equal keys share a runner (environments of one venv)."""
        return f"verifiers:{spec.interpreter}:{os.pathsep.join(spec.paths)}"

    async def rollout(
        self, spec: VerifiersSpec, row: dict[str, Any], base_url: str, api_key: str, model: str
    ) -> dict[str, Any]:
        """The result JSON of one rollout of ``row`` (its ``verifiers.example``) in ``spec``'s
        environment (loaded once by the runner); raises
        ``VerifiersNotInstalled`` or RuntimeError (with the runner's traceback)."""
        proc = await self._ensure()
        assert proc.stdin is not None
        rid = uuid.uuid4().hex
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        request = {
            "id": rid,
            "env_id": spec.env_id,
            "env_args": spec.env_args,
            "row": row,
            "base_url": base_url,
            "api_key": api_key,
            "model": model,
        }
        try:
            proc.stdin.write((json.dumps(request, default=str) + "\n").encode())
            await proc.stdin.drain()
            message = await future
        finally:
            self._pending.pop(rid, None)
        if message.get("not_installed"):
            raise VerifiersNotInstalled(message["error"])
        if "error" in message:
            raise RuntimeError(message["error"])
        return dict(message["result"])

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            await self._reader

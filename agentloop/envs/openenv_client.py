"""The ``openenv:`` entry of an OpenEnv loop, and one episode's connection to its server.

OpenEnv servers (``openenv-core``) keep an episode on a WebSocket session at ``/ws``: messages
``{"type": "reset" | "step" | "close", "data": ...}``, answered by ``{"type": "observation",
"data": {"observation": {...}, "reward": r, "done": d}}`` or ``{"type": "error", "data":
{"message", "code", "errors"?}}`` (the session stays usable after an error). Without a client
class the loop speaks this directly (``websockets``; importing ``openenv.core`` costs seconds).
With ``client: pkg.mod:Class`` (the environment's ``EnvClient`` subclass) the episode goes through
that class: its typed action is built from the parsed arguments and its observation is read back
as a dict.
"""

from __future__ import annotations

import asyncio
import json
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from agentloop.envs.openenv_servers import OpenEnvServerError, OpenEnvServers
from servers.user_code import load_object

__all__ = ["EnvConnection", "EnvStep", "OpenEnvSpec", "connect"]

_NOT_SHOWN = frozenset({"reward", "done", "metadata"})


@dataclass(slots=True)
class EnvStep:
    """One answer of the environment: its observation fields (without reward/done), or the
    reason it rejected the action."""

    observation: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    done: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenEnvSpec:
    """An ``openenv:`` entry of the agent-loop YAML."""

    url: str | None = None
    """A running server (``http://host:port``)."""
    command: str | None = None
    """A command that serves the environment on ``{port}`` (started per worker)."""
    servers: int = 1
    """Servers each worker starts with ``command``."""
    client: str | None = None
    """The environment's ``EnvClient`` subclass (``pkg.mod:Class``); None: the wire protocol."""
    action: str = "tool"
    """``tool``: the action schema is offered as one tool; or ``pkg.mod:function`` mapping the
    turn's text to an action dict (None: no action found)."""
    tool_name: str = "act"
    tool_description: str | None = None
    observation_keys: tuple[str, ...] = ()
    """Observation fields shown to the model, in order (empty: all but reward/done/metadata)."""
    max_steps: int = 16
    reset: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of every ``reset`` (a row's ``openenv.reset`` adds to them)."""
    health_timeout_s: float = 60.0
    step_timeout_s: float = 60.0

    @classmethod
    def of(cls, value: Any) -> OpenEnvSpec:
        if not isinstance(value, dict):
            raise ValueError(f"openenv takes a mapping (url or command, ...), got {value!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"openenv: unknown keys {unknown}; known: {sorted(known)}")
        spec = cls(**{**value, "observation_keys": tuple(value.get("observation_keys") or ())})
        if (spec.url is None) == (spec.command is None):
            raise ValueError("openenv takes exactly one of url: http://... or command: '...'")
        if spec.command is not None and "{port}" not in spec.command:
            raise ValueError(f"openenv.command must name its port as {{port}}: {spec.command!r}")
        if spec.servers < 1 or spec.max_steps < 1:
            raise ValueError("openenv.servers and openenv.max_steps must be >= 1")
        if spec.action != "tool":
            load_object(spec.action, key="openenv.action", need_callable=True)
        if spec.client is not None:
            load_object(spec.client, key="openenv.client")
        return spec

    @property
    def key(self) -> str:
        return f"{self.url or self.command}x{self.servers}"

    def servers_pool(self) -> OpenEnvServers:
        return OpenEnvServers(
            url=self.url,
            command=self.command,
            servers=self.servers,
            health_timeout_s=self.health_timeout_s,
        )

    def probe(self) -> None:
        """Start-up check (blocking; not on an event loop): the server answers its health
        check, one command server started and stopped (the error has the end of its log)."""
        pool = OpenEnvServers(
            url=self.url, command=self.command, servers=1, health_timeout_s=self.health_timeout_s
        )

        async def check() -> None:
            try:
                await pool.start()
            finally:
                await pool.close()

        asyncio.run(check())

    def reset_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        given = (
            (row.get("openenv") or {}).get("reset")
            if isinstance(row.get("openenv"), dict)
            else None
        )
        kwargs = {"seed": int(row.get("index", 0)), **self.reset}
        kwargs.update(given or {})
        return kwargs

    def render(self, observation: dict[str, Any]) -> str:
        """The observation as the model reads it."""
        keys = self.observation_keys or tuple(k for k in observation if k not in _NOT_SHOWN)
        values = {k: observation.get(k) for k in keys}
        if len(values) == 1:
            return _text(next(iter(values.values())))
        return "\n".join(f"{k}:{_sep(v)}{_text(v)}" for k, v in values.items())

    async def action_tool(self, url: str) -> dict[str, Any]:
        """The environment's action schema (``GET /schema``) as one tool."""
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as http:
                async with http.get(url + "/schema") as reply:
                    reply.raise_for_status()
                    schema = dict((await reply.json())["action"])
        except (aiohttp.ClientError, KeyError, ValueError) as exc:
            raise OpenEnvServerError(f"no action schema at {url}/schema: {exc}") from exc
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
        params: dict[str, Any] = {"type": "object", "properties": props}
        required = [k for k in schema.get("required") or [] if k != "metadata"]
        if required:
            params["required"] = required
        if "$defs" in schema:
            params["$defs"] = schema["$defs"]
        description = (
            self.tool_description or schema.get("description") or "Act in the environment."
        )
        return {
            "type": "function",
            "function": {"name": self.tool_name, "description": description, "parameters": params},
        }

    def action_of(self, text: str, parsed: Any) -> tuple[dict[str, Any] | None, str | None, str]:
        """(the turn's action, or why it has none usable, and that error's kind); (None,
        None, ""): the turn took no action (tool mode: it called no tool): the episode ends."""
        if self.action == "tool":
            if parsed is None or not parsed.items:
                return None, None, ""
            first = parsed.items[0]
            if hasattr(first, "arguments"):
                return dict(first.arguments), None, ""
            return None, first.message, str(first.kind)
        fn: Callable[[str], Any] = load_object(
            self.action, key="openenv.action", need_callable=True
        )
        try:
            action = fn(text)
        except Exception as exc:  # noqa: BLE001 - the user's parser failing is a bad action
            return (
                None,
                f"no action could be read from the reply: {type(exc).__name__}: {exc}",
                "bad_action",
            )
        if action is None:
            return None, "no action could be read from the reply", "bad_action"
        if not isinstance(action, dict):
            return (
                None,
                f"openenv.action returned {type(action).__name__}, not a dict",
                "bad_action",
            )
        return action, None, ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _sep(value: Any) -> str:
    return "\n" if isinstance(value, str) and "\n" in value else " "


class EnvConnection:
    """One episode's session with a server."""

    def __init__(self, spec: OpenEnvSpec, url: str) -> None:
        self.spec = spec
        self.url = url
        self.session_id = uuid.uuid4().hex
        self._ws: Any = None
        self._client: Any = None
        self._action_cls: Any = None

    async def open(self) -> None:
        if self.spec.client is not None:
            cls = load_object(self.spec.client, key="openenv.client")
            self._client = cls(base_url=self.url, message_timeout_s=self.spec.step_timeout_s)
            self._action_cls = _action_class(cls)
            await self._client.connect()
            return
        import websockets

        ws_url = "ws" + self.url.removeprefix("http") + "/ws"
        self._ws = await websockets.connect(ws_url, open_timeout=self.spec.health_timeout_s)

    async def reset(self, kwargs: dict[str, Any]) -> EnvStep:
        return await self._call("reset", kwargs)

    async def step(self, action: dict[str, Any]) -> EnvStep:
        return await self._call("step", action)

    async def _call(self, kind: Literal["reset", "step"], data: dict[str, Any]) -> EnvStep:
        if self._client is not None:
            return await self._client_call(kind, data)
        await self._ws.send(json.dumps({"type": kind, "data": data}))
        reply = json.loads(await asyncio.wait_for(self._ws.recv(), self.spec.step_timeout_s))
        body = reply.get("data") or {}
        if reply.get("type") == "error":
            return EnvStep(error=_error_text(body))
        return EnvStep(body.get("observation") or {}, body.get("reward"), bool(body.get("done")))

    async def _client_call(self, kind: str, data: dict[str, Any]) -> EnvStep:
        try:
            if kind == "reset":
                result = await self._client.reset(**data)
            else:
                action = data
                if self._action_cls is not None:
                    action = self._action_cls.model_validate(data)
                result = await self._client.step(action)
        except ValueError as exc:  # pydantic's ValidationError: the action's schema
            return EnvStep(error=str(exc))
        except RuntimeError as exc:  # EnvClient raises the server's error reply so
            if not str(exc).startswith("Server error"):
                raise
            return EnvStep(error=str(exc).removeprefix("Server error: "))
        obs = result.observation
        fields = obs.model_dump() if hasattr(obs, "model_dump") else dict(obs or {})
        fields = {k: v for k, v in fields.items() if k not in _NOT_SHOWN}
        return EnvStep(fields, result.reward, bool(result.done))

    async def close(self) -> None:
        try:
            if self._client is not None:
                await self._client.close()
            elif self._ws is not None:
                await self._ws.send(json.dumps({"type": "close"}))
                await self._ws.close()
        except Exception:  # noqa: BLE001 - a dead server's session is already gone
            pass


async def connect(spec: OpenEnvSpec, url: str) -> EnvConnection:
    conn = EnvConnection(spec, url)
    await conn.open()
    return conn


def _error_text(body: dict[str, Any]) -> str:
    message = str(body.get("message") or "error")
    details = [
        f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}"
        for e in body.get("errors") or []
        if isinstance(e, dict)
    ]
    code = f" ({body['code']})" if body.get("code") else ""
    return message + code + (": " + "; ".join(details) if details else "")


def _action_class(client_cls: type) -> Any:
    """The action type of an ``EnvClient[Act, Obs, State]`` subclass (None if not typed)."""
    for base in getattr(client_cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and hasattr(args[0], "model_validate"):
            return args[0]
    return None

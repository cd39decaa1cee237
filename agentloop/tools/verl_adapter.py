"""Tool classes written against verl's tool API, run unchanged behind our ``BaseTool``.

verl is never imported to recognize one: a class qualifies by its shape (duck typing):
``__init__(config, tool_schema)``, ``create``, ``execute``, ``calc_reward``, ``release`` and
``get_openai_tool_schema``. How each call is bridged:

- ``tool_schema``: verl hands tools a pydantic ``OpenAIFunctionToolSchema``; we pass verl's own
  class when verl is importable, else a ``SchemaView`` with the same attribute access
  (``schema.function.name``) and ``model_dump()``. With no ``tool_schema`` in the YAML the
  class's ``get_openai_tool_schema()`` supplies it.
- ``create(instance_id, **create_kwargs)``, as verl's older rollout called it; when the method
  takes ``**kwargs`` (or a ``create_kwargs`` parameter) the same mapping also goes as
  ``create_kwargs=``, as verl's current agent loop passes it. It may return the instance id
  (older verl) or ``(instance_id, ToolResponse)`` (newer; the response is not shown).
- ``execute(instance_id, parameters)``: ``parameters`` is the arguments dict, as verl's current
  loop passes them, unless the method annotates it ``str`` (older verl tools ``json.loads``
  it): then a JSON string. It may return ``(text, reward, metrics)`` or ``(ToolResponse,
  reward, metrics)``; the text is the tool message, the reward the call's step reward
  (``ToolCallRecord.reward``, the process reward), the metrics the call's tool metrics.
- ``execute`` also gets ``agent_data=`` (an ``AgentData``: the sample's ``request_id``,
  ``messages`` so far, ``tools_kwargs``, ``extra_fields`` that persist across the sample's
  calls, ``tool_rewards`` and turn counts, verl's attribute names) and the row's
  ``tools_kwargs.<tool>.execute_kwargs`` as keywords, each only where the method takes it
  (``**kwargs`` takes all).
- ``calc_reward`` when the sample ends; ``release`` exactly once per created instance, also
  when ``create`` returned something that is no instance id (the id it was given is released).
- ``create``, ``execute``, ``calc_reward`` and ``release`` must be ``async def``, as in verl: a
  plain ``def`` would run on the agent-loop worker's event loop, blocking every sample, where
  no call timeout can interrupt it, so such a class is refused at load time.
- verl's per-tool config keys become our runner's limits (``verl_limits``); the class gets its
  ``config`` untouched.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop.tools.base import BaseTool, ToolResult, normalize_schema

__all__ = [
    "AgentData",
    "SchemaView",
    "VerlTool",
    "missing_verl_api",
    "verl_limits",
    "verl_tool",
]

logger = logging.getLogger(__name__)

_METHODS = ("create", "execute", "calc_reward", "release", "get_openai_tool_schema")
_ASYNC_METHODS = ("create", "execute", "calc_reward", "release")
VERL_API = (
    "__init__(config, tool_schema), async create/execute/calc_reward/release and "
    "get_openai_tool_schema"
)


def missing_verl_api(cls: Any) -> list[str]:
    """What ``cls`` lacks of verl's tool API (empty: it is a verl-style tool class)."""
    if not isinstance(cls, type):
        return ["a class", *_METHODS]
    missing = []
    try:
        inspect.signature(cls).bind(config={}, tool_schema=None)
    except (TypeError, ValueError):
        missing.append("__init__(config, tool_schema)")
    return missing + [m for m in _METHODS if not callable(getattr(cls, m, None))]


class SchemaView(Mapping[str, Any]):
    """A read-only tool schema with pydantic-style attribute access, standing in for verl's
    ``OpenAIFunctionToolSchema`` where verl is not installed: ``schema.function.name``,
    ``schema["function"]``, ``schema.model_dump()``. An absent field reads as None, as an
    unset optional pydantic field does."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return _view(self._data.get(key))

    def __getitem__(self, key: str) -> Any:
        return _view(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"SchemaView({self._data!r})"

    def model_dump(self, *, exclude_none: bool = False, **_: Any) -> dict[str, Any]:
        """A plain copy (pydantic's other options change nothing here)."""
        return _plain(self._data, exclude_none)


def _view(value: Any) -> Any:
    return SchemaView(value) if isinstance(value, Mapping) else value


def _plain(value: Any, exclude_none: bool) -> Any:
    if isinstance(value, Mapping):
        return {
            k: _plain(v, exclude_none) for k, v in value.items() if not (exclude_none and v is None)
        }
    if isinstance(value, list):
        return [_plain(v, exclude_none) for v in value]
    return value


def _schema_object(schema: dict[str, Any], where: str) -> Any:
    """verl's pydantic schema when verl is installed (tools may type-check it), else a view."""
    if importlib.util.find_spec("verl") is None:
        return SchemaView(schema)
    from verl.tools.schemas import OpenAIFunctionToolSchema

    try:
        return OpenAIFunctionToolSchema.model_validate(schema)
    except ValueError as exc:  # pydantic's ValidationError
        raise ValueError(
            f"{where}: tool_schema does not fit verl's OpenAIFunctionToolSchema: {exc}"
        ) from exc


def _schema_dict(schema: Any) -> dict[str, Any] | None:
    if schema is None or isinstance(schema, dict):
        return schema
    if callable(getattr(schema, "model_dump", None)):
        return schema.model_dump(exclude_unset=True, exclude_none=True)
    return None


def _positive(config: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = config[key]
    numeric = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric) or value <= 0:
        what = "an integer" if kind is int else "a number of seconds"
        raise ValueError(f"{where}: config.{key} must be {what} > 0, got {value!r}")
    return kind(value)


def verl_limits(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Our runner's keys from verl's per-tool config: ``max_concurrency`` (calls of this tool
    in flight per worker) is ``num_workers`` (verl's execution pool size, one per worker);
    ``job_max_concurrency`` (over the whole job, one limiter shared by every worker) is
    ``rate_limit`` (verl's global limiter, on while ``enable_global_rate_limit``, its default,
    is true); ``call_timeout_s`` is ``timeout``. Keys of ours already in the config win."""
    limits: dict[str, Any] = {}
    flag = config.get("enable_global_rate_limit", True)
    if not isinstance(flag, bool):
        raise ValueError(
            f"{where}: config.enable_global_rate_limit must be true or false, got {flag!r}"
        )
    if config.get("num_workers") is not None and config.get("max_concurrency") is None:
        limits["max_concurrency"] = _positive(config, "num_workers", int, where)
    rate = config.get("rate_limit")
    if rate is not None and flag and config.get("job_max_concurrency") is None:
        limits["job_max_concurrency"] = _positive(config, "rate_limit", int, where)
    if config.get("timeout") is not None and config.get("call_timeout_s") is None:
        limits["call_timeout_s"] = _positive(config, "timeout", float, where)
    return limits


def verl_tool(
    cls: type, config: dict[str, Any], tool_schema: dict[str, Any] | None, where: str
) -> VerlTool:
    """Build the verl-style class ``cls`` as verl's loader does (``cls(config=...,
    tool_schema=...)``, ``config`` untouched) and wrap it; ``where`` prefixes every error."""
    plain = [m for m in _ASYNC_METHODS if not _is_async(getattr(cls, m))]
    if plain:
        names = " and ".join(f"{cls.__qualname__}.{m}" for m in plain)
        are, it = ("is a plain `def`", "it") if len(plain) == 1 else ("are plain `def`s", "them")
        raise ValueError(
            f"{where}: {names} {are}; make {it} `async def`: verl's tool API is async, and a "
            "plain method would run on the agent-loop worker's event loop, blocking every "
            "sample, where no call timeout can interrupt it"
        )
    limits = verl_limits(config, where)
    schema = None
    if tool_schema is not None:
        schema = _schema_object(_normalized(tool_schema, where), where)
    tool = cls(config=dict(config), tool_schema=schema)
    described = _schema_dict(getattr(tool, "tool_schema", None))
    if described is None:
        described = _schema_dict(tool.get_openai_tool_schema())
    if described is None:
        raise ValueError(
            f"{where}: {cls.__qualname__} has no tool schema; add tool_schema to the entry or "
            "return one from its get_openai_tool_schema()"
        )
    return VerlTool(tool, _normalized(described, where), {**config, **limits})


def _normalized(schema: Any, where: str) -> dict[str, Any]:
    try:
        return normalize_schema(schema)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


@dataclass(slots=True)
class AgentData:
    """What a verl tool's ``execute(..., agent_data=...)`` may read of its sample (verl's
    ``AgentData`` names); one per sample, shared by its tools' calls."""

    request_id: str
    tools_kwargs: Mapping[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The chat so far (the loop's own list: later messages appear in it)."""
    extra_fields: dict[str, Any] = field(default_factory=dict)
    """A tool's own session data, kept across the sample's calls."""
    tool_rewards: list[float] = field(default_factory=list)
    """Each earlier call's step reward."""
    assistant_turns: int = 0
    user_turns: int = 0


class VerlTool(BaseTool):
    """A verl-style tool instance behind our ``BaseTool`` (the module docstring says how each
    call is bridged). ``self.tool`` is the wrapped instance; ``config`` holds the tool's
    config plus the runner limits derived from it."""

    def __init__(self, tool: Any, schema: dict[str, Any], config: dict[str, Any]) -> None:
        super().__init__(config, schema)
        self.tool = tool
        self.json_parameters = _annotated_str(tool.execute)
        """``execute`` gets its arguments as a JSON string (it annotates them ``str``)."""
        self._create_kwargs = _takes(tool.create, "create_kwargs")
        self._execute_params = _parameters(tool.execute)
        self._live: set[str] = set()
        self._media_warned = False

    @property
    def _label(self) -> str:
        return type(self.tool).__qualname__

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        kwargs = dict(create_kwargs)
        if self._create_kwargs and "create_kwargs" not in kwargs:
            kwargs["create_kwargs"] = dict(create_kwargs)
        result = await _awaited(self.tool.create(instance_id, **kwargs))
        created = result[0] if isinstance(result, tuple) and result else result
        if not isinstance(created, str) or not created:
            if instance_id is not None:  # it may hold state under the id it was given
                await self._release_after_bad_create(instance_id)
            raise TypeError(
                f"{self._label}.create returned {result!r}; return the instance id or "
                "(instance_id, ToolResponse)"
            )
        self._live.add(created)
        return created

    takes_call_context = True

    async def execute(
        self, instance_id: str, arguments: dict[str, Any], **context: Any
    ) -> ToolResult:
        """``context``: ``agent_data`` and the row's ``execute_kwargs``, each passed on where
        the wrapped ``execute`` takes it."""
        parameters: Any = dict(arguments)
        if self.json_parameters:
            parameters = json.dumps(arguments, ensure_ascii=False)
        takes_all = any(p.kind is p.VAR_KEYWORD for p in self._execute_params)
        named = {p.name for p in self._execute_params}
        kwargs = {k: v for k, v in context.items() if takes_all or k in named}
        result = await _awaited(self.tool.execute(instance_id, parameters, **kwargs))
        if not (isinstance(result, tuple) and len(result) == 3):
            raise TypeError(
                f"{self._label}.execute returned {type(result).__name__}; return a tuple "
                "(text or ToolResponse, reward, metrics)"
            )
        response, reward, metrics = result
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, (int, float))
        ):
            raise TypeError(f"{self._label}.execute returned reward {reward!r}; return a number")
        if metrics is not None and not isinstance(metrics, Mapping):
            raise TypeError(
                f"{self._label}.execute returned metrics {type(metrics).__name__}; return a dict"
            )
        reward = None if reward is None else float(reward)
        return ToolResult(self._text(response), reward, dict(metrics or {}))

    async def calc_reward(self, instance_id: str) -> float:
        return float(await _awaited(self.tool.calc_reward(instance_id)))

    async def release(self, instance_id: str) -> None:
        """Release ``instance_id`` once; a second release of it does nothing."""
        if instance_id not in self._live:
            logger.debug("%s: instance %s is not live; not released again", self.name, instance_id)
            return
        self._live.discard(instance_id)
        await _awaited(self.tool.release(instance_id))

    async def _release_after_bad_create(self, instance_id: str) -> None:
        """Release ``instance_id`` after ``create`` returned no id; a failure is only logged
        (the bad return value is the error reported)."""
        try:
            await _awaited(self.tool.release(instance_id))
        except Exception:
            logger.warning(
                "%s: releasing instance %s after create returned no instance id failed",
                self.name,
                instance_id,
                exc_info=True,
            )

    def _text(self, response: Any) -> str:
        """The tool message of a response: a str, ``ToolResponse``-like (``.text``), or a dict
        with ``text`` (verl's first base class returned one). Images and videos are dropped:
        tool messages here are text."""
        if isinstance(response, str):
            return response
        get = response.get if isinstance(response, Mapping) else None
        if get is None and not hasattr(response, "text"):
            raise TypeError(
                f"{self._label}.execute returned {type(response).__name__} as its response; "
                "return a str or an object with .text"
            )
        text, image, video = (
            (get("text"), get("image"), get("video"))
            if get is not None
            else (response.text, getattr(response, "image", None), getattr(response, "video", None))
        )
        if (image or video) and not self._media_warned:
            self._media_warned = True
            logger.warning(
                "tool %r returned images or videos; tool messages are text, so they are dropped",
                self.name,
            )
        if text is None:
            return ""
        if not isinstance(text, str):
            raise TypeError(
                f"{self._label}.execute returned text of type {type(text).__name__}; return a str"
            )
        return text


async def _awaited(value: Any) -> Any:
    """``value`` awaited when it is awaitable (``verl_tool`` only accepts ``async def``
    methods; a wrapper around one may hand back its coroutine or a plain value)."""
    return await value if inspect.isawaitable(value) else value


def _is_async(method: Any) -> bool:
    """``method`` is an ``async def``, or a decorator's wrapper (``functools.wraps``) of one."""
    return inspect.iscoroutinefunction(method) or inspect.iscoroutinefunction(
        inspect.unwrap(method)
    )


def _parameters(fn: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _annotated_str(execute: Any) -> bool:
    """``execute(instance_id, parameters: str, ...)``: the tool parses the JSON itself."""
    params = _parameters(execute)
    return len(params) >= 2 and params[1].annotation in (str, "str")


def _takes(fn: Any, name: str) -> bool:
    return any(p.kind is p.VAR_KEYWORD or p.name == name for p in _parameters(fn))

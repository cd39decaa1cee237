"""Agent loops: the base class, its output, and the registry rows select with ``agent_name``.

A loop instance runs one sample: ``await loop.run(sampling_params, **row_fields)``. It gets
everything shared through an ``AgentLoopContext`` (the generate client, tokenizer, rollout
config, tools). Built-in loops register with ``@register(name)``; user loops come from a YAML
list ``[{name, _target_, ...kwargs}]`` (``agent.agent_loop_config_path``).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import difflib
import importlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import yaml

from agentloop.config import RolloutConfig
from agentloop.formats import ChatFormat, EndTokens, end_tokens, resolve_format
from agentloop.records import SAMPLE_RECORD_FIELDS, SampleRecord
from agentloop.tokens import (
    Trajectory,
    delta_render_size,
    encode_delta,
    encode_prompt,
    render_size,
)
from agentloop.tools.base import BaseTool
from agentloop.tools.runner import ToolRunner
from agentloop.tools.session import ToolSession
from agentloop.trace import SampleTrace
from servers.types import GenerateRequest, SamplingParams, TokenOutput
from servers.user_code import load_object

__all__ = [
    "AgentLoopBase",
    "AgentLoopContext",
    "AgentLoopOutput",
    "AgentLoopSpec",
    "GenerateClient",
    "PromptTooLongError",
    "get_agent_loop",
    "load_agent_loop_config",
    "register",
    "registered_agent_loops",
]


class PromptTooLongError(ValueError):
    """A prompt over ``rollout.prompt_length``; ``tokens`` and ``limit`` are the counts (the
    gateway answers it as its dialect's context-length error)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(
            f"prompt has {tokens} tokens > rollout.prompt_length={limit}: raise it or filter "
            "long prompts with data.max_prompt_length"
        )
        self.tokens = tokens
        self.limit = limit


class GenerateClient(Protocol):
    """Anything with the token-level generate API (AsyncLLMServerManager, a test script).
    A request's ``session_id`` names the trajectory its turn belongs to (the manager keeps a
    session on one server); engine request ids are the servers' business."""

    async def generate(self, request: GenerateRequest) -> TokenOutput: ...


INLINE_RENDER_CHARS = 2048
"""Chat-template renders (and the tokenization after them) of at most this many characters of
messages and tools run on the event loop: a jinja render holds the GIL, so a thread gains
the loop nothing for one this short (~0.5 ms at most on two CI cores, ~0.3 ms for a turn of
a few hundred) and costs two thread wake-ups; longer ones run in a thread, where the
tokenizer releases the GIL and the interpreter's switch interval lets the loop go on."""


async def _render(size: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on the event loop when ``size`` is small, else in a thread."""
    if size <= INLINE_RENDER_CHARS:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


@dataclass(slots=True)
class AgentLoopOutput:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    """1 where the model sampled the token, 0 for tool/user/template tokens."""
    response_log_probs: list[float]
    """Engine log-prob of each sampled token; 0 where the mask is 0."""
    num_turns: int
    """Conversation turns: the prompt, each model turn and each tool/user turn appended."""
    reward_score: float | None = None
    record: SampleRecord = field(default_factory=SampleRecord)
    """What the trainer reads besides tokens: stop and per-turn finish reasons, turns, tool
    calls, errors and rewards, trace id."""
    extra: dict[str, Any] = field(default_factory=dict)
    """A user loop's own data; agentloop and the trainer never read it."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``generate_s``, ``tool_s``, ``total_s`` of this sample."""
    response_versions: list[int] | None = None
    """Policy version that sampled each token (-1 where the mask is 0); None: not tracked
    (every sampled token counts as the current version)."""
    segments: list[AgentLoopOutput] = field(default_factory=list)
    """Further training samples of the same row (a gateway session's later segments, each
    with its own prompt); ``collate`` pads each as a sample of the row's group (same uid),
    weighted by its ``record.weight``."""


@dataclass(slots=True)
class AgentLoopContext:
    server: GenerateClient
    tokenizer: Any
    config: RolloutConfig
    tools: Mapping[str, BaseTool] = field(default_factory=dict)
    tool_runner: ToolRunner | None = None
    """Shared by every sample of a worker (worker-wide tool concurrency limits)."""
    gateway: Any = None
    """The worker's session gateway (``agentloop.gateway``), started by its first session."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Per-worker objects a loop kind shares across its samples (an OpenEnv loop's
    environment servers, a verifiers runner, a coding CLI's workspace pool), made by its
    first sample; each one's ``close()`` is awaited when the worker closes
    (``AgentLoopWorker.close_workspaces`` -> ``close_resources``)."""
    interactions: Mapping[str, Any] = field(default_factory=dict)
    """Simulated users by name (``multi_turn.interaction_config_path``), one instance per
    worker shared by its samples (verl's ``BaseInteraction`` API; ``agentloop.interactions``)."""

    def __post_init__(self) -> None:
        if self.tool_runner is None:
            mt = self.config.multi_turn
            self.tool_runner = ToolRunner(
                self.tools,
                timeout_s=mt.tool_timeout_s,
                max_concurrency=mt.max_concurrent_tool_calls,
            )

    async def close_resources(self) -> None:
        """Close every shared resource (``resources``), emptied first, so a loop that runs
        after this makes its own again."""
        resources, self.resources = dict(self.resources), {}
        for resource in resources.values():
            await resource.close()


class AgentLoopBase(abc.ABC):
    """One instance per sample. Subclasses implement ``run``; helpers keep trajectories exact
    (``encode_prompt``/``encode_delta`` run in a thread, ``generate`` respects the budget)."""

    offers_tools: ClassVar[bool | None] = None
    """Whether the loop puts the configured tools in front of the model: False for
    ``single_turn_agent`` (start-up warns when tools are configured but rows run it), None
    where a loop does not say (user loops)."""
    talks_to_users: ClassVar[bool] = False
    """Whether the loop runs the row's interaction (simulated user) when interactions are
    configured (``tool_agent``): start-up then checks each row names a configured one."""
    uses_tools_kwargs: ClassVar[bool] = True
    """Whether the row's ``tools_kwargs`` create configured tools (False for gateway agents,
    which bring their own: start-up then does not check the names against the config)."""
    sets_reward: ClassVar[bool] = False
    """Whether every sample's reward comes from the loop itself (an environment that scores
    its episodes: a verifiers rubric, OpenEnv step rewards): start-up then asks no reward
    function for its rows' data sources."""

    runs_in_workspace: bool = True
    """Whether a row with a workspace task runs this loop inside a fresh copy of its
    workspace, the task's check as its reward (``agentloop.workspace.loop_hook``); False for
    a loop that prepares its own (a harness agent)."""

    def __init__(self, context: AgentLoopContext, **kwargs: Any) -> None:
        self.context = context
        self.server = context.server
        self.tokenizer = context.tokenizer
        self.config = context.config
        self.metrics: dict[str, float] = {"generate_s": 0.0, "tool_s": 0.0}
        self.trace: SampleTrace | None = None
        """This sample's trace (set by the worker when it is traced)."""
        self.admitted_ms = time.time_ns() // 1_000_000
        """When the sample started (wall clock, shared by the workers of one machine)."""
        self.turns_done = 0
        self._format: ChatFormat | None = None
        self._ends: EndTokens | None = None
        """Model turns generated so far."""

    def priority(self) -> int:
        """Engine priority of this sample's next turn (lower is scheduled first): its
        admission time in ms, minus the time it spent waiting on tools, minus one second per
        model turn done. The sample admitted earliest and held back most by turns and tools
        (the straggler its batch waits for) goes first; in a batch admitted at once that is
        the one with the most turns and the longest tool chain so far."""
        held_back_ms = 1000.0 * self.metrics.get("tool_s", 0.0) + 1000 * self.turns_done
        return self.admitted_ms - int(held_back_ms)

    @abc.abstractmethod
    async def run(self, sampling_params: dict[str, Any], **row_fields: Any) -> AgentLoopOutput:
        """Roll out one sample; ``row_fields`` are the dataset row (``raw_prompt``, ...)."""

    def tool_session(self, tools_kwargs: Mapping[str, Any] | None = None) -> ToolSession:
        """The start of a sample that offers tools: its tools under a new ``session_id``
        (also what keeps its turns on one server), the configured
        tools on the worker's runner, created with the row's ``tools_kwargs``, every call
        recorded in the sample's trace."""
        return ToolSession(
            self.context.tools,
            self.context.tool_runner,
            self.config.multi_turn,
            session_id=uuid.uuid4().hex,
            tools_kwargs=tools_kwargs,
            trace=self.trace,
        )

    async def encode_prompt(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The only full tokenization of a sample: its prompt with the generation prompt."""
        ids = await _render(
            render_size(messages, tools),
            encode_prompt,
            self.tokenizer,
            messages,
            tools=tools,
            chat_template_kwargs=self.config.chat_template_kwargs,
        )
        if len(ids) > self.config.prompt_length:
            raise PromptTooLongError(len(ids), self.config.prompt_length)
        return ids

    @property
    def chat_format(self) -> ChatFormat:
        """``multi_turn.format``, or the family derived from the chat template."""
        if self._format is None:
            self._format = resolve_format(self.config.multi_turn.format, self.tokenizer)
        return self._format

    @property
    def ends(self) -> EndTokens:
        """The tokens that end a model turn for this model (from the tokenizer)."""
        if self._ends is None:
            self._ends = end_tokens(self.tokenizer, self.chat_format)
        return self._ends

    def turn_closed(self, out: TokenOutput) -> bool:
        """The model ended its turn with an end-of-turn token (not length/abort)."""
        return (
            out.finish_reason == "stop"
            and bool(out.token_ids)
            and (out.token_ids[-1] in self.ends.ids)
        )

    def with_end_tokens(
        self, sampling_params: SamplingParams | Mapping[str, Any]
    ) -> SamplingParams:
        """``sampling_params`` with the format's end ids in ``stop_token_ids``, so the engine
        stops on every one (gpt-oss ``<|call|>``, GLM ``<|observation|>``) even where the
        model's generation config lists only its eos."""
        params = SamplingParams.from_dict(sampling_params)
        stops = list(params.stop_token_ids or [])
        extra = sorted(i for i in self.ends.ids if i not in stops)
        if not extra:
            return params
        return dataclasses.replace(params, stop_token_ids=stops + extra)

    async def encode_delta(
        self,
        messages: Sequence[dict[str, Any]],
        new_messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        head: int | None = None,
        sampled_end: int | None = None,
    ) -> list[int]:
        """Template ids for ``new_messages``. ``head``: messages of the prompt (only they,
        the last message and the new ones are rendered, unless ``multi_turn.delta_check``
        is ``full``); ``sampled_end``: the end token id the model's last turn ended with."""
        ends = self.ends
        check = self.config.multi_turn.delta_check == "full"
        end_text = (
            self.tokenizer.convert_ids_to_tokens(sampled_end) if sampled_end is not None else None
        )
        return await _render(
            delta_render_size(messages, new_messages, tools, head=head, check=check),
            encode_delta,
            self.tokenizer,
            messages,
            new_messages,
            tools,
            eot_token=ends.boundaries,
            opens_next=ends.opens_next,
            sampled_end=end_text,
            head=head,
            check=check,
            history_rewrite=self.chat_format.history_rewrite,
            chat_template_kwargs=self.config.chat_template_kwargs,
        )

    async def generate(
        self,
        session_id: str,
        traj: Trajectory,
        sampling_params: SamplingParams | Mapping[str, Any],
    ) -> TokenOutput:
        """One model turn of session ``session_id`` appended to ``traj`` (``max_tokens``
        capped by the budget left); ``sampling_params``: the struct or a sampling dict."""
        context = traj.context_ids()
        room = min(traj.room, self.config.context_length - len(context))
        if room <= 0:  # the engine's context is full: nothing more can be sampled
            return TokenOutput([], [], "length")
        params = SamplingParams.from_dict(sampling_params)
        budget = min(params.max_tokens if params.max_tokens is not None else room, room)
        params = dataclasses.replace(params, max_tokens=budget)
        start = time.perf_counter()
        start_ns = time.time_ns() if self.trace is not None else 0
        request = GenerateRequest(
            prompt_ids=context,
            sampling_params=params,
            session_id=session_id,
            priority=self.priority(),
        )
        out = await self.server.generate(request)
        self.turns_done += 1
        self.metrics["generate_s"] += time.perf_counter() - start
        if self.trace is not None:
            server_for = getattr(self.server, "server_for", None)
            self.trace.generate(
                start_ns, context, out, server_for(session_id) if server_for else None
            )
        if len(out.token_ids) > budget:  # never trust a backend with the budget
            n = budget
            logp = out.log_probs[:n] if out.log_probs is not None else None
            versions = out.versions[:n] if out.versions is not None else None
            out = TokenOutput(out.token_ids[:n], logp, "length", versions)
        traj.add_sampled(out.token_ids, out.log_probs, out.versions)
        return out

    def output(
        self,
        traj: Trajectory,
        num_turns: int,
        *,
        record: SampleRecord | None = None,
        **extra: Any,
    ) -> AgentLoopOutput:
        """The sample's output. ``record`` holds what the trainer reads (a misspelt field
        raises ``TypeError`` where it is built). ``extra`` is the loop's own data: a key that
        names a ``SampleRecord`` field goes into the record instead (``stop_reason="done"``
        works without building one), and a key that looks like a misspelt field raises
        ``TypeError`` rather than being kept where nothing reads it."""
        fields = {k: extra.pop(k) for k in list(extra) if k in SAMPLE_RECORD_FIELDS}
        if fields and record is not None:
            raise TypeError(
                f"output() got record= and {', '.join(sorted(fields))}: set them on the record"
            )
        for key in extra:
            close = difflib.get_close_matches(key, SAMPLE_RECORD_FIELDS, n=1, cutoff=0.8)
            if close:
                raise TypeError(
                    f"output() got {key!r}, close to the SampleRecord field {close[0]!r}: "
                    "fix the name, or give the loop's own data a name unlike the fields"
                )
        return AgentLoopOutput(
            prompt_ids=traj.prompt_ids,
            response_ids=traj.response_ids,
            response_mask=traj.response_mask,
            response_log_probs=traj.response_log_probs,
            num_turns=num_turns,
            record=record if record is not None else SampleRecord(**fields),
            extra=extra,
            metrics=dict(self.metrics),
            response_versions=traj.response_versions,
        )


# ---- registry ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AgentLoopSpec:
    name: str
    cls: type[AgentLoopBase]
    kwargs: dict[str, Any]


_REGISTRY: dict[str, AgentLoopSpec] = {}
# Built-in loops whose module is imported on first use (LangGraph is a heavy import).
_LAZY: dict[str, str] = {
    "react_agent": "agentloop.langgraph.react_agent",
    "verifiers": "agentloop.envs.verifiers_loop",
}


def register(name: str):
    """Class decorator: rows with ``agent_name: name`` run this loop."""

    def wrap(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _REGISTRY[name] = AgentLoopSpec(name, cls, {})
        return cls

    return wrap


def registered_agent_loops() -> list[str]:
    return sorted({*_REGISTRY, *_LAZY})


def get_agent_loop(name: str) -> AgentLoopSpec:
    if name not in _REGISTRY and name in _LAZY:
        importlib.import_module(_LAZY[name])  # registers it
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(
            f"agent_name {name!r} is not a registered agent loop; registered: "
            f"{', '.join(registered_agent_loops())} (add yours to "
            "actor_rollout_ref.rollout.agent.agent_loop_config_path)"
        )
    return spec


def load_agent_loop_config(path: str | Path, *, probe: bool = False) -> list[str]:
    """Register the loops of a YAML list ``[{name, _target_, ...kwargs}]``; returns names.
    Each entry is checked (its class's ``check_config(**kwargs)``); with ``probe`` (the
    driver, once per run) also against what it reaches (``probe(**kwargs)``: an environment
    installed, a server answering)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"agent.agent_loop_config_path {str(path)!r} does not exist")
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a YAML list of {{name, _target_, ...kwargs}}")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"{path}: entry {i} needs 'name' and '_target_'")
        kwargs = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        cls = load_object(entry["_target_"], key=f"{path}: agent loop {entry['name']!r}: _target_")
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ValueError(
                f"{path}: agent loop {entry['name']!r}: {entry['_target_']} is not an "
                "AgentLoopBase subclass"
            )
        checks = [getattr(cls, "check_config", None)]  # e.g. a harness CLI not installed
        if probe:
            checks.append(getattr(cls, "probe", None))
        for check in checks:
            if check is None:
                continue
            try:
                check(**kwargs)
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"{path}: agent loop {entry['name']!r}: {e}") from e
        _REGISTRY[entry["name"]] = AgentLoopSpec(entry["name"], cls, kwargs)
        names.append(entry["name"])
    return names

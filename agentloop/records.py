"""Typed records of what a sample did, the contract between agent loops and the trainer.

An agent loop returns its tokens plus one ``SampleRecord`` (stop and finish reasons, turns,
tool calls with their outcomes, tool rewards, trace id); ``RolloutBatch`` carries one per
sample. Named fields instead of dict keys: a misspelt field raises ``TypeError`` where the
record is built instead of reading back as an empty default. Reward functions keep the verl
contract and see plain dicts (``dataclasses.asdict`` of these, built in ``trainer/rewards``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args

from agentloop.parsers import ErrorKind

__all__ = [
    "MALFORMED_CALL_KINDS",
    "SAMPLE_RECORD_FIELDS",
    "InteractionRecord",
    "SampleRecord",
    "ToolCallRecord",
]

MALFORMED_CALL_KINDS = frozenset(get_args(ErrorKind))
"""Error kinds of calls the model wrote wrongly (they never ran); every other kind is a call
that ran, or tried to start, and failed."""


@dataclass(slots=True, kw_only=True)
class ToolCallRecord:
    """One tool call that ran, or failed to start (calls that never ran, such as unparsable
    ones, only count in ``SampleRecord.tool_error_kinds``)."""

    name: str
    """The tool's name."""
    arguments: dict[str, Any]
    """The parsed arguments the tool was called with."""
    ok: bool
    """The tool returned a result (False: it raised, timed out or could not start)."""
    seconds: float
    """Wall time of the call."""
    repaired: bool
    """The call's JSON only parsed after repair (trailing comma, single quotes, ...)."""
    reward: float | None
    """The tool's step reward for this call; None when the tool gives none."""
    turn: int
    """The model turn (0-based) that made the call; with ``SampleRecord.turn_ends`` it places
    the call's process reward on that turn's last token."""
    state_key: str | None = None
    """The state the call left, as the tool named it (``ToolResult.state_key``): the anchor
    key of the next model turn for GiGPO. None: none named."""


@dataclass(slots=True, kw_only=True)
class InteractionRecord:
    """What a sample's interaction (simulated user, ``agentloop.interactions``) did."""

    name: str
    """The interaction the row picked (``extra_info.interaction_kwargs.name``)."""
    turn_scores: list[float | None] = field(default_factory=list)
    """Each ``generate_response``'s turn score, in order (None where it gave none)."""
    final_score: float | None = None
    """``calculate_score`` at the end of the sample (None: none, or the sample failed)."""
    terminated: bool = False
    """The interaction ended the episode (``should_terminate``)."""
    seconds: float = 0.0
    """Wall time spent in the interaction's calls (a model-backed user's generation too)."""
    error: str | None = None
    """Why a call failed (raised, timed out, returned something malformed); None: none did."""


@dataclass(slots=True, kw_only=True)
class SampleRecord:
    """What the trainer reads of one sample besides its tokens. Every field has a default, so a
    user loop sets only what it knows."""

    stop_reason: str | None = None
    """Why the loop stopped: a finish reason (``stop``, ``length``, ``abort``), or
    ``stop_token``, ``no_tool_call``, ``max_assistant_turns``, ``max_user_turns``,
    ``interaction_done`` (the simulated user ended it), ``interaction_error``, ... ;
    None when the loop does not say."""
    finish_reasons: list[str] | None = None
    """The engine's finish reason of each model turn; None when the loop does not say."""
    turn_ends: list[int] = field(default_factory=list)
    """Each model turn's last response index (where per-turn process rewards land)."""
    assistant_turns: int = 0
    """Model turns sampled."""
    user_turns: int = 0
    """Tool/user turns appended."""
    tool_calls: int = 0
    """Tool calls that succeeded."""
    tool_errors: int = 0
    """Tool calls that failed or never ran (``len(tool_error_kinds)``)."""
    tool_error_kinds: list[str] = field(default_factory=list)
    """The kind of each tool error, in order (``bad_json``, ``unknown_tool``, ``schema``,
    ``too_many_calls``, ``tool_failed``, ``tool_timeout``, ``tool_infra``, ...)."""
    calls: list[ToolCallRecord] = field(default_factory=list)
    """Every call that ran (or failed to start), in order."""
    tool_rewards: dict[str, float] = field(default_factory=dict)
    """Each used tool's ``calc_reward`` at the end of the sample, by tool name."""
    reward_parts: dict[str, float] = field(default_factory=dict)
    """The environment's own named reward functions' scores (unweighted; a verifiers
    rubric's), when the loop's reward is their weighted sum; logged as
    ``reward/env/<name>``."""
    turn_scores: list[float] = field(default_factory=list)
    """A score of each model turn, in order (e.g. a simulated user's): turn-level rewards
    placed on the last token of their turn (``turn_ends``); empty: none."""
    turn_states: list[str | None] = field(default_factory=list)
    """Each model turn's state as the environment named it, in order: a simulated user's
    reply ``metadata["state_key"]`` names the next turn's, the gateway's ``POST
    /sessions/{sid}/state`` the next call's. GiGPO's anchor keys (a tool call's
    ``state_key`` otherwise, else a hash of the observation); empty or None: none named."""
    interaction: InteractionRecord | None = None
    """The sample's simulated-user conversation (None: the row had none)."""
    trace_id: str | None = None
    """The sample's MLflow trace id, when it was traced (set by the worker)."""
    weight: float = 1.0
    """The sample's weight in its group's advantage statistics and in the policy loss: 1 for
    a loop's one sample; 1/k for each of a gateway session's k segments (the session weighs
    one sample), 1 each with ``gateway.segment_weight=segment``; 0 for a failed session that
    ``gateway.on_agent_error=drop`` leaves out."""
    session_id: str | None = None
    """The gateway session this sample is a segment of (None outside the gateway)."""
    segment: int = 0
    """This segment's index in its session (0: the first)."""
    branch_reason: str | None = None
    """Why this segment started a new sample instead of extending an earlier one (the
    gateway's segment rule: history edited, system prompt changed, fresh context, ...)."""
    branch_point: int | None = None
    """Messages this segment shares with the earlier segment it branched from."""
    role: str | None = None
    """The part this sample played (a planner, an executor): the group estimators compare it
    only with samples of its prompt and role. Set by the agent, by the gateway from the
    request's ``model`` (``gateway.role_from_model``), or else the row's ``role`` key; None:
    one role."""
    error: str | None = None
    """Why the sample failed (a gateway agent's or harness's error, then the workspace check's
    verdict), when it did; None otherwise."""

    # What happened to the calls the model wrote: attempted = succeeded + malformed + failed.
    @property
    def calls_attempted(self) -> int:
        """Tool calls the model wrote, well-formed or not."""
        return self.tool_calls + self.tool_errors

    @property
    def calls_malformed(self) -> int:
        """Calls that never ran: bad JSON, no name, unknown tool, schema, over the limit."""
        return sum(kind in MALFORMED_CALL_KINDS for kind in self.tool_error_kinds)

    @property
    def calls_failed(self) -> int:
        """Well-formed calls whose tool raised, timed out or could not start."""
        return self.tool_errors - self.calls_malformed


SAMPLE_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(SampleRecord))
"""The names a ``SampleRecord`` takes."""

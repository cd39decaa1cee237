"""Interactions: a simulated user (rules, a script, or a model) that answers each model turn
that calls no tool, can end the episode, and scores turns.

The contract is verl's ``BaseInteraction`` (``verl/interactions/base.py``), so classes written
for verl run here unchanged and verl is never imported to recognize one: any object with a
``generate_response`` method qualifies (duck typing). ``Interaction`` below is the same contract
as a base class for people who do not come from verl.

Per sample, with ``instance_id`` the sample's session id and ``kwargs`` the row's
``extra_info.interaction_kwargs`` (``name`` included, as verl passes them):

- ``start_interaction(instance_id, **kwargs)`` once, before the first model turn;
- ``generate_response(instance_id, messages, **kwargs) -> (should_terminate, text, turn_score,
  metadata)`` after every model turn that calls no tool; ``messages`` is the chat so far (the
  model's last turn included); ``text`` becomes the next user message, appended as a
  chat-template delta under loss mask 0 unless ``should_terminate`` ends the episode;
  ``turn_score`` (a number, or None) is the score of the model turn it answered;
- ``calculate_score(instance_id)`` once when the sample ends: the final score, offered to the
  reward function as ``extra_info["interaction"]["final_score"]``;
- ``finalize_interaction(instance_id)`` exactly once, on every path (verl's loop never calls
  it; its classes free per-instance state there).

Methods may be ``async def`` (verl's) or plain ``def`` (run in a thread, so a slow one never
blocks the other samples). ``calculate_score`` and ``finalize_interaction`` get the instance id
only where they take a positional parameter or ``**kwargs`` (verl's base class takes none).
"""

from __future__ import annotations

import math
import numbers
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Interaction", "InteractionError", "UserReply", "check_reply"]


class InteractionError(RuntimeError):
    """An interaction call raised, ran past ``multi_turn.interaction_timeout_s`` or returned
    something malformed: the sample fails (recorded), the rest of the batch goes on."""


@dataclass(slots=True, frozen=True)
class UserReply:
    """One checked ``generate_response`` result."""

    terminate: bool
    text: str
    score: float | None
    metadata: dict[str, Any] = field(default_factory=dict)


class Interaction:
    """Base class of a simulated user (verl's ``BaseInteraction`` contract; see the module
    doc). Constructed once per agent-loop worker as ``cls(config)`` with the YAML entry's
    ``config`` plus its ``name``; keep per-sample state keyed by ``instance_id``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id if instance_id is not None else str(uuid.uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement generate_response")

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float | None:
        return None

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


def check_reply(value: Any, name: str) -> UserReply:
    """``generate_response``'s result checked: a 4-tuple (or list) of a bool, a string, a
    finite number or None, and a dict (or None). Raises ``InteractionError`` saying what came
    back instead."""
    shape = "(should_terminate: bool, text: str, turn_score: float | None, metadata: dict)"
    if not isinstance(value, (tuple, list)) or len(value) != 4:
        raise InteractionError(
            f"interaction {name!r}: generate_response returned {_short(value)}; it must return "
            f"{shape}"
        )
    terminate, text, score, metadata = value
    problem = None
    if not isinstance(terminate, (bool, numbers.Integral)):
        problem = f"should_terminate={_short(terminate)} is not a bool"
    elif not isinstance(text, str):
        problem = f"text={_short(text)} is not a string"
    elif score is not None and (
        isinstance(score, bool)
        or not isinstance(score, numbers.Real)
        or not math.isfinite(float(score))
    ):
        problem = f"turn_score={_short(score)} is not a finite number or None"
    elif metadata is not None and not isinstance(metadata, Mapping):
        problem = f"metadata={_short(metadata)} is not a dict"
    if problem is not None:
        raise InteractionError(
            f"interaction {name!r}: generate_response returned {problem}; it must return {shape}"
        )
    return UserReply(
        bool(terminate), text, None if score is None else float(score), dict(metadata or {})
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

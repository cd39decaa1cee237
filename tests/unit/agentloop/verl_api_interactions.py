"""Interactions written against verl's interaction API (verl is not installed): a GSM8K-style
checker as verl's ``Gsm8kInteraction`` is written (instance state, ``calculate_score`` and
``finalize_interaction`` taking the instance id), one with verl's base-class signatures (no
instance id), a plain-``def`` one, and faulty ones. Every call is logged for the tests."""

import asyncio
import re
import time
import uuid
from typing import Any


class Gsm8kInteraction:
    """Answers "correct" (score 1, ends the episode) when the last assistant message holds
    ``#### <ground_truth>``, else asks to try again (score 0)."""

    calls: list[tuple] = []

    def __init__(self, config: dict):
        self.config = config
        self.name = config.get("name", "interaction_agent")
        self._instance_dict: dict[str, dict] = {}

    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs) -> str:
        if instance_id is None:
            instance_id = str(uuid.uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth}
        type(self).calls.append(("start", instance_id, ground_truth, kwargs))
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        content = next(m["content"] for m in reversed(messages) if m["role"] == "assistant")
        self._instance_dict[instance_id]["response"] = content
        type(self).calls.append(("respond", instance_id, [m["role"] for m in messages]))
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, "Your response is correct!", reward, {}
        return False, "Your response is incorrect! Try again.", reward, {}

    async def calculate_score(self, instance_id, **kwargs) -> float:
        state = self._instance_dict[instance_id]
        found = re.findall(r"#### (\S+)", state["response"])
        return 1.0 if found and found[-1] == str(state["ground_truth"]) else 0.0

    async def finalize_interaction(self, instance_id, **kwargs) -> None:
        type(self).calls.append(("finalize", instance_id))
        del self._instance_dict[instance_id]


class BaseSignatures:
    """verl's ``BaseInteraction`` signatures: ``calculate_score(self)``,
    ``finalize_interaction(self)``; never ends the episode."""

    calls: list[tuple] = []

    def __init__(self, config: dict):
        self.config = config

    async def start_interaction(self, instance_id=None, **kwargs):
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "Go on.", 0.5, {}

    async def calculate_score(self) -> float:
        type(self).calls.append(("score",))
        return 0.25

    async def finalize_interaction(self) -> None:
        type(self).calls.append(("finalize",))


class PlainDef:
    """Plain ``def`` methods (run in a thread); ends after its second reply."""

    calls: list[tuple] = []

    def __init__(self, config: dict):
        self.config = config
        self.turns: dict[str, int] = {}

    def generate_response(self, instance_id, messages, **kwargs):
        time.sleep(0.01)
        self.turns[instance_id] = self.turns.get(instance_id, 0) + 1
        return self.turns[instance_id] >= 2, f"reply {self.turns[instance_id]}", None, None

    def finalize_interaction(self, instance_id):
        type(self).calls.append(("finalize", instance_id))


class Faulty:
    """``config.fault``: ``raise``, ``hang``, ``tuple3``, ``bad_score``, ``bad_text`` (in
    ``generate_response``) or ``start`` (``start_interaction`` raises)."""

    calls: list[tuple] = []

    def __init__(self, config: dict):
        self.fault = config["fault"]

    async def start_interaction(self, instance_id=None, **kwargs):
        if self.fault == "start":
            raise ConnectionError("user service unreachable")
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs) -> Any:
        if self.fault == "raise":
            raise KeyError("persona")
        if self.fault == "hang":
            await asyncio.sleep(3600)
        if self.fault == "tuple3":
            return False, "hi", 1.0
        if self.fault == "bad_score":
            return False, "hi", "high", {}
        return False, None, 1.0, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        type(self).calls.append(("finalize", instance_id))


class NoResponse:
    """Not an interaction: no ``generate_response``."""

    def __init__(self, config: dict):
        pass

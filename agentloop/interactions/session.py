"""One sample's conversation with its interaction: start, a reply per model turn, the final
score and ``finalize_interaction`` exactly once, each call under a time limit, with the time
spent and every turn score kept for the sample's record."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from agentloop.interactions.base import InteractionError, UserReply, check_reply
from agentloop.records import InteractionRecord

__all__ = ["InteractionSession"]

logger = logging.getLogger(__name__)


class InteractionSession:
    def __init__(
        self,
        interaction: Any,
        name: str,
        kwargs: dict[str, Any],
        instance_id: str,
        *,
        timeout_s: float,
    ) -> None:
        self.interaction, self.name, self.kwargs = interaction, name, kwargs
        self.instance_id, self.timeout_s = instance_id, timeout_s
        self.record = InteractionRecord(name=name)
        self._started = self._closed = False

    async def start(self) -> None:
        """``start_interaction(instance_id, **kwargs)``; raises ``InteractionError``."""
        method = getattr(self.interaction, "start_interaction", None)
        self._started = True  # finalize runs even when start fails half-way
        if method is not None:
            await self._call("start_interaction", method, self.instance_id, **self.kwargs)

    async def respond(self, messages: list[dict[str, Any]]) -> UserReply:
        """The user's answer to the model's last turn; raises ``InteractionError``."""
        method = self.interaction.generate_response
        value = await self._call(
            "generate_response", method, self.instance_id, [dict(m) for m in messages],
            **self.kwargs,
        )  # fmt: skip
        reply = check_reply(value, self.name)
        self.record.turn_scores.append(reply.score)
        self.record.terminated = reply.terminate
        return reply

    async def close(self, error: str | None = None) -> InteractionRecord:
        """The final score (unless the sample failed) and ``finalize_interaction``, once;
        their failures are logged and recorded, never raised. Returns the record."""
        if self._closed:
            return self.record
        self._closed = True
        self.record.error = error
        if error is None:
            method = getattr(self.interaction, "calculate_score", None)
            if method is not None:
                try:
                    args, kw = _id(method, self.instance_id)
                    score = await self._call("calculate_score", method, *args, **kw)
                    self.record.final_score = _final(score, self.name)
                except InteractionError as exc:
                    self.record.error = str(exc)
        method = getattr(self.interaction, "finalize_interaction", None)
        if self._started and method is not None:
            try:
                args, kw = _id(method, self.instance_id)
                await self._call("finalize_interaction", method, *args, **kw)
            except InteractionError as exc:
                logger.warning("%s", exc)
                self.record.error = self.record.error or str(exc)
        return self.record

    async def _call(self, what: str, method: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(method):
                return await asyncio.wait_for(method(*args, **kw), self.timeout_s)
            return await asyncio.wait_for(asyncio.to_thread(method, *args, **kw), self.timeout_s)
        except TimeoutError:
            raise InteractionError(
                f"interaction {self.name!r}: {what} took longer than {self.timeout_s:g} s "
                "(multi_turn.interaction_timeout_s)"
            ) from None
        except InteractionError:
            raise
        except Exception as exc:
            raise InteractionError(
                f"interaction {self.name!r}: {what} raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.record.seconds += time.perf_counter() - start


def _id(method: Callable[..., Any], instance_id: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How a method takes the instance id: positionally where it has a positional parameter
    (verl's ``Gsm8kInteraction``), as ``instance_id=`` where it only takes ``**kwargs``, not at
    all where it takes neither (verl's base class)."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return (instance_id,), {}
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind in positional or p.kind is p.VAR_POSITIONAL for p in params):
        return (instance_id,), {}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return (), {"instance_id": instance_id}
    return (), {}


def _final(score: Any, name: str) -> float | None:
    if score is None:
        return None
    try:
        return float(score)
    except (TypeError, ValueError):
        raise InteractionError(
            f"interaction {name!r}: calculate_score returned {score!r}; it must return a number "
            "or None"
        ) from None

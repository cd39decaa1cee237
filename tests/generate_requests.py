"""Typed generate requests for tests that call a server or the manager directly, written
the way those calls read: ``req(prompt, params, request_id)`` for a server (the engine
request's id), ``turn_of(session_id, prompt_ids=..., sampling_params=...)`` for the manager.
A plain sampling dict becomes ``SamplingParams`` in ``GenerateRequest`` itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servers.types import GenerateRequest, SamplingParams

__all__ = ["req", "turn_of"]


def req(
    prompt_ids: list[int],
    sampling_params: SamplingParams | Mapping[str, Any] | None = None,
    request_id: str | None = None,
    priority: int = 0,
    *,
    session_id: str | None = None,
) -> GenerateRequest:
    """A request for ``AsyncServer.generate`` (``request_id``: the engine request's)."""
    return GenerateRequest(
        prompt_ids=list(prompt_ids),
        sampling_params=sampling_params,  # type: ignore[arg-type]  # converted on construction
        session_id=session_id,
        request_id=request_id,
        priority=priority,
    )


def turn_of(
    session_id: str,
    *,
    prompt_ids: list[int],
    sampling_params: SamplingParams | Mapping[str, Any] | None = None,
    priority: int = 0,
) -> GenerateRequest:
    """A turn of session ``session_id`` for ``AsyncLLMServerManager.generate``."""
    return req(prompt_ids, sampling_params, priority=priority, session_id=session_id)

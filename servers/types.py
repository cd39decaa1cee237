"""The token-level generate contract shared by every backend, and input validation.

``generate(GenerateRequest) -> TokenOutput``: token ids in, token ids out, the engine's
log-prob of every sampled token, and why generation ended. The request and its
``SamplingParams`` are typed structs from the agent loop to the engine adapter; plain dicts
exist only at the edges (the HTTP ``/generate`` body, an agent loop's ``run``). Sampling keys
use the OpenAI/vLLM names everywhere; each backend adapter translates them to its engine's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "FinishReason",
    "GenerateRequest",
    "SamplingParams",
    "TokenOutput",
    "GenerateInputError",
    "EngineDeadError",
    "SAMPLING_KEYS",
    "error_body",
    "validate_request",
]

FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class TokenOutput:
    token_ids: list[int]
    """Sampled token ids, exactly as the engine produced them."""
    log_probs: list[float] | None
    """Log-prob of each sampled token under the sampling distribution (one per token)."""
    finish_reason: FinishReason
    """``stop`` (EOS/stop token), ``length`` (max_tokens or model length), ``abort``."""
    versions: list[int] | None = None
    """Policy version (weight pushes so far) that sampled each token, where the caller
    knows it (``AsyncLLMServerManager`` stamps it; a turn resumed after a weight update
    spans two versions). None: not tracked."""
    weight_swaps: list[int] | None = None
    """Tokens sampled when each weight update loaded while this request ran (in-flight
    updates, ``servers.inflight``): the server's half of the versions, which the caller
    stamps. None: no update landed during it."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("versions", "weight_swaps"):  # the HTTP contract: neither is sent
            if out[key] is None:
                del out[key]
        return out


class GenerateInputError(ValueError):
    """A bad generate request: the caller must change the named field. The server is fine."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineDeadError(RuntimeError):
    """The engine behind a server is gone; the request may be retried on another server."""


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    """How to sample one turn, under the OpenAI/vLLM key names. ``None`` everywhere means
    "not set": the engine's default applies (``max_tokens``: the room left in the model
    length), and ``to_dict`` leaves the key out, so a request carries only what its sender
    chose. Values are checked against the vocabulary by ``validate_request`` on the server,
    where the vocabulary is known."""

    max_tokens: int | None = None
    """Most tokens to sample (capped by the room left in the model length)."""
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """0 or -1: no limit."""
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    """Extra token ids that end the turn (besides the model's eos)."""
    ignore_eos: bool | None = None
    logprobs: bool | None = None
    """Return the log-prob of each sampled token (default True)."""
    logit_bias: dict[int, float] | None = None
    """Token id -> bias in [-100, 100] (JSON sends the ids as strings)."""

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None) -> SamplingParams:
        """The struct of a sampling dict; an unknown key, or a key set to None (leave it out
        instead), raises ``GenerateInputError`` (a ``ValueError``) that names it."""
        if params is None:
            return cls()
        if isinstance(params, SamplingParams):
            return params
        if not isinstance(params, Mapping):
            raise GenerateInputError(
                "sampling_params must be an object of sampling keys", param="sampling_params"
            )
        unknown = sorted(set(params) - set(SAMPLING_KEYS))
        if unknown:
            raise GenerateInputError(
                f"unknown sampling_params key(s) {', '.join(unknown)}; "
                f"supported: {', '.join(sorted(SAMPLING_KEYS))}",
                param=f"sampling_params.{unknown[0]}",
            )
        for key, value in params.items():
            if value is None:  # leave a key out to leave it unset
                _check_number(key, value)
        return cls(**params)

    def to_dict(self) -> dict[str, Any]:
        """The keys that are set (the HTTP body's ``sampling_params``, an engine's kwargs)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out

    def merged(self, changes: Mapping[str, Any] | SamplingParams) -> SamplingParams:
        """A copy with the keys set in ``changes`` (a dict or another struct) replacing these."""
        params = self.to_dict()
        params.update(SamplingParams.from_dict(changes).to_dict())
        return SamplingParams(**params)


@dataclass(kw_only=True, slots=True)
class GenerateRequest:
    """One model turn: what the agent loop sends, the manager routes and a server runs."""

    prompt_ids: list[int]
    """The whole context so far (token ids; the server never re-tokenizes)."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    """The trajectory (agent-loop session) the turn belongs to: the manager keeps a
    session's turns on one server for its prefix cache. Servers ignore it."""
    request_id: str | None = None
    """The engine request's id (what ``abort`` names): the manager sets a fresh one per
    call; a server makes one up when it is None."""
    priority: int = 0
    """Lower is scheduled first by engines with ``scheduling_policy=priority``."""

    def __post_init__(self) -> None:
        # A sampling dict (a script's, a test's) becomes the struct here, once, with the
        # error of ``SamplingParams.from_dict`` for an unknown key.
        if not isinstance(self.sampling_params, SamplingParams):
            self.sampling_params = SamplingParams.from_dict(self.sampling_params)


# key -> (type check, constraint description, predicate)
_NUMBER = (int, float)
SAMPLING_KEYS: dict[str, tuple[tuple[type, ...], str, Any]] = {
    "max_tokens": ((int,), "an integer >= 1", lambda v: v >= 1),
    "min_tokens": ((int,), "an integer >= 0", lambda v: v >= 0),
    "temperature": (_NUMBER, "a number >= 0", lambda v: v >= 0),
    "top_p": (_NUMBER, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "top_k": ((int,), "an integer >= 1, or 0/-1 for no limit", lambda v: v >= -1),
    "min_p": (_NUMBER, "a number in [0, 1]", lambda v: 0 <= v <= 1),
    "repetition_penalty": (_NUMBER, "a number > 0", lambda v: v > 0),
    "presence_penalty": (_NUMBER, "a number in [-2, 2]", lambda v: -2 <= v <= 2),
    "frequency_penalty": (_NUMBER, "a number in [-2, 2]", lambda v: -2 <= v <= 2),
    "seed": ((int,), "an integer", lambda v: True),
    "stop_token_ids": ((list,), "a list of token ids", lambda v: True),
    "ignore_eos": ((bool,), "a boolean", lambda v: True),
    "logprobs": ((bool, int), "a boolean or 0", lambda v: True),
    "logit_bias": ((dict,), "an object of token id -> bias in [-100, 100]", lambda v: True),
}


def _logit_bias(value: dict, vocab_size: int) -> dict[int, float]:
    """``{token id (int or numeric string, as JSON sends it): bias}`` with int keys."""
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < vocab_size:
            raise GenerateInputError(
                f"sampling_params.logit_bias has key {key!r}, not a token id in [0, {vocab_size})",
                param="sampling_params.logit_bias",
            )
        if isinstance(bias, bool) or not isinstance(bias, _NUMBER) or not -100 <= bias <= 100:
            raise GenerateInputError(
                f"sampling_params.logit_bias[{key!r}] must be a number in [-100, 100], got "
                f"{bias!r}",
                param="sampling_params.logit_bias",
            )
        out[token] = float(bias)
    return out


def _check_number(key: str, value: Any) -> None:
    types, desc, ok = SAMPLING_KEYS[key]
    # bool is an int subclass: only accept it where a boolean is meant.
    is_bool = isinstance(value, bool)
    if (is_bool and bool not in types) or not isinstance(value, types):
        raise GenerateInputError(
            f"sampling_params.{key} must be {desc}, got {type(value).__name__} {value!r}",
            param=f"sampling_params.{key}",
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise GenerateInputError(
            f"sampling_params.{key} must be {desc}, got {value!r}", param=f"sampling_params.{key}"
        )
    if not ok(value):
        raise GenerateInputError(
            f"sampling_params.{key} must be {desc}, got {value!r}", param=f"sampling_params.{key}"
        )


def _check_ids(field: str, ids: Any, vocab_size: int) -> None:
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise GenerateInputError(f"{field} must be a list of integer token ids", param=field)
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise GenerateInputError(
            f"{field} contains token id {bad[0]} outside the vocabulary [0, {vocab_size})",
            param=field,
        )


def validate_request(
    prompt_ids: Any,
    sampling_params: SamplingParams | Mapping[str, Any] | None,
    *,
    vocab_size: int,
    max_model_len: int,
) -> SamplingParams:
    """Check a generate request and return its normalised sampling params.

    ``max_tokens`` defaults to, and is clamped to, the room left in the model length after the
    prompt; ``logprobs`` becomes a bool (default True). Raises ``GenerateInputError`` naming
    the field to change. A dict (the HTTP body's) is converted by ``SamplingParams.from_dict``.
    """
    if sampling_params is None:
        sampling_params = {}
    if not isinstance(sampling_params, SamplingParams | Mapping):
        raise GenerateInputError(
            "sampling_params must be an object of sampling keys", param="sampling_params"
        )
    _check_ids("prompt_ids", prompt_ids, vocab_size)
    if not prompt_ids:
        raise GenerateInputError(
            "prompt_ids is empty: send at least one token id", param="prompt_ids"
        )
    if len(prompt_ids) >= max_model_len:
        raise GenerateInputError(
            f"prompt_ids has {len(prompt_ids)} tokens but the model length is {max_model_len}: "
            f"shorten the prompt to at most {max_model_len - 1} tokens",
            param="prompt_ids",
        )
    items = SamplingParams.from_dict(sampling_params).to_dict()
    for key, value in items.items():
        if key == "stop_token_ids":
            _check_ids("sampling_params.stop_token_ids", value, vocab_size)
        else:
            _check_number(key, value)
    if "logit_bias" in items:
        items["logit_bias"] = _logit_bias(items["logit_bias"], vocab_size)
    room = max_model_len - len(prompt_ids)
    items["max_tokens"] = min(items.get("max_tokens", room), room)
    items["logprobs"] = items.get("logprobs", True) is not False
    return SamplingParams(**items)


def error_body(message: str, *, param: str | None = None, code: int = 400) -> dict[str, Any]:
    """The OpenAI error object every HTTP route answers with (``code`` is the HTTP status)."""
    kind = "invalid_request_error" if code < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}

"""Per-request work limits of the HTTP front, checked before a request is admitted.

A request's work is its number of sequences (``n`` choices of a chat request, ``n`` per prompt
of a text completion; ``/generate`` samples one), how many tokens each may generate
(``max_tokens``) and its prompt. One request could otherwise ask for enough of any of them to
hold the engine for everyone, and the admission limit (``max_concurrent_requests``) counts
sequences, so ``n`` is also what a request costs there. Ray calls to the actor are not limited
here.

Only fields the client sent with the right type are checked; a mistyped one is left to the
route's own validation, which names what is wrong with it. A chat prompt's length is known only
after the chat template, a text prompt's once tokenized: ``VLLMOpenAI`` checks them there
(``check_prompt_tokens``).
"""

from __future__ import annotations

from typing import Any

from servers.config import ServerConfig
from servers.types import GenerateInputError

__all__ = ["check_prompt_tokens", "request_sequences"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/generate"


def _int(value: Any) -> int | None:
    """``value`` if it is a JSON integer (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _over(field: str, value: int, key: str, limit: int, why: str = "") -> GenerateInputError:
    flag = "--" + key.replace("_", "-")
    return GenerateInputError(
        f"{field}={value} exceeds this server's limit {key}={limit}{why} (agentloop-serve {flag})",
        param=field,
    )


def check_prompt_tokens(field: str, length: int, limit: int | None, how: str = "") -> None:
    """Raise ``GenerateInputError`` when a prompt of ``length`` tokens is over ``limit``
    (``max_prompt_tokens``); ``field`` names the prompt, ``how`` says how it was counted."""
    if limit is not None and length > limit:
        raise GenerateInputError(
            f"{field} has {length} tokens{how}, over this server's limit "
            f"max_prompt_tokens={limit} (agentloop-serve --max-prompt-tokens)",
            param=field,
        )


def _check_max_tokens(fields: dict[str, Any], config: ServerConfig) -> None:
    limit = config.max_tokens_per_request
    for field, value in fields.items():
        value = _int(value)
        if value is not None and value > limit:
            raise _over(field, value, "max_tokens_per_request", limit)


def _check_n(n: int, config: ServerConfig) -> None:
    if n > config.max_n:
        raise _over("n", n, "max_n", config.max_n)
    if n > config.max_concurrent_requests:  # could never be admitted: say so, not 503 forever
        raise _over(
            "n",
            n,
            "max_concurrent_requests",
            config.max_concurrent_requests,
            ", which counts each of a request's n sequences",
        )


def request_sequences(path: str, body: Any, config: ServerConfig) -> int:
    """Sequences the JSON ``body`` sent to ``path`` asks for (what admission counts). Raises
    ``GenerateInputError`` naming the limit, and the flag that raises it, when the request asks
    for more than this server allows."""
    if not isinstance(body, dict):
        return 1
    if path == GENERATE_PATH:
        prompt_ids = body.get("prompt_ids")
        if isinstance(prompt_ids, list):
            check_prompt_tokens("prompt_ids", len(prompt_ids), config.max_prompt_tokens)
        params = body.get("sampling_params")
        if isinstance(params, dict):
            _check_max_tokens({"sampling_params.max_tokens": params.get("max_tokens")}, config)
        return 1
    if path == CHAT_PATH:
        _check_max_tokens({k: body.get(k) for k in ("max_tokens", "max_completion_tokens")}, config)
        n = _int(body.get("n"))
        if n is None or n < 1:
            return 1  # absent (1) or invalid: the chat layer answers the invalid with a 400
        _check_n(n, config)
        return n
    if path == COMPLETIONS_PATH:
        _check_max_tokens({"max_tokens": body.get("max_tokens")}, config)
        n = _int(body.get("n"))
        n = n if n is not None and n >= 1 else 1  # invalid: the completions layer says so
        _check_n(n, config)
        prompts = _prompts(body.get("prompt"))
        limit = config.max_concurrent_requests
        if n * prompts > limit:  # could never be admitted: say so, not 503 forever
            raise GenerateInputError(
                f"prompt holds {prompts} prompts of n={n} sequences each, {n * prompts} in all, "
                f"over this server's limit max_concurrent_requests={limit} (agentloop-serve "
                "--max-concurrent-requests): send fewer prompts per request",
                param="prompt",
            )
        return n * prompts
    return 1


def _prompts(prompt: Any) -> int:
    """Prompts in a completion request's ``prompt``: one text or token list, or a batch of
    them (anything else counts as one; the completions layer answers it with a 400)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    return 1

"""Exact token trajectories: sampled ids appended as sampled, template text appended as deltas.

``encode_delta`` renders the conversation with and without the new (tool/user) messages and
tokenizes only the suffix, starting right after the end-of-turn token the model sampled (so
the template's separator, e.g. Qwen's ``\\n`` after ``<|im_end|>``, is kept) and ending with
the generation prompt. History is never re-tokenized. ``Trajectory`` keeps ids, loss mask and
log-probs append-only and enforces the response budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "TemplateDeltaError",
    "Trajectory",
    "encode_delta",
    "encode_prompt",
    "mask_spans",
    "render_chat",
]

# A reasoning block and the "\n\n" the template writes after it; only the text right after
# the block is matched (not \s*, which would eat whitespace the model sampled), and the block
# starts at the "<think>" nearest its "</think>" (an earlier literal "<think>" in a message is
# not a block).
_THINK = re.compile(r"<think>(?:(?!<think>).)*?</think>\n{0,2}", re.DOTALL)


class TemplateDeltaError(ValueError):
    """The chat template cannot be extended by a delta (it does not close turns with the
    end-of-turn token, or it rewrites history beyond dropping reasoning blocks)."""


def render_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **(chat_template_kwargs or {}),
    )


def encode_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt with the generation prompt: the one full tokenization a sample
    gets (everything after it is appended as sampled ids or deltas)."""
    ids = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **(chat_template_kwargs or {}),
    )
    return list(ids)


def _nth_end(text: str, token: str, n: int) -> int:
    """Index just past the ``n``-th occurrence of ``token`` in ``text`` (-1 if fewer)."""
    pos = -1
    for _ in range(n):
        pos = text.find(token, pos + 1)
        if pos < 0:
            return -1
    return pos + len(token)


def encode_delta(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    eot_token: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Ids the chat template adds for ``new_messages`` after ``messages``, generation prompt
    included, starting right after the end-of-turn token that closes ``messages``.

    The rendered history before that point must be unchanged by adding the new messages; the
    one rewrite accepted is dropping ``<think>`` blocks (Qwen3 drops reasoning of earlier
    turns): the trajectory keeps what was sampled. Anything else raises ``TemplateDeltaError``.
    """
    eot = eot_token or tokenizer.eos_token
    if not eot:
        raise TemplateDeltaError("the tokenizer has no eos token: pass eot_token= explicitly")
    kwargs = {"tools": tools, "chat_template_kwargs": chat_template_kwargs}
    before = render_chat(tokenizer, messages, add_generation_prompt=False, **kwargs)
    turns = before.count(eot)
    if not turns:
        raise TemplateDeltaError(
            f"the rendered conversation has no end-of-turn token {eot!r}; pass the template's "
            "end-of-turn token as eot_token="
        )
    cut = before.rfind(eot) + len(eot)
    if before[cut:].strip():
        raise TemplateDeltaError(
            f"the chat template puts {before[cut:]!r} after the last end-of-turn token {eot!r}; "
            "only whitespace separators can follow a turn the model closed"
        )
    after = render_chat(tokenizer, [*messages, *new_messages], add_generation_prompt=True, **kwargs)
    cut_after = _nth_end(after, eot, turns)
    if cut_after < 0 or after[:cut_after] != before[:cut]:
        old, new = before[:cut], after[:cut_after] if cut_after >= 0 else after
        if _THINK.sub("", old) != _THINK.sub("", new):
            at = next(
                (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                min(len(old), len(new)),
            )
            raise TemplateDeltaError(
                "the chat template rewrites history when new messages are added (first "
                f"difference at char {at}: {old[at : at + 40]!r} vs {new[at : at + 40]!r}); "
                "a delta cannot be appended to the sampled tokens"
            )
    return tokenizer.encode(after[cut_after:], add_special_tokens=False)


class Trajectory:
    """Append-only response of one sample: ids, loss mask (1 = sampled) and log-probs.

    ``budget`` is the response length; nothing is appended past it, and a template delta is
    only appended when at least one sampled token still fits after it (a trailing generation
    prompt with no answer would teach nothing and could be a cut header).
    """

    __slots__ = ("prompt_ids", "budget", "_ids", "_mask", "_log_probs", "_versions")

    def __init__(self, prompt_ids: Sequence[int], budget: int) -> None:
        if budget < 1:
            raise ValueError(f"response budget must be >= 1, got {budget}")
        self.prompt_ids: list[int] = list(prompt_ids)
        self.budget = budget
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._log_probs: list[float] = []
        self._versions: list[int] = []  # policy version per token; -1 where not sampled

    @classmethod
    def restore(
        cls,
        prompt_ids: Sequence[int],
        budget: int,
        response_ids: Sequence[int],
        response_mask: Sequence[int],
        response_log_probs: Sequence[float],
        response_versions: Sequence[int] | None = None,
    ) -> Trajectory:
        """A trajectory continued from saved lists (e.g. a LangChain message's metadata)."""
        if not len(response_ids) == len(response_mask) == len(response_log_probs):
            raise ValueError(
                f"saved trajectory lists differ in length: {len(response_ids)} ids, "
                f"{len(response_mask)} mask, {len(response_log_probs)} log-probs"
            )
        if len(response_ids) > budget:
            raise ValueError(f"saved trajectory has {len(response_ids)} tokens > budget {budget}")
        traj = cls(prompt_ids, budget)
        traj._ids = list(response_ids)
        traj._mask = list(response_mask)
        traj._log_probs = list(response_log_probs)
        if response_versions is not None and len(response_versions) == len(response_ids):
            traj._versions = list(response_versions)
        else:  # saved without versions: sampled tokens count as version 0
            traj._versions = [0 if m else -1 for m in response_mask]
        return traj

    @property
    def room(self) -> int:
        """Response tokens that can still be appended."""
        return self.budget - len(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def add_sampled(
        self,
        token_ids: Sequence[int],
        log_probs: Sequence[float] | None,
        versions: Sequence[int] | None = None,
    ) -> None:
        """Append model tokens exactly as sampled (mask 1) with their engine log-probs and
        the policy version that sampled each (0 when not tracked)."""
        n = len(token_ids)
        if n > self.room:
            raise ValueError(f"{n} sampled tokens exceed the {self.room} left in the budget")
        if log_probs is not None and len(log_probs) != n:
            raise ValueError(f"{len(log_probs)} log-probs for {n} sampled tokens")
        self._ids.extend(token_ids)
        self._mask.extend([1] * n)
        self._log_probs.extend(log_probs if log_probs is not None else [0.0] * n)
        if versions is not None and len(versions) != n:
            raise ValueError(f"{len(versions)} versions for {n} sampled tokens")
        self._versions.extend(versions if versions is not None else [0] * n)

    def add_template(self, token_ids: Sequence[int]) -> bool:
        """Append non-model tokens (mask 0, log-prob 0) if they leave room to sample; returns
        False and appends nothing otherwise."""
        n = len(token_ids)
        if n >= self.room:
            return False
        self._ids.extend(token_ids)
        self._mask.extend([0] * n)
        self._log_probs.extend([0.0] * n)
        self._versions.extend([-1] * n)
        return True

    def context_ids(self) -> list[int]:
        """Prompt + response so far: the next turn's prompt."""
        return self.prompt_ids + self._ids

    @property
    def response_ids(self) -> list[int]:
        return list(self._ids)

    @property
    def response_mask(self) -> list[int]:
        return list(self._mask)

    @property
    def response_log_probs(self) -> list[float]:
        return list(self._log_probs)

    @property
    def response_versions(self) -> list[int]:
        """Policy version that sampled each token; -1 on tool/user/template tokens."""
        return list(self._versions)


def mask_spans(ids: Sequence[int], mask: Sequence[int], value: int) -> list[list[int]]:
    """The maximal runs of ``ids`` whose mask equals ``value`` (1: model turns, 0: deltas)."""
    spans: list[list[int]] = []
    prev = None
    for token, m in zip(ids, mask, strict=True):
        if m == value:
            if prev != value:
                spans.append([])
            spans[-1].append(token)
        prev = m
    return spans

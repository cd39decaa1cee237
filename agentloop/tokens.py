"""Exact token trajectories: sampled ids appended as sampled, template text appended as deltas.

``encode_delta`` renders the conversation with and without the new (tool/user) messages and
tokenizes only the suffix, starting right after the end-of-turn token the model sampled (so
the template's separator, e.g. Qwen's ``\\n`` after ``<|im_end|>``, is kept) and ending with
the generation prompt. History is never re-tokenized; with ``head`` only the prompt, the last
message and the new ones are rendered, so a turn costs the same at any history length.
``Trajectory`` keeps ids, loss mask and log-probs append-only and enforces the response
budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "TemplateDeltaError",
    "Trajectory",
    "delta_render_size",
    "drop_think",
    "encode_delta",
    "encode_prompt",
    "mask_spans",
    "render_chat",
    "render_size",
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


def render_size(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> int:
    """About how many characters a render of ``messages`` with ``tools`` handles: the
    messages' text (a content list or tool calls by their length as text) and the tools'."""
    size = 0
    for message in messages:
        for key in ("content", "tool_calls", "reasoning_content"):
            value = message.get(key)
            if value:
                size += len(value) if isinstance(value, str) else len(str(value))
    return size + (len(str(tools)) if tools else 0)


def _suffix_only(messages: Sequence[dict[str, Any]], head: int | None) -> bool:
    """``encode_delta`` renders only the prompt and the last message before the new ones."""
    return head is not None and len(messages) > head + 1


def delta_render_size(
    messages: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    head: int | None = None,
    check: bool = False,
) -> int:
    """``render_size`` of what ``encode_delta`` renders with these arguments."""
    if _suffix_only(messages, head) and not check:
        messages = [*messages[:head], messages[-1]]
    return render_size([*messages, *new_messages], tools)


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


def _end_pattern(ends: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(e) for e in sorted(ends, key=len, reverse=True)))


def _nth_end(text: str, pattern: re.Pattern[str], n: int) -> tuple[int, int]:
    """(start, end) of the ``n``-th end token in ``text``; (-1, -1) if fewer."""
    for i, match in enumerate(pattern.finditer(text), start=1):
        if i == n:
            return match.start(), match.end()
    return -1, -1


def _first_difference(old: str, new: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
        min(len(old), len(new)),
    )
    return f"first difference at char {at}: {old[at : at + 40]!r} vs {new[at : at + 40]!r}"


def drop_think(text: str) -> str:
    """``text`` without its ``<think>`` blocks (and the line breaks after them)."""
    return _THINK.sub("", text)


def _delta_text(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    ends: Sequence[str],
    *,
    opens_next: bool,
    sampled_end: str | None,
    rewrite: Callable[[str], str],
    tools: Sequence[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    check_history: bool,
) -> str:
    kwargs = {"tools": tools, "chat_template_kwargs": chat_template_kwargs}
    pattern = _end_pattern(ends)
    shown = " or ".join(repr(e) for e in ends)
    before = render_chat(tokenizer, messages, add_generation_prompt=False, **kwargs)
    found = list(pattern.finditer(before))
    turns = len(found)
    if opens_next:
        # the model sampled the next message's header: the history ends before it
        cut, turns = len(before.rstrip()), turns + 1
    else:
        if not found:
            raise TemplateDeltaError(
                f"the rendered conversation has no end-of-turn token {shown}; set "
                "multi_turn.format to the model's family (or pass eot_token=)"
            )
        cut = found[-1].end()
        if before[cut:].strip():
            raise TemplateDeltaError(
                f"the chat template puts {before[cut:]!r} after the last end-of-turn token "
                f"{found[-1].group()!r}; only whitespace separators can follow a turn the "
                "model closed"
            )
    after = render_chat(tokenizer, [*messages, *new_messages], add_generation_prompt=True, **kwargs)
    start, cut_after = _nth_end(after, pattern, turns)
    if cut_after < 0:
        raise TemplateDeltaError(
            f"the chat template renders the new messages without the end-of-turn token {shown} "
            "that closes the history; a delta cannot be appended to the sampled tokens"
        )
    if opens_next and sampled_end is not None and after[start:cut_after] != sampled_end:
        raise TemplateDeltaError(
            f"the model ended its turn with {sampled_end!r} but the chat template opens the "
            f"new messages with {after[start:cut_after]!r}"
        )
    if check_history:
        old = before[:cut]
        new = after[:start].rstrip() if opens_next else after[:cut_after]
        if old != new and rewrite(old) != rewrite(new):
            raise TemplateDeltaError(
                "the chat template rewrites history when new messages are added "
                f"({_first_difference(rewrite(old), rewrite(new))}); a delta cannot be "
                "appended to the sampled tokens"
            )
    return after[cut_after:]


def encode_delta(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    eot_token: str | Sequence[str] | None = None,
    opens_next: bool = False,
    sampled_end: str | None = None,
    head: int | None = None,
    check: bool = False,
    history_rewrite: Callable[[str], str] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Ids the chat template adds for ``new_messages`` after ``messages``, generation prompt
    included, starting right after the end-of-turn token the model sampled last.

    ``eot_token``: the end-of-turn token(s) (a format's ``EndTokens.strings``; default the
    tokenizer's eos). ``opens_next``: the end token is the next message's header (GLM's
    ``<|observation|>``), the delta starts after it and it must be ``sampled_end``.

    ``head=None`` renders the whole conversation twice (the full check): the rendered
    history before the cut must be unchanged by the new messages, apart from the template's
    documented rewrite (``history_rewrite``; default: dropped ``<think>`` blocks, as Qwen3
    drops earlier reasoning), else ``TemplateDeltaError``. ``head=k`` renders only the first
    ``k`` messages (the prompt: system, tools, first user), the last message and the new
    ones, so the cost does not grow with the history; ``check=True`` also runs the full
    path and raises when the two differ (a template whose new messages depend on more than
    the prompt and the previous message).
    """
    if eot_token is None:
        eot_token = tokenizer.eos_token
        if not eot_token:
            raise TemplateDeltaError("the tokenizer has no eos token: pass eot_token= explicitly")
    ends = [eot_token] if isinstance(eot_token, str) else list(eot_token)
    options = {
        "opens_next": opens_next,
        "sampled_end": sampled_end,
        "rewrite": history_rewrite or drop_think,
        "tools": tools,
        "chat_template_kwargs": chat_template_kwargs,
    }
    suffix_only = _suffix_only(messages, head)
    if suffix_only:
        probe = [*messages[:head], messages[-1]]
        text = _delta_text(tokenizer, probe, new_messages, ends, check_history=False, **options)
    if not suffix_only or check:
        full = _delta_text(tokenizer, messages, new_messages, ends, check_history=True, **options)
        if suffix_only and full != text:
            raise TemplateDeltaError(
                "the chat template renders the new messages differently when only the prompt "
                f"and the last message precede them ({_first_difference(full, text)}); set "
                "multi_turn.delta_check=full for this template"
            )
        text = full
    return tokenizer.encode(text, add_special_tokens=False)


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

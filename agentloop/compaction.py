"""Context compaction for ``tool_agent``: a history that reached ``multi_turn.max_context_tokens``
is compacted and the sample goes on as a new segment.

The check runs before each model call on counts the loop already has (the segment's prompt and
response lengths, the delta about to be appended), so the normal path tokenizes nothing. When
the next call would not fit, ``drop_tool_outputs`` replaces every tool output after the prompt
but the newest ``compaction.keep`` with a short placeholder; the compacted messages are rendered
once as the new segment's prompt. The segment that was full closes as a training sample of its
own, its tokens as sampled; each compaction is a ``Compaction`` (its reason is the new
segment's ``SampleRecord.branch_reason``, the trace shows it as a span).

``summarize`` has the policy write the summary instead: the pending turn and
``compaction.summary_prompt`` are appended to the full segment as one template delta (mask 0),
the model's summary is sampled into it (mask 1: trained with the sample's reward), and the next
segment's prompt is the row's prompt with the summary added as user text. A last turn whose
outputs leave no room for the summary is summarized with them replaced by the placeholder, and
follows the summary whole. Every model call leaves room for a summary (and for a placeholder per
allowed parallel output); a request that still does not fit stops the sample (``context_full``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.tokens import drop_think

__all__ = [
    "CONTEXT_FULL",
    "Compaction",
    "context_limit",
    "drop_tool_outputs",
    "summary_text",
    "with_user_text",
]

CONTEXT_FULL = "context_full"
"""Stop reason of a sample whose history no compaction makes fit its context budget."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """One compaction of a sample's history."""

    segment: int
    """The index of the segment it opened (1: the first compaction)."""
    mode: str
    """``multi_turn.compaction.mode``."""
    dropped: int
    """Tool outputs replaced by the placeholder."""
    messages: int
    """Messages of the compacted history (the new segment's prompt)."""
    before_tokens: int
    """The full segment's context with the pending turn: prompt + response + delta."""
    after_tokens: int
    """The new segment's prompt."""
    summary_tokens: int = 0
    """``summarize``: the tokens the policy's summary took (0: another mode)."""
    kept_turn: bool = False
    """``summarize``: the last turn was too long to summarize with and follows the summary
    whole."""

    @property
    def reason(self) -> str:
        """The new segment's branch reason, e.g. ``compaction: 3 tool outputs dropped,
        5,210 -> 1,020 tokens`` or ``compaction: summarized by the policy in 87 tokens,
        5,210 -> 1,020 tokens``."""
        if self.mode == "summarize":
            what = f"summarized by the policy in {self.summary_tokens:,} tokens"
            if self.kept_turn:
                what += ", the last turn kept whole"
        else:
            outputs = "tool output" if self.dropped == 1 else "tool outputs"
            what = f"{self.dropped} {outputs} dropped"
        return f"compaction: {what}, {self.before_tokens:,} -> {self.after_tokens:,} tokens"


def context_limit(max_context_tokens: int, engine_context: int, prompt: int, response: int) -> int:
    """The most tokens a segment may hold: the context budget, the engine's context length
    and the segment's own prompt plus response budget, whichever is smallest."""
    return min(max_context_tokens, engine_context, prompt + response)


def drop_tool_outputs(
    messages: Sequence[dict[str, Any]], *, head: int, keep: int, placeholder: str
) -> tuple[list[dict[str, Any]], int]:
    """``messages`` with the content of every tool message after the first ``head`` (the
    prompt) but the newest ``keep`` replaced by ``placeholder``, and how many were replaced
    (outputs dropped by an earlier compaction are not counted again). The other messages
    are the same objects; a replaced one is a copy."""
    tools = [i for i in range(head, len(messages)) if messages[i].get("role") == "tool"]
    drop = tools[: max(len(tools) - keep, 0)]
    out = list(messages)
    dropped = 0
    for i in drop:
        if out[i].get("content") == placeholder:
            continue
        out[i] = {**out[i], "content": placeholder}
        dropped += 1
    return out, dropped


def with_user_text(messages: Sequence[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` said by the user: added to the last message when that is a
    user message with text content (templates that require the roles to alternate refuse
    two user messages in a row), else as a new user message. The others are the same
    objects; a changed one is a copy."""
    out = list(messages)
    if out and out[-1].get("role") == "user" and isinstance(out[-1].get("content"), str):
        out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{text}"}
    else:
        out.append({"role": "user", "content": text})
    return out


def summary_text(content: str) -> str:
    """The summary the policy wrote: its turn's text outside tool-call blocks (``content``,
    as the parser reads it) without reasoning blocks."""
    return drop_think(content).strip()

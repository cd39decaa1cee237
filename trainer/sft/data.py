"""SFT conversations as the token trajectories RL would produce for them.

A conversation ``messages`` (system/user/assistant with tool_calls/tool ...) becomes:

- prompt: the messages before the first assistant message, rendered once with the generation
  prompt (``encode_prompt``, as an agent loop starts a sample);
- response, built append-only like ``agentloop.Trajectory``: each assistant message is the
  text the template renders for it as the conversation's last message, from after the
  generation prompt up to and including the end-of-turn token (mask 1: what the model
  samples); the messages between two assistant messages are a template delta (``encode_delta``:
  separator, tool/user turns, next generation prompt; mask 0). Messages after the last
  assistant message teach nothing and are left out. History is never re-tokenized.
- an assistant message with ``"weight": 0`` (OpenAI's fine-tuning format) stays in the
  conversation but is not trained: its tokens get mask 0 (a mistake the next turns recover
  from, shown without teaching it). ``"weight": 1`` is the default.

For ChatML templates this equals one tokenization of the full conversation. Templates that
rewrite history differ where RL does too: Qwen3 renders a ``<think>`` block (empty without
reasoning) for the assistant turn being generated and drops it from earlier turns; here every
assistant turn keeps the block it had when it was generated, which is what the model samples.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentloop.tokens import TemplateDeltaError, encode_delta, encode_prompt, render_chat
from trainer.workers.batch import TrainBatch

__all__ = [
    "SFTSample",
    "collate_sft",
    "conversation_of",
    "encode_conversation",
    "encode_rows",
    "epoch_order",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SFTSample:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    """1 on assistant tokens (end-of-turn included), 0 on template/tool/user tokens."""

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def _assistant_ids(
    tokenizer: Any,
    history: list[dict[str, Any]],
    message: dict[str, Any],
    tools: Sequence[dict[str, Any]] | None,
    eot: str,
    chat_template_kwargs: dict[str, Any] | None,
) -> list[int]:
    """Ids of ``message`` as the model samples it after ``history``'s generation prompt."""
    kwargs = {"tools": tools, "chat_template_kwargs": chat_template_kwargs}
    head = render_chat(tokenizer, history, add_generation_prompt=True, **kwargs)
    full = render_chat(tokenizer, [*history, message], add_generation_prompt=False, **kwargs)
    if not full.startswith(head):
        raise TemplateDeltaError(
            "the chat template renders an assistant message differently from its generation "
            f"prompt {head[-40:]!r}; the assistant turn cannot be cut out of the conversation"
        )
    body = full[len(head) :]
    end = body.rfind(eot)
    if end < 0 or body[end + len(eot) :].strip():
        raise TemplateDeltaError(
            f"the chat template does not close an assistant turn with {eot!r} at its end"
        )
    return tokenizer.encode(body[: end + len(eot)], add_special_tokens=False)


def encode_conversation(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
    eot_token: str | None = None,
) -> SFTSample:
    """Prompt ids, response ids and loss mask of one conversation (see the module docstring).
    ``messages`` must contain an assistant message after at least one other message."""
    roles = [m["role"] for m in messages]
    first = roles.index("assistant")
    last = len(roles) - 1 - roles[::-1].index("assistant")
    eot = eot_token or tokenizer.eos_token
    history = list(messages[:first])
    prompt_ids = encode_prompt(
        tokenizer, history, tools=tools, chat_template_kwargs=chat_template_kwargs
    )
    ids: list[int] = []
    mask: list[int] = []
    i = first
    while True:
        message = {k: v for k, v in messages[i].items() if k != "weight"}
        sampled = _assistant_ids(tokenizer, history, message, tools, eot, chat_template_kwargs)
        ids += sampled
        mask += [int(messages[i].get("weight", 1))] * len(sampled)
        history.append(message)
        if i == last:
            break
        nxt = roles.index("assistant", i + 1)
        between = list(messages[i + 1 : nxt])
        delta = encode_delta(
            tokenizer,
            history,
            between,
            tools,
            eot_token=eot,
            chat_template_kwargs=chat_template_kwargs,
        )
        ids += delta
        mask += [0] * len(delta)
        history.extend(between)
        i = nxt
    return SFTSample(prompt_ids, ids, mask)


def conversation_of(
    row: dict[str, Any], index: int, messages_key: str, tools_key: str, source: str = "data"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tool schemas) of a dataset row; a ``ValueError`` naming the row otherwise."""
    where = f"{source}: row {index}"
    messages = row.get(messages_key)
    if messages is None:
        raise ValueError(
            f"{where} has no '{messages_key}' (chat messages); set data.messages_key to the "
            "column holding them"
        )
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{where}: '{messages_key}' must be a list of chat messages")
    for j, message in enumerate(messages):
        if not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: message {j} has no 'role'")
        if "weight" in message:
            weight = message["weight"]
            if message["role"] != "assistant":
                raise ValueError(
                    f"{where}: message {j} ({message['role']}) has a weight; only assistant "
                    "messages take one"
                )
            if weight not in (0, 1) or isinstance(weight, bool):
                raise ValueError(
                    f"{where}: message {j} has weight {weight!r}; an assistant message's weight "
                    "is 0 (kept in the conversation, not trained) or 1 (trained)"
                )
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise ValueError(f"{where} has no assistant message: there is nothing to train on")
    if all(m.get("weight", 1) == 0 for m in messages if m["role"] == "assistant"):
        raise ValueError(
            f"{where}: every assistant message has weight 0: there is nothing to train on"
        )
    if roles[0] == "assistant":
        raise ValueError(
            f"{where} starts with an assistant message: the messages before the first "
            "assistant message are the prompt (add the user message)"
        )
    tools = row.get(tools_key)
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: '{tools_key}' is not valid JSON ({exc.msg})") from None
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise ValueError(
            f"{where}: '{tools_key}' must be a list of OpenAI function schemas (or its JSON string)"
        )
    return messages, tools or None


def encode_rows(
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    *,
    messages_key: str = "messages",
    tools_key: str = "tools",
    max_length: int,
    chat_template_kwargs: dict[str, Any] | None = None,
    source: str = "data",
) -> list[SFTSample]:
    """Every row encoded; conversations over ``max_length`` tokens are dropped and counted.
    All rows are checked before any is encoded, so a bad row fails at once."""
    conversations = [
        conversation_of(row, i, messages_key, tools_key, source) for i, row in enumerate(rows)
    ]
    samples = []
    for messages, tools in conversations:
        sample = encode_conversation(
            tokenizer, messages, tools, chat_template_kwargs=chat_template_kwargs
        )
        if len(sample) <= max_length:
            samples.append(sample)
    dropped = len(rows) - len(samples)
    if dropped:
        logger.warning(
            "%s: dropped %d of %d conversations over data.max_length=%d tokens",
            source,
            dropped,
            len(rows),
            max_length,
        )
    if not samples:
        raise ValueError(
            f"no conversations left in {source} ({len(rows)} read) after dropping those over "
            f"data.max_length={max_length} tokens: raise it"
        )
    return samples


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Row order of ``epoch``: a permutation seeded by (seed, epoch), so a resumed run
    replays the same order."""
    if not shuffle:
        return list(range(n))
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator).tolist()


def collate_sft(samples: Sequence[SFTSample], pad_token_id: int) -> TrainBatch:
    """A ``TrainBatch``: prompts left-padded, responses right-padded to the batch's longest."""
    p = max(len(s.prompt_ids) for s in samples)
    r = max(len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), p + r), pad_token_id, dtype=torch.long)  # [batch, P + R]
    attention = torch.zeros(len(samples), p + r, dtype=torch.long)
    mask = torch.zeros(len(samples), r, dtype=torch.long)  # [batch, R]
    for i, s in enumerate(samples):
        n_p, n_r = len(s.prompt_ids), len(s.response_ids)
        ids[i, p - n_p : p] = torch.tensor(s.prompt_ids)
        ids[i, p : p + n_r] = torch.tensor(s.response_ids)
        attention[i, p - n_p : p + n_r] = 1
        mask[i, :n_r] = torch.tensor(s.response_mask)
    return TrainBatch(
        input_ids=ids,
        attention_mask=attention,
        position_ids=(attention.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
    )

"""SFT conversations become exactly the token trajectories RL builds for them: prompt once,
assistant turns as sampled (mask 1, end-of-turn included), everything else as template deltas
(mask 0); bad rows fail naming the row; long conversations are dropped and counted."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, collate
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer
from trainer.sft.data import collate_sft, conversation_of, encode_conversation, encode_rows

EOT = "<|im_end|>"
CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CONVERSATION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": {"a": 2, "b": 3}}}
        ],
    },
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "The answer is 5."},
]
TOOLS = [CALC_SCHEMA]
TOOL_DELTA = (
    "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def decode_spans(tokenizer, sample, value: int) -> list[str]:
    spans = mask_spans(sample.response_ids, sample.response_mask, value)
    return [tokenizer.decode(s, skip_special_tokens=False) for s in spans]


def up_to_last_eot(text: str) -> str:
    """A render without the separator after its last end-of-turn (never sampled)."""
    return text[: text.rfind(EOT) + len(EOT)]


def test_chatml_conversation_is_one_tokenization_of_the_full_render(smollm2):
    sample = encode_conversation(smollm2, CONVERSATION, TOOLS)
    full = smollm2.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    ids = sample.prompt_ids + sample.response_ids
    assert ids == smollm2.encode(up_to_last_eot(full), add_special_tokens=False)
    prompt = smollm2.apply_chat_template(
        CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert smollm2.decode(sample.prompt_ids, skip_special_tokens=False) == prompt
    assert decode_spans(smollm2, sample, 1) == [
        f"Let me add.\n{CALL}{EOT}",
        f"The answer is 5.{EOT}",
    ]
    assert decode_spans(smollm2, sample, 0) == [TOOL_DELTA]  # tool text, separator, header


def test_qwen3_turns_keep_the_think_block_they_were_generated_with(qwen3):
    """Documented rule: the Qwen3 template gives the turn being generated a <think> block
    (empty here) and drops it from earlier turns; the trajectory keeps it in every turn."""
    sample = encode_conversation(qwen3, CONVERSATION, TOOLS)
    think = "<think>\n\n</think>\n\n"
    assert decode_spans(qwen3, sample, 1) == [
        f"{think}Let me add.\n{CALL}{EOT}",
        f"{think}The answer is 5.{EOT}",
    ]
    assert decode_spans(qwen3, sample, 0) == [TOOL_DELTA]
    full = up_to_last_eot(qwen3.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False))
    first_turn = "<|im_start|>assistant\nLet me add."
    assert full.count(first_turn) == 1  # the full render dropped the earlier empty block
    expected = full.replace(first_turn, f"<|im_start|>assistant\n{think}Let me add.")
    ids = sample.prompt_ids + sample.response_ids
    assert ids == qwen3.encode(expected, add_special_tokens=False)


def test_qwen3_without_thinking_puts_the_empty_block_in_the_generation_prompt(qwen3):
    kwargs = {"enable_thinking": False}
    sample = encode_conversation(qwen3, CONVERSATION, TOOLS, chat_template_kwargs=kwargs)
    think = "<think>\n\n</think>\n\n"
    assert decode_spans(qwen3, sample, 1) == [f"Let me add.\n{CALL}{EOT}", f"The answer is 5.{EOT}"]
    assert decode_spans(qwen3, sample, 0) == [TOOL_DELTA + think]
    assert qwen3.decode(sample.prompt_ids, skip_special_tokens=False).endswith(
        f"<|im_start|>assistant\n{think}"
    )


@pytest.mark.parametrize("name", ["qwen3", "smollm2", "qwen3-no-thinking"])
async def test_sample_equals_the_rl_trajectory_of_the_same_conversation(name, request):
    tokenizer = request.getfixturevalue(name.split("-")[0])
    kwargs = {"enable_thinking": False} if name.endswith("no-thinking") else {}
    sample = encode_conversation(tokenizer, CONVERSATION, TOOLS, chat_template_kwargs=kwargs)
    # the model "samples" exactly the assistant turns; the calc tool answers 5
    turns = [text.removesuffix(EOT) for text in decode_spans(tokenizer, sample, 1)]
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        chat_template_kwargs=kwargs,
        multi_turn=MultiTurnConfig(),
    )
    loop = ToolAgentLoop(AgentLoopContext(server, tokenizer, config, {"calc": CalcTool()}))
    out = await loop.run({"temperature": 1.0}, raw_prompt=CONVERSATION[:2])
    assert out.record.tool_calls == 1 and out.record.stop_reason == "no_tool_call"
    assert out.prompt_ids == sample.prompt_ids
    assert out.response_ids == sample.response_ids
    assert out.response_mask == sample.response_mask
    # and the padded training batch is the one the RL trainer gets
    p, r = len(sample.prompt_ids) + 3, len(sample.response_ids) + 5
    rl = collate(
        [out],
        [{"uid": "u", "agent_name": "tool_agent"}],
        prompt_length=p,
        response_length=r,
        pad_token_id=0,
    )
    other = encode_conversation(tokenizer, CONVERSATION[:3], TOOLS, chat_template_kwargs=kwargs)
    other.prompt_ids = [7, 7, 7, *other.prompt_ids]  # a longer prompt so both pads show
    batch = collate_sft([sample, other], pad_token_id=0)
    width = len(sample.response_ids)
    assert batch.prompt_length == p and batch.response_length == width
    assert torch.equal(batch.input_ids[0], rl.input_ids[0, : p + width])
    assert torch.equal(batch.attention_mask[0], rl.attention_mask[0, : p + width])
    assert torch.equal(batch.position_ids[0], rl.position_ids[0, : p + width])
    assert torch.equal(batch.response_mask[0], rl.response_mask[0, :width])


def test_later_user_turns_are_deltas_and_trailing_messages_are_left_out(smollm2):
    messages = [
        *CONVERSATION,
        {"role": "user", "content": "And 1 + 1?"},
        {"role": "assistant", "content": "2."},
        {"role": "user", "content": "Thanks!"},  # nothing to learn after the last answer
    ]
    sample = encode_conversation(smollm2, messages, TOOLS)
    full = smollm2.apply_chat_template(messages[:-1], tools=TOOLS, tokenize=False)
    ids = sample.prompt_ids + sample.response_ids
    assert ids == smollm2.encode(up_to_last_eot(full), add_special_tokens=False)
    assert decode_spans(smollm2, sample, 1)[-1] == f"2.{EOT}"
    assert decode_spans(smollm2, sample, 0)[-1] == (
        "\n<|im_start|>user\nAnd 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    )


BAD_ROWS = [
    (
        {"prompt": "hi"},
        "d.jsonl: row 1 has no 'messages' (chat messages); set "
        "data.messages_key to the column holding them",
    ),
    ({"messages": "hi"}, "d.jsonl: row 1: 'messages' must be a list of chat messages"),
    ({"messages": [{"content": "hi"}]}, "d.jsonl: row 1: message 0 has no 'role'"),
    (
        {"messages": [{"role": "user", "content": "hi"}]},
        "d.jsonl: row 1 has no assistant message: there is nothing to train on",
    ),
    (
        {"messages": [{"role": "assistant", "content": "hi"}]},
        "d.jsonl: row 1 starts with an assistant message: the messages before the first "
        "assistant message are the prompt (add the user message)",
    ),
    (
        {"messages": CONVERSATION, "tools": "[{"},
        "d.jsonl: row 1: 'tools' is not valid JSON (Expecting property name enclosed in "
        "double quotes)",
    ),
    (
        {"messages": CONVERSATION, "tools": {"name": "calc"}},
        "d.jsonl: row 1: 'tools' must be a list of OpenAI function schemas (or its JSON string)",
    ),
    (
        {"messages": [{**CONVERSATION[0], "weight": 0}, *CONVERSATION[1:]]},
        "d.jsonl: row 1: message 0 (system) has a weight; only assistant messages take one",
    ),
    (
        {"messages": [*CONVERSATION[:4], {**CONVERSATION[4], "weight": 0.5}]},
        "d.jsonl: row 1: message 4 has weight 0.5; an assistant message's weight is 0 (kept in "
        "the conversation, not trained) or 1 (trained)",
    ),
    (
        {"messages": [*CONVERSATION[:4], {**CONVERSATION[4], "weight": True}]},
        "d.jsonl: row 1: message 4 has weight True; an assistant message's weight is 0 (kept in "
        "the conversation, not trained) or 1 (trained)",
    ),
    (
        {
            "messages": [
                *CONVERSATION[:2],
                {**CONVERSATION[2], "weight": 0},
                CONVERSATION[3],
                {**CONVERSATION[4], "weight": 0},
            ]
        },
        "d.jsonl: row 1: every assistant message has weight 0: there is nothing to train on",
    ),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_bad_rows_fail_naming_the_row(row, message, smollm2):
    rows = [{"messages": CONVERSATION}, row]
    with pytest.raises(ValueError) as info:
        encode_rows(rows, smollm2, max_length=4096, source="d.jsonl")
    assert str(info.value) == message


def test_an_assistant_message_of_weight_0_stays_in_the_trajectory_untrained(smollm2):
    """OpenAI's fine-tuning ``weight``: the first turn (the call) is kept, mask 0; the same ids
    as without the key, and weight 1 is the default."""
    plain = encode_conversation(smollm2, CONVERSATION, TOOLS)
    weighted = [*CONVERSATION[:2], {**CONVERSATION[2], "weight": 0}, *CONVERSATION[3:]]
    sample = encode_conversation(smollm2, weighted, TOOLS)
    assert sample.prompt_ids == plain.prompt_ids and sample.response_ids == plain.response_ids
    assert decode_spans(smollm2, sample, 1) == [f"The answer is 5.{EOT}"]
    assert decode_spans(smollm2, sample, 0) == [f"Let me add.\n{CALL}{EOT}{TOOL_DELTA}"]
    ones = [*CONVERSATION[:4], {**CONVERSATION[4], "weight": 1}]
    assert encode_conversation(smollm2, ones, TOOLS).response_mask == plain.response_mask


def test_tools_may_be_a_json_string_and_keys_are_configurable():
    row = {"conv": CONVERSATION, "schemas": json.dumps(TOOLS)}
    assert conversation_of(row, 0, "conv", "schemas") == (CONVERSATION, TOOLS)
    assert conversation_of({"conv": CONVERSATION}, 0, "conv", "schemas") == (CONVERSATION, None)


def test_long_conversations_are_dropped_and_counted(smollm2, caplog):
    short = {"messages": CONVERSATION[:3], "tools": TOOLS}
    long = {"messages": [CONVERSATION[1], {"role": "assistant", "content": "word " * 400}]}
    limit = len(encode_conversation(smollm2, short["messages"], TOOLS))
    with caplog.at_level(logging.WARNING):
        kept = encode_rows([short, long, short], smollm2, max_length=limit, source="d.jsonl")
    assert len(kept) == 2 and all(len(s) == limit for s in kept)
    assert f"d.jsonl: dropped 1 of 3 conversations over data.max_length={limit} tokens" in (
        caplog.text
    )
    with pytest.raises(ValueError) as info:
        encode_rows([long], smollm2, max_length=limit, source="d.jsonl")
    assert str(info.value) == (
        f"no conversations left in d.jsonl (1 read) after dropping those over "
        f"data.max_length={limit} tokens: raise it"
    )

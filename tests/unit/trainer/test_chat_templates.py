"""The project's chat templates render the Qwen3 / Hermes tool format exactly."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TOOLS_JSON = (
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, '
    '"b": {"type": "integer"}}, "required": ["a", "b"]}}}'
)
TOOLS_BLOCK = (
    "# Tools\n\nYou can call the functions below to help with the user's request.\n\n"
    "The available functions are described by the JSON schemas inside <tools></tools>:\n"
    f"<tools>\n{TOOLS_JSON}\n</tools>\n\n"
    "To call a function, write one JSON object with the function name and its arguments "
    "inside <tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

CONVERSATION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What are 2+3 and 4+5?"},
    {
        "role": "assistant",
        "content": "<think>\nTwo sums.\n</think>\n\nLet me add them.",
        "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}},
        ],
    },
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "9"},
    {"role": "assistant", "content": "<think>\nBoth done.\n</think>\n\n5 and 9."},
]

QWEN3_EXPECTED = (
    f"<|im_start|>system\nYou are a careful calculator.\n\n{TOOLS_BLOCK}<|im_end|>\n"
    "<|im_start|>user\nWhat are 2+3 and 4+5?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nTwo sums.\n</think>\n\nLet me add them.\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
    "<tool_response>\n9\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\nBoth done.\n</think>\n\n5 and 9.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def test_qwen3_template_renders_tool_conversation_exactly(qwen3):
    text = qwen3.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text == QWEN3_EXPECTED


def test_qwen3_generation_prompt_ends_with_assistant_header(qwen3):
    text = qwen3.apply_chat_template(
        CONVERSATION[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text.endswith(
        "<|im_start|>user\nWhat are 2+3 and 4+5?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_enable_thinking_false_adds_empty_think_block(qwen3):
    text = qwen3.apply_chat_template(
        CONVERSATION[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_drops_think_blocks_before_the_last_user_query(qwen3):
    history = CONVERSATION + [{"role": "user", "content": "Thanks!"}]
    text = qwen3.apply_chat_template(
        history, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert "<think>" not in text
    assert "<|im_start|>assistant\nLet me add them.\n<tool_call>" in text
    assert text.endswith(
        "<|im_start|>assistant\n5 and 9.<|im_end|>\n"
        "<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_without_system_or_tools_has_no_system_turn(qwen3):
    text = qwen3.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"


def test_qwen3_tools_without_system_message(qwen3):
    text = qwen3.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=TOOLS, tokenize=False
    )
    assert text == f"<|im_start|>system\n{TOOLS_BLOCK}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_qwen3_template_tokens_use_single_special_ids(qwen3):
    ids = qwen3.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, return_dict=False)
    for marker in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>"):
        assert qwen3.convert_tokens_to_ids(marker) in ids


def test_smollm2_template_renders_tools_and_default_system(smollm2):
    text = smollm2.apply_chat_template(
        CONVERSATION[1:], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    expected = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        f"\n\n{TOOLS_BLOCK}<|im_end|>\n"
        "<|im_start|>user\nWhat are 2+3 and 4+5?<|im_end|>\n"
        # SmolLM2 is not a reasoning model: assistant text is kept verbatim.
        "<|im_start|>assistant\n<think>\nTwo sums.\n</think>\n\nLet me add them.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n9\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nBoth done.\n</think>\n\n5 and 9.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected


def test_smollm2_plain_chat_matches_its_original_format(smollm2):
    text = smollm2.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )

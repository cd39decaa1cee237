"""Qwen2.5 is the hermes format: detected from its template, turns end with <|im_end|> though
the tokenizer's eos is <|endoftext|>, exact deltas (property test) and a ToolAgentLoop run on
the project's Qwen2.5 template."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, encode_delta
from agentloop.formats import detect_format, end_tokens, get_format
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import (
    FAMILY_TOKENS,
    decode,
    family_tokenizer,
    property_settings,
    template_text,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

SPECIAL = FAMILY_TOKENS["qwen25"].special
END = "<|im_end|>"
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
HERMES = get_format("hermes")
PROPERTY = property_settings(40)


@pytest.fixture(scope="module")
def qwen25(tiny_qwen3_path):
    return family_tokenizer(tiny_qwen3_path, "qwen25")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def full_ids(tokenizer, messages, tools=None, *, add_generation_prompt=True) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )


def test_qwen25_template_is_detected_as_hermes_and_ends_turns_with_im_end(qwen25):
    assert detect_format(template_text("qwen25")) == "hermes"
    ends = end_tokens(qwen25, HERMES)
    assert qwen25.eos_token == "<|endoftext|>"
    assert ends.strings == (END,)
    assert ends.ids == ends.call_ids == frozenset([qwen25.convert_tokens_to_ids(END)])


def test_the_template_writes_the_default_system_prompt_tools_calls_and_grouped_results(qwen25):
    messages = [
        {"role": "user", "content": "Add"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"a": 1, "b": 2}}},
                {"type": "function", "function": {"name": "calc", "arguments": {"a": 3, "b": 4}}},
            ],
        },
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "7"},
    ]
    text = qwen25.apply_chat_template(
        messages, tools=[CALC_SCHEMA], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}\n\n# Tools\n\nYou may call one or more functions "
        "to assist with the user query.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{json.dumps(CALC_SCHEMA)}\n</tools>\n\nFor each "
        "function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nAdd<|im_end|>\n"
        f"<|im_start|>assistant\nSure.\n{call('calc', a=1, b=2)}\n{call('calc', a=3, b=4)}"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response>\n"
        "<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    plain = qwen25.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
        tokenize=False,
    )
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


# ---- property: prompt + sampled + deltas == full tokenization --------------------------------
texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
            st.sampled_from(["<tool_call>", "</tool_response>", "<|im_start", "\n", "  ", "é"]),
        ),
        max_size=5,
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)))
    .filter(lambda t: not any(s in t for s in SPECIAL))
)


def sampled_start(text: str) -> bool:
    """A sampled turn's first token never merges with the header's newline, while a whole
    render's tokenization would merge it with leading whitespace: such turns are not
    comparable with a full re-tokenization."""
    return not text[:1].isspace() or re.match(r" \S", text) is not None


@st.composite
def conversations(draw) -> tuple[list[dict], list[dict] | None, list]:
    """(prompt, tools, rounds); a round is (sampled text, new messages or None when final)."""
    prompt: list[dict[str, Any]] = []
    if draw(st.booleans()):
        prompt.append({"role": "system", "content": draw(texts)})
    prompt.append({"role": "user", "content": draw(texts)})
    tools = [CALC_SCHEMA] if draw(st.booleans()) else None
    rounds = []
    n_turns = draw(st.integers(1, 4))
    for i in range(n_turns):
        n_calls = draw(st.integers(0, 3))
        blocks = [call("calc", a=draw(st.integers(0, 9)), b=1) for _ in range(n_calls)]
        prose = draw(texts.filter(sampled_start))
        text = "\n".join([prose, *blocks] if prose else blocks)
        new = [{"role": "tool", "content": draw(texts)} for _ in range(n_calls)]
        if not n_calls or draw(st.booleans()):
            new.append({"role": "user", "content": draw(texts)})
        final = i == n_turns - 1 and draw(st.booleans())
        rounds.append((text, None if final else new))
    return prompt, tools, rounds


@PROPERTY
@given(conversation=conversations())
def test_prompt_sampled_ids_and_deltas_equal_the_full_tokenization(qwen25, conversation):
    prompt, tools, rounds = conversation
    ends = end_tokens(qwen25, HERMES)
    ids = full_ids(qwen25, prompt, tools)
    response: list[int] = []
    mask: list[int] = []
    history = list(prompt)
    for text, new in rounds:
        sampled = qwen25.encode(text + END, add_special_tokens=False)
        response += sampled
        mask += [1] * len(sampled)
        history.append(HERMES.assistant_message(text, HERMES.new_parser().parse(text)))
        if new is None:
            break
        delta = encode_delta(
            qwen25, history, new, tools, eot_token=ends.strings, head=len(prompt), check=True
        )
        response += delta
        mask += [0] * len(delta)
        history += new
    final = rounds[-1][1] is None
    expected = full_ids(qwen25, history, tools, add_generation_prompt=not final)
    # a final turn's render ends with the separator after <|im_end|>, never sampled
    assert ids + response == (expected[:-1] if final else expected)
    if final:
        assert decode(qwen25, expected[-1:]) == "\n"
    spans = [decode(qwen25, s) for s in mask_spans(response, mask, 1)]
    assert spans == [text + END for text, _ in rounds]


# ---- the agent loop --------------------------------------------------------------------------
async def test_tool_agent_loop_runs_two_tool_turns_then_answers(qwen25):
    turns = [call("calc", a=2, b=3), f"Next.\n{call('calc', a=5, b=1)}", "It is 6."]
    server = ScriptedServer(qwen25, turns, end_token=END)
    config = RolloutConfig(prompt_length=1024, response_length=512, multi_turn=MultiTurnConfig())
    loop = ToolAgentLoop(AgentLoopContext(server, qwen25, config, {"calc": CalcTool()}))
    prompt = [{"role": "user", "content": "What is 2 + 3 + 1?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)

    tools = [CALC_SCHEMA]
    history = [*prompt, {"role": "assistant", "content": turns[0]}]
    delta1 = encode_delta(qwen25, history, [{"role": "tool", "content": "5"}], tools, eot_token=END)
    history += [{"role": "tool", "content": "5"}, {"role": "assistant", "content": turns[1]}]
    delta2 = encode_delta(qwen25, history, [{"role": "tool", "content": "6"}], tools, eot_token=END)

    s = server.sampled
    assert out.prompt_ids == full_ids(qwen25, prompt, tools)
    assert out.response_ids == s[0] + delta1 + s[1] + delta2 + s[2]
    tool_turn = "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
    assert decode(qwen25, delta1) == tool_turn.format(5) + "<|im_start|>assistant\n"
    assert decode(qwen25, delta2) == tool_turn.format(6) + "<|im_start|>assistant\n"
    spans = [decode(qwen25, span) for span in mask_spans(out.response_ids, out.response_mask, 1)]
    assert spans == [t + END for t in turns]
    end_id = qwen25.convert_tokens_to_ids(END)
    assert all(end_id in r["stop_token_ids"] for r in server.requests)
    assert out.record.stop_reason == "no_tool_call" and out.record.tool_calls == 2

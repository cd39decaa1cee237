"""The mistral format: parser (v3 JSON lists and v11 ``name[ARGS]{...}`` calls), end tokens,
template detection, the history messages the template needs (9-alphanumeric ids, result
content as mistral_common writes it), exact deltas over random tool conversations, the
documented rewrite (tool list and system prompt move to a new user message), one
``ToolAgentLoop`` run, and the test template against mistral_common's own renderer."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jinja2 import TemplateError
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import detect_format, end_tokens, get_format
from agentloop.formats.mistral import MistralToolParser, mistral_tool_content
from agentloop.parsers import ToolCall, ToolCallError
from agentloop.tokens import TemplateDeltaError, encode_delta, encode_prompt, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import (
    FAMILY_TOKENS,
    decode,
    family_tokenizer,
    property_settings,
    render,
    template_text,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

SPECIAL = FAMILY_TOKENS["mistral"].special
FMT = get_format("mistral")
HINT = (
    'write a JSON list of {"name": <tool name>, "arguments": {...}} objects right after the '
    "tool-calls token"
)
PROPERTY = property_settings(80)


@pytest.fixture(scope="module")
def tok(tiny_qwen3_path):
    return family_tokenizer(tiny_qwen3_path, "mistral")


def calls(*objects: dict[str, Any]) -> str:
    return "[TOOL_CALLS] " + json.dumps(list(objects))


def history_for(text: str, results: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assistant message and tool messages the loop builds for a sampled turn."""
    parsed = MistralToolParser().parse(text)
    assistant = FMT.assistant_message(text, parsed)
    tools = [
        FMT.tool_message(result, item, i, assistant)
        for i, (result, item) in enumerate(zip(results, parsed.items, strict=True))
    ]
    return assistant, tools


# ---- parser ------------------------------------------------------------------------------------
def test_single_call_in_a_v3_list():
    parsed = MistralToolParser().parse(calls({"name": "calc", "arguments": {"a": 2, "b": 3}}))
    assert parsed.content == ""
    assert parsed.items == [
        ToolCall("calc", {"a": 2, "b": 3}, '{"name": "calc", "arguments": {"a": 2, "b": 3}}')
    ]


def test_several_calls_keep_their_order_and_the_text_around_them():
    text = (
        'Let me check.[TOOL_CALLS] [{"name": "a", "arguments": {"s": "x, ]}"}}, '
        '{"name": "b", "arguments": {}, "id": "abcDEF123"}] done'
    )
    parsed = MistralToolParser().parse(text)
    assert [(c.name, c.arguments) for c in parsed.items] == [("a", {"s": "x, ]}"}), ("b", {})]
    assert parsed.content == "Let me check. done"


def test_a_malformed_call_is_one_error_and_the_others_are_kept():
    text = (
        '[TOOL_CALLS] [{"name": "calc", "arguments": {"a": 1}}, '
        '{"name": "calc", "arguments": {"a": 1 2}}, {"arguments": {}}, '
        '{"name": "calc", "arguments": [1]}, {"name": "calc", "arguments": {"b": 2}}]'
    )
    items = MistralToolParser().parse(text).items
    assert [type(i).__name__ for i in items] == [
        "ToolCall",
        "ToolCallError",
        "ToolCallError",
        "ToolCallError",
        "ToolCall",
    ]
    assert [(e.kind, e.message) for e in items if isinstance(e, ToolCallError)] == [
        ("bad_json", f"tool call 2 is not valid JSON (Expecting ',' delimiter at char 38); {HINT}"),
        ("missing_name", f'tool call 3 has no "name"; {HINT}'),
        ("bad_arguments", "arguments of tool call 4 (calc) must be a JSON object, got an array"),
    ]
    assert items[4].arguments == {"b": 2}


def test_v11_calls_each_after_their_own_token():
    text = (
        '[TOOL_CALLS]calc[ARGS]{"a": 1}[TOOL_CALLS]calc[CALL_ID]abcdefghi[ARGS]{"a": 2}'
        "[TOOL_CALLS]calc[ARGS]{'a': 3,}[TOOL_CALLS][ARGS]{}[TOOL_CALLS]calc[ARGS][1]"
    )
    items = MistralToolParser().parse(text).items
    assert [(i.name, i.arguments) for i in items[:3]] == [
        ("calc", {"a": 1}),
        ("calc", {"a": 2}),
        ("calc", {"a": 3}),
    ]
    assert items[1].raw == 'calc[CALL_ID]abcdefghi[ARGS]{"a": 2}' and items[2].repaired
    assert [(e.kind, e.message) for e in items[3:]] == [
        ("missing_name", "tool call 4 has no name"),
        ("bad_arguments", "arguments of tool call 5 (calc) must be a JSON object, got an array"),
    ]


def test_repair_on_and_off():
    text = "[TOOL_CALLS] [{'name': 'calc', 'arguments': {'a': 1,}},]"
    (call,) = MistralToolParser().parse(text).items
    assert (call.name, call.arguments, call.repaired) == ("calc", {"a": 1}, True)
    strict = MistralToolParser(repair=False).parse(text).items
    assert [(e.kind, e.message) for e in strict] == [
        (
            "bad_json",
            "tool call 1 is not valid JSON (Expecting property name enclosed in double quotes "
            f"at char 1); {HINT}",
        ),
        ("bad_json", f"tool call 2 is empty (a stray comma); {HINT}"),
    ]
    args = "[TOOL_CALLS]calc[ARGS]{'a': 1}"
    assert MistralToolParser(repair=False).parse(args).items[0].message == (
        "arguments of tool call 1 (calc) are not valid JSON "
        "(Expecting property name enclosed in double quotes at char 1)"
    )


def test_an_unclosed_list_at_the_end_of_the_turn_is_still_read():
    parsed = MistralToolParser().parse('[TOOL_CALLS] [{"name": "calc", "arguments": {"a": 1}')
    assert parsed.items[0].arguments == {"a": 1} and parsed.items[0].repaired


def test_no_call_an_empty_list_and_a_bare_token():
    assert MistralToolParser().parse("The answer is 5.").items == []
    assert MistralToolParser().parse("[TOOL_CALLS] []").items == []
    (error,) = MistralToolParser().parse("[TOOL_CALLS]").items
    assert (error.kind, error.message) == (
        "bad_json",
        f"the tool-calls token is not followed by a call; {HINT}",
    )
    (error,) = MistralToolParser().parse("[TOOL_CALLS] sure").items
    assert error.kind == "bad_json" and error.raw == "sure"


# ---- end tokens and detection ------------------------------------------------------------------
def test_end_tokens_are_the_eos_closing_every_turn(tok):
    ends = end_tokens(tok, FMT)
    eos = tok.convert_tokens_to_ids("</s>")
    assert ends.strings == ("</s>",)
    assert ends.ids == ends.call_ids == frozenset({eos})
    assert not ends.opens_next


def test_detect_format(tiny_qwen3_path):
    assert detect_format(template_text("mistral")) == "mistral"
    qwen = AutoTokenizer.from_pretrained(tiny_qwen3_path).chat_template
    assert detect_format(qwen) != "mistral"


# ---- history messages --------------------------------------------------------------------------
def test_assistant_message_gives_every_item_a_call_with_a_nine_character_id():
    text = calls(
        {"name": "calc", "arguments": {"a": 1}, "id": "abcDEF123"},
        {"name": "calc", "arguments": {"a": 2}, "id": "abcDEF123"},  # reused: replaced
        {"arguments": {}},
        {"name": "nope", "arguments": {"a": 1}, "id": "short"},
    )
    assistant, tools = history_for(text, ["3", "4", "Error: no name", "Error: unknown"])
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert ids[0] == "abcDEF123"
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == 4
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == [
        "calc",
        "calc",
        "invalid_call",
        "nope",
    ]
    assert assistant["tool_calls"][2]["function"]["arguments"] == {}
    assert [t["tool_call_id"] for t in tools] == ids
    assert history_for(text, ["3", "4", "e", "e"])[0] == assistant  # deterministic


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("5", "5"),
        ("hello", '"hello"'),
        ('{ "a":1 }', '{"a": 1}'),
        ("", "{}"),
        ('Error: bad "x"', '"Error: bad \\"x\\""'),
        ("日本", '"日本"'),
    ],
)
def test_tool_content_is_the_json_value_mistral_common_writes(content, expected):
    assert mistral_tool_content(content) == expected


def test_template_rejects_call_ids_that_are_not_nine_alphanumerics(tok):
    bad = {
        "role": "assistant",
        "tool_calls": [{"id": "call_1", "function": {"name": "calc", "arguments": {}}}],
    }
    with pytest.raises(TemplateError, match="9 alphanumeric"):
        render(tok, [{"role": "user", "content": "hi"}, bad])


# ---- exact deltas ------------------------------------------------------------------------------
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "What is 2 + 3?"}
TOOLS = [CALC_SCHEMA]
CALC = {"name": "calc", "arguments": {"a": 2, "b": 3}}


def test_tool_delta_is_the_results_right_after_the_eos(tok):
    assistant, tool_msgs = history_for(calls(CALC, {"name": "calc"}), ["5", "Error: b missing"])
    ids = [c["id"] for c in assistant["tool_calls"]]
    delta = encode_delta(tok, [SYSTEM, USER, assistant], tool_msgs, TOOLS, eot_token="</s>")
    assert decode(tok, delta) == (
        f'[TOOL_RESULTS] {{"content": 5, "call_id": "{ids[0]}"}}[/TOOL_RESULTS]'
        f'[TOOL_RESULTS] {{"content": "Error: b missing", "call_id": "{ids[1]}"}}'
        "[/TOOL_RESULTS]"
    )


def test_a_new_user_message_moves_the_tool_list_and_system_prompt(tok):
    assistant, tool_msgs = history_for(calls(CALC), ["5"])
    history = [SYSTEM, USER, assistant, *tool_msgs, {"role": "assistant", "content": "5."}]
    new = [{"role": "user", "content": "And 4 + 4?"}]
    delta = encode_delta(
        tok, history, new, TOOLS, eot_token="</s>", history_rewrite=FMT.history_rewrite
    )
    tools_block = render(tok, [USER], TOOLS).split("[INST]")[0].removeprefix("<s>")
    assert tools_block.startswith("[AVAILABLE_TOOLS] [") and tools_block.endswith("]")
    assert decode(tok, delta) == f"{tools_block}[INST] Be brief.\n\nAnd 4 + 4?[/INST]"
    before = render(tok, history, TOOLS)
    after = render(tok, [*history, *new], TOOLS)
    assert "Be brief." in before.split("[/INST]")[0] and tools_block in before.split("[INST]")[0]
    assert after.startswith("<s>[INST] What is 2 + 3?[/INST]")  # moved out of the history
    with pytest.raises(TemplateDeltaError, match="rewrites history"):
        encode_delta(tok, history, new, TOOLS, eot_token="</s>")  # the default rewrite


# ---- property: sampled ids + deltas == the full tokenization --------------------------------
def no_special(text: str) -> bool:
    return not any(token in text for token in SPECIAL)


MARKUP = ["[INST", "TOOL_CALLS]", "</", "<s", "[", "]", "{", "}", '"', "\\", "\n", "\n\n", " "]
texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
            st.sampled_from(MARKUP + ["é", "日本語", "🙂", "42", '{"k": [1, 2]}']),
        ),
        max_size=5,
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)))
    .filter(no_special)
)
names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
arguments = st.dictionaries(names, st.one_of(st.integers(), texts, st.booleans()), max_size=3)


@st.composite
def call_texts(draw) -> str:
    """One sampled call-list item: a call, or a malformed one."""
    kind = draw(st.sampled_from(["call", "call", "call", "bad_json", "no_name", "id"]))
    if kind == "bad_json":
        return '{"name": "f", "arguments": {"a": 1 2}}'
    if kind == "no_name":
        return json.dumps({"arguments": draw(arguments)})
    obj: dict[str, Any] = {"name": draw(names), "arguments": draw(arguments)}
    if kind == "id":
        obj["id"] = draw(st.from_regex(r"[A-Za-z0-9]{9}", fullmatch=True))
    return json.dumps(obj, ensure_ascii=draw(st.booleans()))


@st.composite
def conversations(draw) -> tuple[list[dict], list[dict] | None, list[tuple[str, list, bool]]]:
    """(prompt, tools, rounds); a round is (sampled text, tool results, new user or not)."""
    first: list[dict[str, Any]] = []
    if draw(st.booleans()):
        first.append({"role": "system", "content": "sys-" + draw(texts)})
    first.append({"role": "user", "content": draw(texts)})
    tools = None
    if draw(st.booleans()):
        tools = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": draw(texts),
                    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
                },
            }
            for name in draw(st.lists(names, min_size=1, max_size=3))
        ]
    rounds = []
    n = draw(st.sampled_from([3, 2, 4, 1]))
    users = draw(st.booleans())  # without: tool turns only, as tool_agent runs them
    for i in range(n):
        least = 0 if users or i == n - 1 else 1
        items = draw(st.lists(call_texts(), min_size=least, max_size=3))
        if items:
            text = draw(st.sampled_from(["", "Let me see."])) + "[TOOL_CALLS] ["
            text += ", ".join(items) + "]"
            results = [draw(texts) for _ in items]
            user = users and draw(st.booleans())
        else:
            text, results, user = draw(texts), [], i < n - 1
        rounds.append((text, results, user))
    return first, tools, rounds


def strip_moved(text: str, system: str | None, tools_block: str | None) -> str:
    """The trajectory's text with the tool list and system prompt kept only where the full
    render has them (before/in the last user message)."""
    if tools_block:
        text = text.replace(tools_block, "", text.count(tools_block) - 1)
    if system:
        prefix = f"[INST] {system}\n\n"
        text = text.replace(prefix, "[INST] ", text.count(prefix) - 1)
    return text


@PROPERTY
@given(conversation=conversations())
def test_sampled_ids_plus_deltas_equal_the_full_tokenization(tok, conversation):
    first, tools, rounds = conversation
    ends = end_tokens(tok, FMT)
    ids = encode_prompt(tok, first, tools=tools)
    prompt_len = len(ids)
    mask: list[int] = []
    sampled_texts: list[str] = []
    history = list(first)
    new_users = 0
    for i, (text, results, user) in enumerate(rounds):
        if results:
            assistant, new = history_for(text, results)
        else:
            assistant, new = {"role": "assistant", "content": text}, []
        if user:
            new.append({"role": "user", "content": f"user-{i}"})
            new_users += 1
        before = render(tok, history, tools)
        with_turn = render(tok, [*history, assistant], tools)
        assert with_turn.startswith(before)
        sampled = with_turn[len(before) :]  # the turn as the model wrote it, eos included
        assert sampled.endswith("</s>")
        sampled_texts.append(sampled)
        turn_ids = tok.encode(sampled, add_special_tokens=False)
        ids += turn_ids
        mask += [1] * len(turn_ids)
        history.append(assistant)
        if not new:
            break
        delta = encode_delta(
            tok,
            history,
            new,
            tools,
            eot_token=ends.strings,
            head=len(first),
            check=True,
            history_rewrite=FMT.history_rewrite,
        )
        assert tok.decode(delta[:1]).startswith("[")  # a special token follows the eos
        ids += delta
        mask += [0] * len(delta)
        history += new

    full_text = render(tok, history, tools)
    if new_users == 0:
        assert ids == tok.apply_chat_template(
            history, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    else:
        system = first[0]["content"] if first[0]["role"] == "system" else None
        tools_block = render(tok, first[-1:], tools).split("[INST]")[0][3:] if tools else None
        assert strip_moved(decode(tok, ids), system, tools_block) == full_text
    response = ids[prompt_len:]
    spans = [decode(tok, s) for s in mask_spans(response, mask, 1)]
    assert spans == sampled_texts


# ---- one rollout ---------------------------------------------------------------------------
TURNS = [
    calls({"name": "calc", "arguments": {"a": 2, "b": 3}}),
    "Now add 1."
    + calls({"name": "calc", "arguments": {"a": 5, "b": 1}})[:-1]
    + ', {"name": "calc", "arguments": {"a": 1 2}}]',
    "The answer is 6.",
]


async def test_tool_agent_rollout_is_prompt_plus_sampled_turns_plus_result_deltas(tok):
    server = ScriptedServer(tok, list(TURNS), end_token="</s>")
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        multi_turn=MultiTurnConfig(format="mistral", max_parallel_calls=2),
    )
    loop = ToolAgentLoop(AgentLoopContext(server, tok, config, {"calc": CalcTool()}))
    prompt = [SYSTEM, {"role": "user", "content": "What is 2 + 3 + 1?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)

    assert out.prompt_ids == encode_prompt(tok, prompt, tools=TOOLS)
    history, deltas = list(prompt), []
    for text, results in zip(TURNS[:2], [["5"], ["6", None]], strict=True):
        parsed = MistralToolParser().parse(text)
        results = [r if r is not None else f"Error: {parsed.items[1].message}" for r in results]
        assistant, new = history_for(text, results)
        history.append(assistant)
        deltas.append(encode_delta(tok, history, new, TOOLS, eot_token="</s>"))
        history += new
    s = server.sampled
    assert out.response_ids == s[0] + deltas[0] + s[1] + deltas[1] + s[2]
    spans = [decode(tok, span) for span in mask_spans(out.response_ids, out.response_mask, 1)]
    assert spans == [t + "</s>" for t in TURNS]
    tool_text = [decode(tok, d) for d in mask_spans(out.response_ids, out.response_mask, 0)]
    result = r'\[TOOL_RESULTS\] \{"content": 5, "call_id": "\w{9}"}\[/TOOL_RESULTS\]'
    assert re.fullmatch(result, tool_text[0])
    assert '{"content": 6, "call_id": ' in tool_text[1]
    assert '"content": "Error: tool call 2 is not valid JSON' in tool_text[1]
    eos = tok.convert_tokens_to_ids("</s>")
    assert all(eos in r["stop_token_ids"] for r in server.requests)
    assert server.requests[2]["prompt_ids"] == out.prompt_ids + s[0] + deltas[0] + s[1] + deltas[1]
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_error_kinds == ["bad_json"] and out.record.tool_calls == 2


# ---- the official renderer ----------------------------------------------------------------
def official_ids(mistral_tokenizer, messages, tools) -> list[int]:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate({"messages": messages, "tools": tools})
    return mistral_tokenizer.encode_chat_completion(request).tokens


def template_as_official_ids(mistral_tokenizer, text: str) -> list[int]:
    """The test template's rendering in the official tokenizer's ids: special tokens as
    themselves, every text piece (which the template opens with the space SentencePiece
    writes as its dummy prefix) encoded on its own, as mistral_common encodes each part."""
    sp = mistral_tokenizer.instruct_tokenizer.tokenizer
    pattern = "(" + "|".join(re.escape(t) for t in SPECIAL if t != "[CALL_ID]") + ")"
    ids: list[int] = []
    for part in re.split(pattern, text):
        if part in SPECIAL:
            ids.append(sp.get_special_token(part))
        elif part:
            assert part.startswith(" "), part
            ids += sp.encode(part[1:], bos=False, eos=False)
    return ids


RAW_RESULTS = ["5", "not json: é", '{ "rows": [1, 2] }', ""]


def official_cases() -> list[tuple[list[dict], list[dict], list[dict]]]:
    """(ours, official, tools): our history messages and the same conversation as a client
    would send it to mistral_common (raw tool outputs)."""
    text = (
        calls(
            {"name": "calc", "arguments": {"a": 2, "b": 3}},
            {"name": "lookup", "arguments": {"q": 'naïve "quotes"'}, "id": "Q1w2E3r4T"},
        )[:-1]
        + ', {"name": "calc", "arguments": {"a": 1 2}}]'
    )
    assistant, tool_msgs = history_for(text, RAW_RESULTS[:3])
    raw = [{**m, "content": c} for m, c in zip(tool_msgs, RAW_RESULTS, strict=False)]
    assistant2, tool_msgs2 = history_for(calls(CALC), [""])
    raw2 = [{**tool_msgs2[0], "content": ""}]
    lookup = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find «things».",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    tools = [CALC_SCHEMA, lookup]
    answer = {"role": "assistant", "content": "  It is 5.  \n "}
    second = {"role": "user", "content": " And\n\nnow?"}
    base = [SYSTEM, USER, assistant]
    return [
        (base + tool_msgs, base + raw, tools),
        ([USER, assistant, *tool_msgs], [USER, assistant, *raw], tools),
        (base + tool_msgs + [answer, second], base + raw + [answer, second], tools),
        (
            base + tool_msgs + [answer, second, assistant2, *tool_msgs2],
            base + raw + [answer, second, assistant2, *raw2],
            tools,
        ),
        ([SYSTEM, USER, answer, second], [SYSTEM, USER, answer, second], []),
    ]


@pytest.mark.parametrize("case", range(5))
def test_test_template_matches_mistral_common_v3(tok, case):
    mistral = MistralTokenizer.v3()  # ships with the package (a vLLM dependency): no download
    ours, official, tools = official_cases()[case]
    text = render(tok, ours, tools or None)
    assert template_as_official_ids(mistral, text) == official_ids(mistral, official, tools)


@pytest.mark.parametrize(
    "result",
    [
        "Goethe",
        '{"born":"1749-08-28"}',
        '{\n  "born": "1749-08-28",\n  "places": ["Frankfurt", "Weimar"]\n}',
        "Johann Wolfgang von Göthe, «Faust» 日本 🙂",
    ],
)
def test_v3_tool_results_match_mistral_common_for_every_kind_of_result(tok, result):
    """Plain text, compact JSON, pretty JSON, non-ASCII: v3 writes each as a JSON value."""
    mistral = MistralTokenizer.v3()
    assistant, tool_msgs = history_for(calls(CALC), [result])
    raw = [{**tool_msgs[0], "content": result}]
    text = render(tok, [SYSTEM, USER, assistant, *tool_msgs], [CALC_SCHEMA])
    assert template_as_official_ids(mistral, text) == official_ids(
        mistral, [SYSTEM, USER, assistant, *raw], [CALC_SCHEMA]
    )
    value = json.loads(result) if result.startswith("{") else result
    assert f'{{"content": {json.dumps(value, ensure_ascii=False)}, "call_id"' in text

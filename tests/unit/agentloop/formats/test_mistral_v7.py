"""The mistral_v7 format (tokenizer v7 and later): the template selects it, also under
``multi_turn.format=mistral``; tool results go into the history as the tool returned them;
the v7 and v13 test templates equal mistral_common's v7/v11/v13 encoders token for token on
tool rounds with plain text, compact JSON, pretty JSON, non-ASCII and empty results; exact
deltas over random tool conversations per version; one ``ToolAgentLoop`` run."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import detect_format, end_tokens, get_format, resolve_format
from agentloop.formats.mistral import MistralToolParser
from agentloop.formats.mistral_v7 import MISTRAL_V7
from agentloop.tokens import encode_delta, encode_prompt, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import decode, family_tokenizer, property_settings, render, template_text
from tests.unit.agentloop.formats.mistral_official import (
    SPECIAL_V7,
    official_ids,
    tekken,
    template_as_official_ids,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

FMT = get_format("mistral_v7")
PROPERTY = property_settings(40)
# plain text, compact JSON, pretty JSON, non-ASCII, empty: each must stay as the tool wrote it
RESULTS = [
    "Goethe",
    '{"born":"1749-08-28"}',
    '{\n  "born": "1749-08-28",\n  "places": ["Frankfurt", "Weimar"]\n}',
    "Johann Wolfgang von Göthe, «Faust» 日本 🙂",
    "",
]
# test template -> the mistral_common encoders it is checked against
VERSIONS = {"mistral_v7": ("v7", "sp-v7", "v11"), "mistral_v13": ("v13",)}


@pytest.fixture(scope="module")
def toks(tiny_qwen3_path) -> dict[str, Any]:
    return {name: family_tokenizer(tiny_qwen3_path, name) for name in VERSIONS}


def calls(*objects: dict[str, Any]) -> str:
    return "[TOOL_CALLS][" + ", ".join(json.dumps(o, ensure_ascii=False) for o in objects) + "]"


def history_for(text: str, results: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assistant message and tool messages the loop builds for a sampled turn."""
    parsed = MistralToolParser().parse(text)
    assistant = FMT.assistant_message(text, parsed)
    tools = [
        FMT.tool_message(result, item, i, assistant)
        for i, (result, item) in enumerate(zip(results, parsed.items, strict=True))
    ]
    return assistant, tools


# ---- selection -------------------------------------------------------------------------------
def test_v7_and_later_templates_are_detected_as_mistral_v7_and_v3_stays_mistral():
    assert detect_format(template_text("mistral_v7")) == "mistral_v7"
    assert detect_format(template_text("mistral_v13")) == "mistral_v7"
    assert detect_format(template_text("mistral")) == "mistral"


def test_multi_turn_format_mistral_follows_the_template_version(toks, tiny_qwen3_path):
    v3 = family_tokenizer(tiny_qwen3_path, "mistral")
    assert resolve_format("mistral", v3).name == "mistral"
    assert resolve_format(None, v3).name == "mistral"
    for tok in toks.values():
        assert resolve_format("mistral", tok) is MISTRAL_V7
        assert resolve_format(None, tok) is MISTRAL_V7
    assert resolve_format("mistral_v7", v3) is MISTRAL_V7  # set explicitly: kept


def test_end_tokens_are_the_eos(toks):
    ends = end_tokens(toks["mistral_v7"], FMT)
    assert ends.strings == ("</s>",)
    assert ends.ids == ends.call_ids == {toks["mistral_v7"].convert_tokens_to_ids("</s>")}


# ---- history messages ------------------------------------------------------------------------
@pytest.mark.parametrize("result", RESULTS)
def test_tool_message_content_is_the_result_as_given(result):
    assistant, (tool,) = history_for(calls({"name": "lookup", "arguments": {"q": "x"}}), [result])
    assert tool == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "name": "lookup",
        "content": result,
    }


def test_the_issue_example_delta_is_id_then_content_unquoted(toks):
    turn = calls({"name": "lookup", "arguments": {"q": "Faust"}, "id": "abcDEF123"})
    for result, shown in [("Goethe", "Goethe"), ('{"born":"1749-08-28"}', None)]:
        assistant, new = history_for(turn, [result])
        history = [{"role": "user", "content": "Who wrote Faust?"}, assistant]
        delta = encode_delta(toks["mistral_v7"], history, new, [LOOKUP], eot_token="</s>")
        body = shown if shown is not None else result
        assert decode(toks["mistral_v7"], delta) == (
            f"[TOOL_RESULTS]abcDEF123[TOOL_CONTENT]{body}[/TOOL_RESULTS]"
        )
        delta = encode_delta(toks["mistral_v13"], history, new, [LOOKUP], eot_token="</s>")
        assert decode(toks["mistral_v13"], delta) == f"[TOOL_RESULTS]{body}[/TOOL_RESULTS]"


# ---- mistral_common, token for token ---------------------------------------------------------
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find «things».",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Who wrote Faust?"}


def official_cases() -> list[tuple[list[dict], list[dict]]]:
    """(history messages, tools): tool rounds answered with every kind of result."""
    first = calls(
        {"name": "lookup", "arguments": {"q": "Faust"}, "id": "Q1w2E3r4T"},
        {"name": "lookup", "arguments": {"q": 'naïve "quotes"'}},
        {"name": "calc", "arguments": {"a": 2, "b": 3}},
    )
    assistant, results = history_for(first, RESULTS[:3])
    second, results2 = history_for(calls({"name": "lookup", "arguments": {"q": "x"}}), RESULTS[3:4])
    third, results3 = history_for(calls({"name": "lookup", "arguments": {}}), RESULTS[4:])
    answer = {"role": "assistant", "content": "It is Goethe.  "}
    follow = {"role": "user", "content": " And\n\nnow?"}
    tools = [CALC_SCHEMA, LOOKUP]
    rounds = [assistant, *results, second, *results2, third, *results3]
    return [
        ([SYSTEM, USER, *rounds], tools),
        ([USER, *rounds, answer, follow], tools),
        ([SYSTEM, USER, *rounds, answer, follow, *rounds], tools),
        ([USER, answer, follow, SYSTEM, {**follow, "content": "Sure?"}], []),
    ]


@pytest.mark.parametrize(
    ("template", "version"),
    [(t, v) for t, versions in VERSIONS.items() for v in versions if v != "v11"],
)
@pytest.mark.parametrize("case", range(4))
def test_test_template_matches_mistral_common(toks, template, version, case):
    official = tekken(version)
    messages, tools = official_cases()[case]
    text = render(toks[template], messages, tools or None)
    assert template_as_official_ids(official, text) == official_ids(official, messages, tools)


@pytest.mark.parametrize("case", range(3))
def test_v11_writes_the_tool_results_as_v7_does(toks, case):
    """v11 changes how calls are written, not results: each [TOOL_RESULTS] span of its
    encoding equals the v7 test template's, mapped to the v11 ids."""
    v11 = tekken("v11")
    messages, tools = official_cases()[case]
    spans = re.compile(r"\[TOOL_RESULTS\].*?\[/TOOL_RESULTS\]", re.DOTALL)
    ours = [
        template_as_official_ids(v11, span)
        for span in spans.findall(render(toks["mistral_v7"], messages, tools))
    ]
    ids = official_ids(v11, messages, tools)
    start, end = v11.instruct_tokenizer.BEGIN_TOOL_RESULTS, v11.instruct_tokenizer.END_TOOL_RESULTS
    theirs, open_at = [], None
    for i, token in enumerate(ids):
        if token == start:
            open_at = i
        elif token == end and open_at is not None:
            theirs.append(ids[open_at : i + 1])
    assert ours == theirs and len(ours) == 5 * (1 + (case == 2))


# ---- property: sampled ids + deltas == the full tokenization --------------------------------
def no_special(text: str) -> bool:
    return not any(token in text for token in SPECIAL_V7)


MARKUP = ["[INST", "TOOL_CONTENT]", "</", "<s", "[", "]", "{", "}", '"', "\\", "\n", " "]
texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
            st.sampled_from(MARKUP + ["é", "日本語", "🙂", "42", '{"k":[1,2]}', '{\n "a": 1\n}']),
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
    kind = draw(st.sampled_from(["call", "call", "bad_json", "no_name", "id"]))
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
            {"type": "function", "function": {"name": n, "description": draw(texts)}}
            for n in draw(st.lists(names, min_size=1, max_size=2))
        ]
    rounds = []
    n = draw(st.sampled_from([3, 2, 4, 1]))
    users = draw(st.booleans())
    for i in range(n):
        least = 0 if users or i == n - 1 else 1
        items = draw(st.lists(call_texts(), min_size=least, max_size=3))
        if items:
            text = draw(st.sampled_from(["", "Let me see."])) + "[TOOL_CALLS][" + ", ".join(items)
            text += "]"
            results = [draw(st.one_of(texts, st.sampled_from(RESULTS))) for _ in items]
            user = users and draw(st.booleans())
        else:
            text, results, user = draw(texts), [], i < n - 1
        rounds.append((text, results, user))
    return first, tools, rounds


@pytest.mark.parametrize("template", sorted(VERSIONS))
@PROPERTY
@given(conversation=conversations())
def test_sampled_ids_plus_deltas_equal_the_full_tokenization(toks, template, conversation):
    tok = toks[template]
    first, tools, rounds = conversation
    ids = encode_prompt(tok, first, tools=tools)
    prompt_len, mask, sampled_texts, history = len(ids), [], [], list(first)
    for i, (text, results, user) in enumerate(rounds):
        if results:
            assistant, new = history_for(text, results)
        else:
            assistant, new = {"role": "assistant", "content": text}, []
        if user:
            new.append({"role": "user", "content": f"user-{i}"})
        before = render(tok, history, tools)
        with_turn = render(tok, [*history, assistant], tools)
        assert with_turn.startswith(before)
        sampled = with_turn[len(before) :]
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
            eot_token="</s>",
            head=len(first),
            check=True,
            history_rewrite=FMT.history_rewrite,
        )
        ids += delta
        mask += [0] * len(delta)
        history += new
    full = tok.apply_chat_template(
        history, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    tools_block = re.search(r"\[AVAILABLE_TOOLS].*?\[/AVAILABLE_TOOLS]", render(tok, first, tools))
    if template == "mistral_v7" and tools_block and ids != full:
        # the tool list moved to the last user message: kept where the model saw it
        text = decode(tok, ids)
        block = tools_block.group()
        assert text.replace(block, "", text.count(block) - 1) == render(tok, history, tools)
    else:
        assert ids == full
    spans = [decode(tok, s) for s in mask_spans(ids[prompt_len:], mask, 1)]
    assert spans == sampled_texts


# ---- one rollout ---------------------------------------------------------------------------
TURNS = [
    calls({"name": "calc", "arguments": {"a": 2, "b": 3}}),
    calls({"name": "calc", "arguments": {"a": 5, "b": 1}}),
    "The answer is 6.",
]


@pytest.mark.parametrize("configured", ["mistral", "mistral_v7", None])
async def test_tool_agent_rollout_writes_results_as_given(toks, configured):
    tok = toks["mistral_v7"]
    server = ScriptedServer(tok, list(TURNS), end_token="</s>")
    config = RolloutConfig(
        prompt_length=1024, response_length=512, multi_turn=MultiTurnConfig(format=configured)
    )
    loop = ToolAgentLoop(AgentLoopContext(server, tok, config, {"calc": CalcTool()}))
    prompt = [SYSTEM, {"role": "user", "content": "What is 2 + 3 + 1?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)
    assert out.prompt_ids == encode_prompt(tok, prompt, tools=[CALC_SCHEMA])
    spans = [decode(tok, span) for span in mask_spans(out.response_ids, out.response_mask, 1)]
    assert spans == [t + "</s>" for t in TURNS]
    tool_text = [decode(tok, d) for d in mask_spans(out.response_ids, out.response_mask, 0)]
    assert [re.sub(r"\w{9}\[TOOL_CONTENT\]", "ID:", t) for t in tool_text] == [
        "[TOOL_RESULTS]ID:5[/TOOL_RESULTS]",
        "[TOOL_RESULTS]ID:6[/TOOL_RESULTS]",
    ]
    assert out.record.stop_reason == "no_tool_call" and out.record.tool_calls == 2

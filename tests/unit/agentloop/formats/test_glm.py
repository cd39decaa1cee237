"""GLM-4.5 / GLM-4.6 (``glm45``): the parser, end tokens and template detection, the test
template against the format's facts, exact deltas when the end token the model samples is
the next header (``end_opens_next``; property test over random tool conversations), the
template's reasoning rewrite, and one ``tool_agent`` run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import detect_format, end_tokens, get_format, resolve_format
from agentloop.formats.glm import GLM45, GlmToolParser, empty_earlier_reasoning
from agentloop.parsers import ToolCall, ToolCallError, check_calls
from agentloop.tokens import TemplateDeltaError, encode_delta, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import decode, family_tokenizer, property_settings, render, template_text
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

LOOKUP_SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find pages (é).",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}, "tags": {"type": "array"}},
        },
    },
}
TOOLS = [CALC_SCHEMA, LOOKUP_SCHEMA]
SCHEMAS = {"calc": CALC_SCHEMA, "lookup": LOOKUP_SCHEMA}
HINT = (
    "write <tool_call>NAME, then <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> for each "
    "argument, then </tool_call>"
)
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "calc", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": '
    '"integer"}}, "required": ["a", "b"]}}}\n'
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)
PROPERTY = property_settings(50)


@pytest.fixture(scope="module")
def glm(tiny_qwen3_path):
    # tiny-qwen3's unk token is <|endoftext|>, one of GLM's end tokens: kept, not "unknown"
    return family_tokenizer(tiny_qwen3_path, "glm45")


def call(name: str, **arguments: Any) -> str:
    """A call as GLM writes it (and the template renders it)."""
    pairs = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else _json(v)}</arg_value>\n"
        for k, v in arguments.items()
    )
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def delta(tokenizer, history, new, tools=TOOLS, *, sampled_end, **kwargs) -> list[int]:
    return encode_delta(
        tokenizer,
        history,
        new,
        tools,
        eot_token=("<|observation|>", "<|user|>", "<|endoftext|>"),
        opens_next=True,
        sampled_end=sampled_end,
        history_rewrite=GLM45.history_rewrite,
        **kwargs,
    )


# ---- parser ----------------------------------------------------------------------------------
def test_single_call_with_reasoning_and_content():
    text = "\n<think>Add them.</think>\nLet me add.\n" + call("calc", a=2, b=3)
    parsed = GlmToolParser().parse(text)
    assert parsed.content == "<think>Add them.</think>\nLet me add."
    assert parsed.items == [
        ToolCall(
            name="calc",
            arguments={"a": 2, "b": 3},
            raw="calc\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n"
            "<arg_key>b</arg_key>\n<arg_value>3</arg_value>",
        )
    ]


def test_several_calls_in_order_and_calls_inside_reasoning_are_not_calls():
    text = (
        "\n<think>I could write "
        + call("calc", a=0, b=0)
        + " here.</think>\nTwo lookups.\n"
        + call("lookup", q="GLM 4.5", tags=["a", "é"])
        + "\n"
        + call("calc", a=1, b=-1)
        + "\n<tool_call>noargs\n</tool_call>"
    )
    parsed = GlmToolParser().parse(text)
    assert [(c.name, c.arguments) for c in parsed.items] == [
        ("lookup", {"q": "GLM 4.5", "tags": ["a", "é"]}),
        ("calc", {"a": 1, "b": -1}),
        ("noargs", {}),
    ]
    assert parsed.content.endswith("here.</think>\nTwo lookups.")
    assert parsed.errors == []


def test_glm47_layout_without_line_breaks_is_read():
    text = "<tool_call>calc<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b</arg_key>"
    text += "<arg_value>3</arg_value></tool_call>"
    (item,) = GlmToolParser().parse(text).items
    assert (item.name, item.arguments) == ("calc", {"a": 2, "b": 3})


def test_each_malformed_call_is_one_error_and_the_good_calls_are_kept_in_order():
    text = "\n".join(
        [
            call("calc", a=1, b=2),
            "<tool_call>\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
            call("calc", a=3, b=4),
            '<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call>',
            "<tool_call>calc\n<arg_key>a</arg_key>\n1\n</tool_call>",
            "<tool_call>calc\n<arg_key>a</arg_key><arg_value>1</arg_value>"
            "<arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
            "<tool_call>calc\n<arg_key> </arg_key><arg_value>1</arg_value></tool_call>",
            call("lookup", q="x"),
        ]
    )
    items = GlmToolParser().parse(text).items
    assert [type(i).__name__ for i in items] == [
        "ToolCall",
        "ToolCallError",
        "ToolCall",
        "ToolCallError",
        "ToolCallError",
        "ToolCallError",
        "ToolCallError",
        "ToolCall",
    ]
    assert [(c.name, c.arguments) for c in items if isinstance(c, ToolCall)] == [
        ("calc", {"a": 1, "b": 2}),
        ("calc", {"a": 3, "b": 4}),
        ("lookup", {"q": "x"}),
    ]
    errors = [(e.kind, e.message, e.name) for e in items if isinstance(e, ToolCallError)]
    assert errors == [
        ("missing_name", f"tool call 2 has no function name; {HINT}", None),
        (
            "missing_name",
            "tool call 4 does not start with a function name (got "
            f'\'{{"name": "calc", "arguments": {{"a": 1}}}}\'); {HINT}',
            None,
        ),
        (
            "bad_arguments",
            "tool call 5 (calc) has text outside its <arg_key>/<arg_value> pairs "
            f"('<arg_key>a</arg_key>\\n1'); {HINT}",
            "calc",
        ),
        ("bad_arguments", "tool call 6 (calc) has argument 'a' twice", "calc"),
        ("bad_arguments", "tool call 7 (calc) has an empty argument name", "calc"),
    ]
    assert items[1].raw == "<arg_key>a</arg_key>\n<arg_value>1</arg_value>"


def test_a_missing_closing_arg_value_tag_does_not_swallow_the_next_pair():
    text = "<tool_call>calc\n<arg_key>a</arg_key>\n<arg_value>1\n<arg_key>b</arg_key>\n"
    text += "<arg_value>2</arg_value>\n</tool_call>"
    (error,) = GlmToolParser().parse(text).items
    assert isinstance(error, ToolCallError) and error.kind == "bad_arguments"


def test_repair_reads_an_unclosed_block_and_repairs_json_values():
    unclosed = "Sure.\n<tool_call>calc\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n"
    (item,) = GlmToolParser(repair=True).parse(unclosed).items
    assert (item.name, item.arguments, item.repaired) == ("calc", {"a": 2}, True)
    (error,) = GlmToolParser(repair=False).parse(unclosed).items
    assert (error.kind, error.message, error.name) == (
        "bad_arguments",
        f"tool call 1 (calc) is not closed with </tool_call>; {HINT}",
        "calc",
    )
    # an unclosed block followed by another one: each is read on its own
    two = "<tool_call>calc\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n" + call("calc", a=2)
    first, second = GlmToolParser().parse(two).items
    assert (first.arguments, first.repaired, second.arguments, second.repaired) == (
        {"a": 1},
        True,
        {"a": 2},
        False,
    )

    sloppy = "<tool_call>lookup\n<arg_key>tags</arg_key>\n<arg_value>['a', 'b',]</arg_value>\n"
    sloppy += "</tool_call>"
    (item,) = GlmToolParser(repair=True).parse(sloppy).items
    assert (item.arguments, item.repaired) == ({"tags": ["a", "b"]}, True)
    (item,) = GlmToolParser(repair=False).parse(sloppy).items
    assert (item.arguments, item.repaired) == ({"tags": "['a', 'b',]"}, False)
    # the schema check then reports what the served parser would have passed on
    (error,) = check_calls(GlmToolParser(repair=False).parse(sloppy), SCHEMAS).items
    assert error.kind == "schema"


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("2", 2),
        (" 5 ", 5),
        ("-1.5", -1.5),
        ("true", True),
        ("null", None),
        ('[1, "é"]', [1, "é"]),
        ('{"k": {"n": [1]}}', {"k": {"n": [1]}}),
        ("x y", "x y"),
        ("  spaced\n", "  spaced\n"),
        ('"quoted"', '"quoted"'),
        ("007", "007"),
        ("NaN", "NaN"),
        ("{not json}", "{not json}"),
        ("", ""),
    ],
)
def test_values_without_a_schema_decode_non_string_json_and_keep_other_text_raw(written, value):
    text = f"<tool_call>f\n<arg_key>v</arg_key>\n<arg_value>{written}</arg_value>\n</tool_call>"
    (item,) = GlmToolParser().parse(text).items
    assert item.arguments == {"v": value}
    assert type(item.arguments["v"]) is type(value)


def test_values_with_the_tool_schema_follow_the_property_types():
    schemas = {
        "f": {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "s": {"type": "string"},
                        "n": {"type": "integer"},
                        "opt": {"type": ["string", "null"]},
                        "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    },
                },
            },
        }
    }
    text = call("f", s="42", n="42", opt="7", any="8", free="9")
    (item,) = GlmToolParser(schemas=schemas).parse(text).items
    assert item.arguments == {"s": "42", "n": 42, "opt": "7", "any": 8, "free": 9}
    (item,) = GlmToolParser(schemas=schemas).parse(call("f", opt="null")).items
    assert item.arguments == {"opt": None}
    # without the schema a string that reads as a number is a number (the schema check flags it)
    (item,) = GlmToolParser().parse(call("lookup", q="42")).items
    assert item.arguments == {"q": 42}
    (error,) = check_calls(GlmToolParser().parse(call("lookup", q="42")), SCHEMAS).items
    assert (error.kind, error.message) == (
        "schema",
        "arguments of 'lookup' do not match its schema at q: 42 is not of type 'string'",
    )


def test_the_loops_parser_gets_the_tool_schemas(glm):
    """tool_agent builds its parser with the bound tools' schemas: a string parameter keeps
    text that reads as a number."""
    loop, _ = make_loop(glm, ["done"])
    assert loop.parser.schemas == {"calc": CALC_SCHEMA}
    parser = GLM45.new_parser(schemas=SCHEMAS)
    (item,) = parser.parse(call("lookup", q="42")).items
    assert item.arguments == {"q": "42"}


def test_text_without_calls_is_all_content():
    parsed = GlmToolParser().parse("\n<think>hm</think>\nThe answer is 5.\n")
    assert (parsed.content, parsed.items) == ("<think>hm</think>\nThe answer is 5.", [])


# ---- format registration, end tokens, detection ----------------------------------------------
def test_names_aliases_and_parser_registry():
    for name in ("glm45", "glm4.5", "glm46"):
        assert get_format(name) is GLM45
        parser = get_format(name).new_parser(repair=False)
        assert isinstance(parser, GlmToolParser) and parser.repair is False
    assert GLM45.end_opens_next is True
    assert GLM45.call_end_tokens == ("<|observation|>",)


def test_end_tokens_are_the_next_headers_not_only_eos(glm):
    ends = end_tokens(glm, GLM45)
    ids = {t: glm.convert_tokens_to_ids(t) for t in ("<|observation|>", "<|user|>")}
    eos = glm.convert_tokens_to_ids("<|endoftext|>")
    assert ends.strings == ("<|observation|>", "<|user|>", "<|endoftext|>")
    assert ends.ids == {ids["<|observation|>"], ids["<|user|>"], eos}
    assert ends.call_ids == {ids["<|observation|>"]}
    assert ends.opens_next is True
    assert len({*ids.values(), eos}) == 3


def test_detect_format_finds_glm_and_not_for_qwen3(tiny_qwen3_path, glm):
    assert detect_format(template_text("glm45")) == "glm45"
    assert resolve_format(None, glm) is GLM45
    qwen3 = AutoTokenizer.from_pretrained(tiny_qwen3_path).chat_template
    assert detect_format(qwen3) not in (None, "glm45")


# ---- the test template against the format's facts --------------------------------------------
def test_prompt_with_tools_system_and_user(glm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    assert render(glm, messages, [CALC_SCHEMA]) == (
        "[gMASK]<sop>" + TOOLS_BLOCK + "<|system|>\nBe brief.<|user|>\n2 + 3?<|assistant|>"
    )
    assert render(glm, messages[1:]) == "[gMASK]<sop><|user|>\n2 + 3?<|assistant|>"


def test_tool_calls_reasoning_and_grouped_tool_results(glm):
    messages = [
        {"role": "user", "content": "Add"},
        {
            "role": "assistant",
            "content": "<think>\nplan\n</think>\n\nOn it. ",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"a": 1, "b": 2}}},
                {"type": "function", "function": {"name": "lookup", "arguments": {"q": "é x"}}},
            ],
        },
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "found"},
        {"role": "assistant", "content": "Done."},
        {"role": "tool", "content": "late"},
    ]
    assert render(glm, messages, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>\nAdd<|assistant|>\n<think>plan</think>\nOn it.\n"
        + call("calc", a=1, b=2)
        + "\n"
        + call("lookup", q="é x")
        + "<|observation|>\n<tool_response>\n3\n</tool_response>"
        "\n<tool_response>\nfound\n</tool_response>"
        "<|assistant|>\n<think></think>\nDone."
        "<|observation|>\n<tool_response>\nlate\n</tool_response>"
    )


def test_reasoning_before_the_last_user_message_is_emptied(glm):
    turn = {"role": "assistant", "content": "\n<think>secret</think>\nHi."}
    messages = [{"role": "user", "content": "a"}, turn]
    assert render(glm, messages, add_generation_prompt=False).endswith(
        "<|assistant|>\n<think>secret</think>\nHi."
    )
    later = render(glm, [*messages, {"role": "user", "content": "b"}])
    assert later == (
        "[gMASK]<sop><|user|>\na<|assistant|>\n<think></think>\nHi.<|user|>\nb<|assistant|>"
    )
    assert empty_earlier_reasoning("<think>x\ny</think>\nA<think></think>") == (
        "<think></think>\nA<think></think>"
    )


def test_thinking_off_adds_nothink_and_an_empty_think_block(glm):
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again/nothink"}]
    assert render(glm, messages, enable_thinking=False) == (
        "[gMASK]<sop><|user|>\nhi/nothink<|user|>\nagain/nothink<|assistant|>\n<think></think>"
    )
    assert render(glm, messages[:1], enable_thinking=True).endswith("hi<|assistant|>")


# ---- deltas: the end token the model samples opens the next message --------------------------
HISTORY = [
    {"role": "user", "content": "2 + 3?"},
    {"role": "assistant", "content": "\n<think>Add.</think>\n" + call("calc", a=2, b=3)},
]


def test_the_delta_starts_right_after_the_sampled_observation(glm):
    ids = delta(glm, HISTORY, [{"role": "tool", "content": "5"}], sampled_end="<|observation|>")
    assert decode(glm, ids) == "\n<tool_response>\n5\n</tool_response><|assistant|>"
    two = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "7"}]
    ids = delta(glm, HISTORY, two, sampled_end="<|observation|>")
    assert decode(glm, ids) == (
        "\n<tool_response>\n5\n</tool_response>\n<tool_response>\n7\n</tool_response><|assistant|>"
    )


def test_a_user_message_after_the_sampled_user_header(glm):
    final = [HISTORY[0], {"role": "assistant", "content": "\n<think>x</think>\n5."}]
    new = [{"role": "user", "content": "And 5 + 5?"}]
    assert decode(glm, delta(glm, final, new, sampled_end="<|user|>")) == (
        "\nAnd 5 + 5?<|assistant|>"
    )
    off = delta(
        glm, final, new, sampled_end="<|user|>", chat_template_kwargs={"enable_thinking": False}
    )
    assert decode(glm, off) == "\nAnd 5 + 5?/nothink<|assistant|>\n<think></think>"


@pytest.mark.parametrize(
    ("sampled", "new", "opened"),
    [
        ("<|endoftext|>", [{"role": "tool", "content": "5"}], "<|observation|>"),
        ("<|user|>", [{"role": "tool", "content": "5"}], "<|observation|>"),
        ("<|observation|>", [{"role": "user", "content": "hi"}], "<|user|>"),
    ],
)
def test_a_sampled_end_that_is_not_the_header_the_template_opens_is_rejected(
    glm, sampled, new, opened
):
    for head in (None, 1):
        with pytest.raises(TemplateDeltaError) as info:
            delta(glm, HISTORY, new, sampled_end=sampled, head=head)
        assert str(info.value) == (
            f"the model ended its turn with {sampled!r} but the chat template opens the new "
            f"messages with {opened!r}"
        )


@pytest.mark.parametrize(
    "sampled",
    [
        # what the template renders
        "\n<think>Add.</think>\n" + call("calc", a=2, b=3),
        # a line break before <|observation|> (kept in the trajectory, not in the template)
        "\n<think>Add.</think>\n" + call("calc", a=2, b=3) + "\n",
        # no reasoning, compact layout, extra spaces, an unclosed block
        "<tool_call>calc<arg_key>a</arg_key><arg_value> 2 </arg_value><arg_key>b</arg_key>"
        "<arg_value>3</arg_value></tool_call>",
        "  Sure:  " + call("calc", a=2, b=3) + "  ",
        "\n<tool_call>calc\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n",
    ],
)
def test_the_delta_does_not_depend_on_how_the_model_wrote_its_turn(glm, sampled):
    history = [*HISTORY[:1], GLM45.assistant_message(sampled, GlmToolParser().parse(sampled))]
    more = [*history, {"role": "tool", "content": "5"}, {"role": "assistant", "content": sampled}]
    tool = [{"role": "tool", "content": "5"}]
    expected = "\n<tool_response>\n5\n</tool_response><|assistant|>"
    assert decode(glm, delta(glm, history, tool, sampled_end="<|observation|>")) == expected
    # the suffix path (prompt + last turn) checked against the full render
    ids = delta(glm, more, tool, sampled_end="<|observation|>", head=1, check=True)
    assert decode(glm, ids) == expected


def test_the_history_check_needs_the_reasoning_rewrite(glm):
    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "\n<think>secret</think>\nHi."},
    ]
    new = [{"role": "user", "content": "b"}]
    kwargs = {"eot_token": ("<|observation|>", "<|user|>"), "opens_next": True}
    with pytest.raises(TemplateDeltaError, match="rewrites history"):
        encode_delta(glm, history, new, history_rewrite=lambda text: text, **kwargs)
    expected = "\nb<|assistant|>"
    for rewrite in (GLM45.history_rewrite, None):  # the format's, the default think-drop
        ids = encode_delta(glm, history, new, history_rewrite=rewrite, **kwargs)
        assert decode(glm, ids) == expected


# ---- property: prompt + sampled turns + deltas == the template's full tokenization -----------
PIECES = ["a", "B c", "\n", "  ", "é", "日本語", "🙂", "<", ">", "{", "}", '"', "/", "[1]", "think"]
texts = st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
words = texts.map(str.strip)
nonblank = words.map(lambda word: word or "w")


@st.composite
def tool_calls(draw) -> tuple[str, dict[str, Any]]:
    if draw(st.booleans()):
        return "calc", {"a": draw(st.integers(-9, 99)), "b": draw(st.integers(-9, 99))}
    args = {}
    if draw(st.booleans()):
        args["q"] = draw(nonblank)
    if draw(st.booleans()):
        args["tags"] = draw(st.lists(st.sampled_from(["x", "é", "y z"]), max_size=3))
    return "lookup", args


@st.composite
def conversations(draw) -> dict[str, Any]:
    thinking = draw(st.booleans())
    first = [{"role": "system", "content": draw(words)}] if draw(st.booleans()) else []
    first.append({"role": "user", "content": draw(words)})
    n = draw(st.integers(1, 4))
    turns = []
    for i in range(n):
        calls = draw(st.lists(tool_calls(), max_size=3))
        reasoning = (f"r{i} " + draw(words)).strip() if thinking and draw(st.booleans()) else ""
        turn = {"reasoning": reasoning, "content": draw(words), "calls": calls}
        if calls:
            turn["new"] = [{"role": "tool", "content": draw(texts)} for _ in calls]
        elif i < n - 1 or draw(st.booleans()):
            turn["new"] = [{"role": "user", "content": draw(words)}]
        else:
            turn["new"] = []  # the conversation ends on the model's answer
        turns.append(turn)
    tools = draw(st.sampled_from([TOOLS, None]))
    return {"thinking": thinking, "first": first, "tools": tools, "turns": turns}


def sampled_text(turn: dict[str, Any], thinking: bool) -> str:
    """The turn as the template renders it (the model trained on it writes the same)."""
    text = f"\n<think>{turn['reasoning']}</think>" if thinking else ""
    if turn["content"]:
        text += "\n" + turn["content"]
    return text + "".join("\n" + call(name, **args) for name, args in turn["calls"])


@PROPERTY
@given(conversation=conversations())
def test_sampled_ids_plus_deltas_equal_the_full_tokenization(glm, conversation):
    first, tools, thinking = conversation["first"], conversation["tools"], conversation["thinking"]
    kwargs = {} if thinking else {"enable_thinking": False}
    parser = GlmToolParser(schemas=SCHEMAS)
    observation, user = (glm.convert_tokens_to_ids(t) for t in ("<|observation|>", "<|user|>"))

    ids = glm.apply_chat_template(
        first, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    mask = [0] * len(ids)
    history = list(first)
    sampled_spans = []
    reasoning_at = []  # (history index, reasoning) of each model turn
    for turn in conversation["turns"]:
        text = sampled_text(turn, thinking)
        end = observation if turn["calls"] else user
        sampled = glm.encode(text, add_special_tokens=False) + [end]
        sampled_spans.append(text + ("<|observation|>" if turn["calls"] else "<|user|>"))
        ids += sampled
        mask += [1] * len(sampled)

        parsed = parser.parse(decode(glm, sampled[:-1]))
        assert [(c.name, c.arguments) for c in parsed.items] == turn["calls"]
        reasoning_at.append((len(history), turn["reasoning"]))
        history.append(GLM45.assistant_message(decode(glm, sampled[:-1]), parsed))
        if turn["new"]:
            new_ids = delta(
                glm,
                history,
                turn["new"],
                tools,
                sampled_end=glm.convert_ids_to_tokens(end),
                head=len(first),
                check=True,
                chat_template_kwargs=kwargs,
            )
            ids += new_ids
            mask += [0] * len(new_ids)
            history += turn["new"]

    ends_on_delta = bool(conversation["turns"][-1]["new"])
    full = render(glm, history, tools, add_generation_prompt=ends_on_delta, **kwargs)
    if not ends_on_delta:
        full += "<|user|>"  # the end token the model sampled last; no template renders it
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    dropped = [r for at, r in reasoning_at if at < last_user and r]
    if dropped:
        # the documented rewrite: reasoning before the last user message renders empty; the
        # trajectory keeps it as sampled
        got = decode(glm, ids)
        assert got != full
        for reasoning in dropped:
            got = got.replace(f"<think>{reasoning}</think>", "<think></think>", 1)
        assert got == full
    else:
        assert ids == glm.encode(full, add_special_tokens=False)
    assert [decode(glm, span) for span in mask_spans(ids, mask, 1)] == sampled_spans


# ---- one tool_agent run ----------------------------------------------------------------------
PROMPT = [{"role": "user", "content": "What is 2 + 3, then + 2?"}]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "stop_token_ids": [1]}


def make_loop(glm, turns, **multi_turn):
    # scripted turns carry their own end token (<|observation|> or <|user|>)
    server = ScriptedServer(glm, turns, end_turn=False)
    config = RolloutConfig(
        prompt_length=1024, response_length=512, multi_turn=MultiTurnConfig(**multi_turn)
    )
    return ToolAgentLoop(AgentLoopContext(server, glm, config, {"calc": CalcTool()})), server


async def test_tool_agent_two_tool_turns_then_an_answer(glm):
    turns = [
        "\n<think>First add.</think>\nLet me add.\n" + call("calc", a=2, b=3) + "<|observation|>",
        "\n<think>Now + 2.</think>\n" + call("calc", a=5, b=2) + "<|observation|>",
        "\n<think>Done.</think>\nThe answer is 7.<|user|>",
    ]
    loop, server = make_loop(glm, turns)  # format derived from the template
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)

    assert loop.chat_format is GLM45
    tools = [CALC_SCHEMA]
    prompt = glm.apply_chat_template(
        PROMPT, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    texts = [t.removesuffix("<|observation|>") for t in turns[:2]]
    history = [*PROMPT, {"role": "assistant", "content": texts[0]}]
    delta1 = delta(
        glm, history, [{"role": "tool", "content": "5"}], tools, sampled_end="<|observation|>"
    )
    history += [{"role": "tool", "content": "5"}, {"role": "assistant", "content": texts[1]}]
    delta2 = delta(
        glm, history, [{"role": "tool", "content": "7"}], tools, sampled_end="<|observation|>"
    )
    s = server.sampled
    assert out.prompt_ids == prompt
    assert out.response_ids == s[0] + delta1 + s[1] + delta2 + s[2]
    assert out.response_mask == (
        [1] * len(s[0]) + [0] * len(delta1) + [1] * len(s[1]) + [0] * len(delta2) + [1] * len(s[2])
    )
    assert decode(glm, delta1) == "\n<tool_response>\n5\n</tool_response><|assistant|>"
    assert decode(glm, delta2) == "\n<tool_response>\n7\n</tool_response><|assistant|>"
    assert [
        decode(glm, span) for span in mask_spans(out.response_ids, out.response_mask, 1)
    ] == turns
    assert server.requests[1]["prompt_ids"] == prompt + s[0] + delta1
    ends = {glm.convert_tokens_to_ids(t) for t in ("<|observation|>", "<|user|>", "<|endoftext|>")}
    for request in server.requests:
        assert request["stop_token_ids"][0] == 1 and ends <= set(request["stop_token_ids"])
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 2 and out.record.tool_errors == 0
    # no user message followed: the whole trajectory is the template's rendering, ids exact
    answer = {"role": "assistant", "content": turns[2].removesuffix("<|user|>")}
    history += [{"role": "tool", "content": "7"}, answer]
    full = render(glm, history, tools, add_generation_prompt=False) + "<|user|>"
    assert out.prompt_ids + out.response_ids == glm.encode(full, add_special_tokens=False)


async def test_tool_agent_answers_a_malformed_call_and_stops_on_a_non_call_end(glm):
    turns = [
        call("calc", a=1, b=1) + "\n<tool_call>\n<arg_key>a</arg_key></tool_call><|observation|>",
        # calls followed by <|user|> (not <|observation|>) are not run: the turn is final
        call("calc", a=2, b=2) + "<|user|>",
    ]
    loop, server = make_loop(glm, turns, format="glm4.5")
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    tool_ids = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    assert decode(glm, tool_ids) == (
        "\n<tool_response>\n2\n</tool_response>\n<tool_response>\n"
        f"Error: tool call 2 has no function name; {HINT}\n</tool_response><|assistant|>"
    )
    assert out.record.tool_error_kinds == ["missing_name"]
    assert len(server.requests) == 2 and out.record.stop_reason == "no_tool_call"

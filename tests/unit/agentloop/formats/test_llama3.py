"""llama3_json: the parser (per-call errors, repair, ``; ``-separated calls), end tokens from
the format (``<|eot_id|>``/``<|eom_id|>``, never the base eos), exact deltas on the
project's Llama 3.1 template (property test: prompt + sampled + deltas == full render) and a
ToolAgentLoop run."""

from __future__ import annotations

import copy
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, encode_delta
from agentloop.formats import detect_format, end_tokens, get_format
from agentloop.formats.llama3 import LLAMA3, Llama3JsonToolParser
from agentloop.parsers import ToolCall, ToolCallError
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from tests.chat_families import (
    FAMILY_TOKENS,
    decode,
    family_tokenizer,
    property_settings,
    render,
    template_text,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

SPECIAL = FAMILY_TOKENS["llama3"].special
EOT, EOM = "<|eot_id|>", "<|eom_id|>"
ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"
IPYTHON = "<|start_header_id|>ipython<|end_header_id|>\n\n"
HINT = (
    'reply with only {"name": <tool name>, "parameters": {...}} (several calls separated by "; ")'
)
PROPERTY = property_settings(50)


def llama_tokenizer(base_path, eos: str = EOT) -> Any:
    return family_tokenizer(base_path, "llama3", eos_token=eos)


@pytest.fixture(scope="module")
def llama(tiny_qwen3_path):
    return llama_tokenizer(tiny_qwen3_path)


def call(name: str, key: str = "parameters", **arguments: Any) -> str:
    return json.dumps({"name": name, key: arguments})


def parse(text: str, repair: bool = True):
    return Llama3JsonToolParser(repair=repair).parse(text)


def full_ids(tokenizer, messages, tools=None, *, add_generation_prompt=True, **kwargs):
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )


# ---- parser ----------------------------------------------------------------------------------
def test_a_single_call_with_parameters():
    turn = parse(call("calc", a=2, b=3))
    assert turn.content == ""
    assert [(c.name, c.arguments, c.repaired) for c in turn.items] == [
        ("calc", {"a": 2, "b": 3}, False)
    ]
    assert turn.items[0].raw == call("calc", a=2, b=3)


def test_python_tag_whitespace_and_the_arguments_key_are_accepted():
    turn = parse(f"\n <|python_tag|> {call('calc', 'arguments', a=1, b=1)}\n")
    assert [(c.name, c.arguments) for c in turn.calls] == [("calc", {"a": 1, "b": 1})]
    assert turn.content == ""


def test_several_calls_separated_by_semicolons_or_newlines_keep_their_order():
    text = f"{call('a', x=1)}; {call('b', x=2)};{call('c')}\n{call('d', x=[1, 2])}"
    turn = parse(text)
    assert [(c.name, c.arguments) for c in turn.items] == [
        ("a", {"x": 1}),
        ("b", {"x": 2}),
        ("c", {}),
        ("d", {"x": [1, 2]}),
    ]
    assert turn.content == ""


def test_a_malformed_call_among_good_ones_is_exactly_one_error_in_its_place():
    bad = '{"name": "calc", "parameters": {"a": 1 2}}'
    turn = parse(f"{call('calc', a=1, b=2)}; {bad}; {call('calc', a=3, b=4)}")
    assert [type(i) for i in turn.items] == [ToolCall, ToolCallError, ToolCall]
    assert [c.arguments for c in turn.calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    (error,) = turn.errors
    assert (error.kind, error.raw) == ("bad_json", bad)
    assert error.message == (
        f"tool call 2 is not valid JSON (Expecting ',' delimiter at char 39); {HINT}"
    )


@pytest.mark.parametrize(
    ("obj", "kind", "message"),
    [
        ('{"parameters": {"a": 1}}', "missing_name", f'tool call 2 has no "name"; {HINT}'),
        (
            '{"name": "calc", "parameters": [1, 2]}',
            "bad_arguments",
            "arguments of tool call 2 (calc) must be a JSON object, got an array",
        ),
        ("{}", "missing_name", f'tool call 2 has no "name"; {HINT}'),
    ],
)
def test_error_kinds_name_the_call_and_the_llama_format(obj, kind, message):
    turn = parse(f"{call('calc', a=1, b=2)}; {obj}")
    assert [type(i) for i in turn.items] == [ToolCall, ToolCallError]
    assert (turn.items[1].kind, turn.items[1].message) == (kind, message)


def test_a_semicolon_inside_an_unclosed_object_starts_the_next_call():
    text = '{"name": "a", "parameters": {"x": 1}; {"name": "b", "parameters": {}}'
    repaired = parse(text)
    assert [(c.name, c.arguments, c.repaired) for c in repaired.items] == [
        ("a", {"x": 1}, True),
        ("b", {}, False),
    ]
    strict = parse(text, repair=False)
    assert [type(i) for i in strict.items] == [ToolCallError, ToolCall]
    assert strict.items[0].kind == "bad_json"
    assert strict.items[0].raw == '{"name": "a", "parameters": {"x": 1}'


def test_repair_reads_python_style_json_and_strict_mode_reports_it():
    text = "{'name': 'calc', 'parameters': {'a': 2, 'b': True,}}; " + call("calc", a=1)
    turn = parse(text)
    assert [(c.name, c.arguments, c.repaired) for c in turn.items] == [
        ("calc", {"a": 2, "b": True}, True),
        ("calc", {"a": 1}, False),
    ]
    strict = parse(text, repair=False)
    assert [type(i) for i in strict.items] == [ToolCallError, ToolCall]
    assert strict.items[0].message.startswith(
        "tool call 1 is not valid JSON (Expecting property name enclosed in double quotes"
    )
    assert strict.items[0].message.endswith(HINT)


def test_an_unclosed_last_call_is_repaired_or_an_error():
    text = '{"name": "calc", "parameters": {"a": 1, "b": "x;y"'
    assert [(c.arguments, c.repaired) for c in parse(text).items] == [({"a": 1, "b": "x;y"}, True)]
    assert [i.kind for i in parse(text, repair=False).items] == ["bad_json"]


def test_text_after_the_calls_is_content():
    turn = parse(f"{call('calc', a=1, b=1)};\n  Let me check {{this}}.  ")
    assert [c.name for c in turn.items] == ["calc"]
    assert turn.content == "Let me check {this}."


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 5.",
        f"Calling now: {call('calc', a=1, b=1)}",
        'Search with brave_search.call(query="weather")',
        "   ",
        "",
    ],
)
def test_a_turn_not_starting_with_an_object_is_plain_content(text):
    turn = parse(text)
    assert turn.items == []
    assert turn.content == text.strip()


# ---- format, detection, end tokens -----------------------------------------------------------
def test_the_format_is_registered_under_its_name_and_alias():
    assert get_format("llama3_json") is LLAMA3
    assert get_format("llama3") is LLAMA3
    assert isinstance(LLAMA3.new_parser(repair=False), Llama3JsonToolParser)


def test_detect_format_finds_llama3_and_not_on_the_qwen3_template(tiny_qwen3_path):
    assert detect_format(template_text("llama3")) == "llama3_json"
    qwen3 = (Path(tiny_qwen3_path) / "chat_template.jinja").read_text()  # the tokenizer's
    assert "<think>" in qwen3
    assert detect_format(qwen3) not in ("llama3_json", "llama3")


@pytest.mark.parametrize("eos", [EOT, "<|end_of_text|>"], ids=["instruct", "base"])
def test_end_tokens_are_eot_and_eom_whatever_the_eos(llama, eos):
    tokenizer = copy.deepcopy(llama)
    tokenizer.eos_token = eos
    assert tokenizer.eos_token == eos
    ends = end_tokens(tokenizer, LLAMA3)
    ids = tokenizer.convert_tokens_to_ids([EOT, EOM])
    assert ends.strings == (EOT, EOM)
    assert ends.ids == ends.call_ids == frozenset(ids)
    assert ends.opens_next is False
    assert tokenizer.convert_tokens_to_ids("<|end_of_text|>") not in ends.ids


# ---- the template and exact deltas -----------------------------------------------------------
def test_prompt_has_the_system_header_and_the_tools_in_the_first_user_message(llama):
    prompt = render(llama, [{"role": "user", "content": " Hi "}], [CALC_SCHEMA])
    assert prompt.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions"
    )
    assert prompt.endswith("}\n\nHi<|eot_id|>" + ASSISTANT)
    in_system = render(
        llama, [{"role": "user", "content": "Hi"}], [CALC_SCHEMA], tools_in_user_message=False
    )
    assert "You have access to the following functions." in in_system.split(EOT)[0]
    assert in_system.endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" + ASSISTANT
    )


def test_a_structured_tool_call_renders_as_the_json_the_model_writes(llama):
    messages = [
        {"role": "user", "content": "Add"},
        {
            "role": "assistant",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"a": 1}}}
            ],
        },
    ]
    rendered = render(llama, messages, add_generation_prompt=False)
    assert rendered.endswith(ASSISTANT + '{"name": "calc", "parameters": {"a": 1}}<|eot_id|>')
    assert LLAMA3.new_parser().parse(rendered.split(ASSISTANT)[-1][: -len(EOT)]).calls


def test_tool_results_are_ipython_turns_with_json_quoted_strings(llama):
    history = [
        {"role": "user", "content": "Add twice"},
        {"role": "assistant", "content": f"{call('calc', a=2, b=3)}; {call('calc', a=1, b=1)}"},
    ]
    new = [{"role": "tool", "content": "5"}, {"role": "tool", "content": 'say "hi"'}]
    delta = encode_delta(llama, history, new, [CALC_SCHEMA], eot_token=[EOT, EOM])
    assert decode(llama, delta) == (f'{IPYTHON}"5"{EOT}{IPYTHON}"say \\"hi\\""{EOT}{ASSISTANT}')


def test_sampled_whitespace_and_eom_stay_in_the_trajectory(llama):
    """The template trims message text and closes history turns with <|eot_id|>; the delta
    after a turn sampled with edge whitespace and <|eom_id|> is the same, and the trajectory
    differs from the full render only by what was sampled."""
    prompt = [{"role": "user", "content": "Add"}]
    sampled = f"  <|python_tag|>{call('calc', a=2, b=3)}\n"
    history = [*prompt, LLAMA3.assistant_message(sampled, parse(sampled))]
    new = [{"role": "tool", "content": "5"}]
    delta = encode_delta(
        llama, history, new, [CALC_SCHEMA], eot_token=[EOT, EOM], sampled_end=EOM, check=True
    )
    ids = full_ids(llama, prompt, [CALC_SCHEMA])
    ids += llama.encode(sampled + EOM, add_special_tokens=False) + delta
    full = render(llama, [*history, *new], [CALC_SCHEMA])
    assert decode(llama, ids) == full.replace(sampled.strip() + EOT, sampled + EOM)


# ---- property: prompt + sampled + deltas == full tokenization --------------------------------
texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
            st.sampled_from(
                [
                    "<|start_header",
                    "id|>",
                    "<|",
                    "|>",
                    "ipython",
                    "assistant\n\n",
                    "\n",
                    "  ",
                    '{"name": "x"}',
                    ";",
                    "é",
                    "日本語",
                    "🙂",
                ]
            ),
        ),
        max_size=5,
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)))
    .filter(lambda t: not any(s in t for s in SPECIAL))
)
arguments = st.dictionaries(
    st.from_regex(r"[a-z]{1,6}", fullmatch=True),
    st.one_of(st.integers(-5, 500), texts, st.booleans(), st.none()),
    max_size=3,
)


@st.composite
def conversations(draw) -> tuple[list[dict], list[dict] | None, dict, list]:
    """(prompt messages, tools, template kwargs, rounds); a round is (sampled text, number of
    calls in it, new messages or None for the final turn)."""
    prompt: list[dict[str, Any]] = []
    if draw(st.booleans()):
        prompt.append({"role": "system", "content": draw(texts)})
    prompt.append({"role": "user", "content": draw(texts)})
    tools = [CALC_SCHEMA] if draw(st.booleans()) else None
    kwargs: dict[str, Any] = {}
    if draw(st.booleans()):
        kwargs["tools_in_user_message"] = False
    if draw(st.booleans()):
        kwargs["date_string"] = "03 Mar 2025"
    rounds = []
    n_turns = draw(st.integers(1, 4))
    for i in range(n_turns):
        n_calls = draw(st.integers(0, 3))
        if n_calls:
            calls = [
                json.dumps({"name": draw(st.sampled_from(["calc", "search"])), "parameters": a})
                for a in draw(st.lists(arguments, min_size=n_calls, max_size=n_calls))
            ]
            text = draw(st.sampled_from(["", "<|python_tag|>"])) + "; ".join(calls)
            new = [{"role": "tool", "content": draw(texts)} for _ in range(n_calls)]
            if draw(st.booleans()):
                new.append({"role": "user", "content": draw(texts)})
        else:
            text = draw(texts.map(str.strip).filter(lambda t: not t.startswith("{")))
            new = [{"role": "user", "content": draw(texts)}]
        final = i == n_turns - 1 and draw(st.booleans())
        rounds.append((text, n_calls, None if final else new))
    return prompt, tools, kwargs, rounds


@PROPERTY
@given(conversation=conversations())
def test_prompt_sampled_ids_and_deltas_equal_the_full_tokenization(llama, conversation):
    prompt, tools, kwargs, rounds = conversation
    ends = end_tokens(llama, LLAMA3)
    ids = full_ids(llama, prompt, tools, **kwargs)
    response: list[int] = []
    mask: list[int] = []
    history = list(prompt)
    for text, n_calls, new in rounds:
        parsed = LLAMA3.new_parser().parse(text)
        assert len(parsed.calls) == n_calls and not parsed.errors
        sampled = llama.encode(text + EOT, add_special_tokens=False)
        response += sampled
        mask += [1] * len(sampled)
        assistant = LLAMA3.assistant_message(text, parsed)
        history.append(assistant)
        if new is None:
            break
        delta = encode_delta(
            llama,
            history,
            new,
            tools,
            eot_token=ends.strings,
            sampled_end=EOT,
            head=len(prompt),
            check=True,
            history_rewrite=LLAMA3.history_rewrite,
            chat_template_kwargs=kwargs,
        )
        response += delta
        mask += [0] * len(delta)
        history += new
    final = rounds[-1][2] is None
    expected = full_ids(llama, history, tools, add_generation_prompt=not final, **kwargs)
    assert ids + response == expected
    spans = [decode(llama, s) for s in mask_spans(response, mask, 1)]
    assert spans == [text + EOT for text, _, _ in rounds]


# ---- the agent loop --------------------------------------------------------------------------
async def test_tool_agent_loop_runs_two_tool_turns_then_answers(llama):
    turns = [
        call("calc", a=2, b=3),
        f"<|python_tag|>{call('calc', a=5, b=1)}; {call('calc', a=1, b=1)}",
        "The answer is 8.",
    ]
    server = ScriptedServer(llama, turns, end_token=EOT)
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        multi_turn=MultiTurnConfig(format="llama3", max_parallel_calls=2),
    )
    loop = ToolAgentLoop(AgentLoopContext(server, llama, config, {"calc": CalcTool()}))
    prompt = [{"role": "user", "content": "What is 2 + 3 + 1 + 2?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)

    tools = [CALC_SCHEMA]
    ends = [EOT, EOM]
    history = [*prompt, {"role": "assistant", "content": turns[0]}]
    first = [{"role": "tool", "content": "5"}]
    delta1 = encode_delta(llama, history, first, tools, eot_token=ends, head=1)
    history += [*first, {"role": "assistant", "content": turns[1]}]
    second = [{"role": "tool", "content": "6"}, {"role": "tool", "content": "2"}]
    delta2 = encode_delta(llama, history, second, tools, eot_token=ends, head=1)

    s = server.sampled
    assert out.prompt_ids == full_ids(llama, prompt, tools)
    assert out.response_ids == s[0] + delta1 + s[1] + delta2 + s[2]
    assert out.response_mask == [1] * len(s[0]) + [0] * len(delta1) + [1] * len(s[1]) + [0] * len(
        delta2
    ) + [1] * len(s[2])
    assert decode(llama, delta1) == f'{IPYTHON}"5"{EOT}{ASSISTANT}'
    assert decode(llama, delta2) == f'{IPYTHON}"6"{EOT}{IPYTHON}"2"{EOT}{ASSISTANT}'
    spans = [decode(llama, span) for span in mask_spans(out.response_ids, out.response_mask, 1)]
    assert spans == [t + EOT for t in turns]
    eot_id, eom_id = llama.convert_tokens_to_ids([EOT, EOM])
    assert all({eot_id, eom_id} <= set(r["stop_token_ids"]) for r in server.requests)
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 3 and out.record.tool_errors == 0


# ---- built-in tools (builtin_tools) -----------------------------------------------------------
BUILTIN_HINT = 'call a built-in tool as <|python_tag|>TOOL.call(key="value", ...)'


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        (
            '<|python_tag|>brave_search.call(query="weather in Menlo Park")',
            "brave_search",
            {"query": "weather in Menlo Park"},
        ),
        (
            ' <|python_tag|> wolfram_alpha.call(query="2+2", n=3) \n',
            "wolfram_alpha",
            {"query": "2+2", "n": 3},
        ),
        ("<|python_tag|>brave_search.call()", "brave_search", {}),
        (
            "<|python_tag|>import math\nprint(math.pi)",
            "code_interpreter",
            {"code": "import math\nprint(math.pi)"},
        ),
    ],
)
def test_a_builtin_tool_call_is_a_call_of_the_tool_it_names(text, name, arguments):
    turn = parse(text)
    assert turn.content == ""
    assert [(c.name, c.arguments) for c in turn.items] == [(name, arguments)]
    assert turn.items[0].raw == text.strip().removeprefix("<|python_tag|>").strip()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('brave_search.call(query="x"', "not a complete Python call"),
        ('brave_search.call("x")', "only key=value arguments are allowed"),
        ("brave_search.call(**q)", "only key=value arguments are allowed"),
        ("brave_search.call(query=x)", "the value of query is not a literal"),
        ('brave_search.call(query="a", query="b")', "argument query is given twice"),
        ('brave_search.call(query="x") and more', "text follows the call"),
    ],
)
def test_each_malformed_builtin_call_is_one_error(text, problem):
    (error,) = parse(f"<|python_tag|>{text}").items
    assert (error.kind, error.name, error.raw) == ("bad_arguments", "brave_search", text)
    assert error.message == (
        f'built-in tool call 1 (brave_search) is not brave_search.call(key="value", ...) '
        f"({problem}); {BUILTIN_HINT}"
    )


def test_a_bare_python_tag_is_an_error():
    (error,) = parse("<|python_tag|>  ").items
    assert (error.kind, error.message) == (
        "bad_json",
        f"the python tag is not followed by a call; {BUILTIN_HINT}",
    )


class SearchTool(BaseTool):
    schema = {
        "type": "function",
        "function": {
            "name": "brave_search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }

    async def execute(self, instance_id, arguments):
        return ToolResult(f"Sunny in {arguments['query']}")


async def test_tool_agent_runs_a_builtin_tool_call_ended_with_eom(llama):
    turns = [
        '<|python_tag|>brave_search.call(query="Menlo Park")' + EOM,
        "It is sunny." + EOT,
    ]
    server = ScriptedServer(llama, turns, end_turn=False)
    kwargs = {"builtin_tools": ["brave_search", "wolfram_alpha"]}
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        multi_turn=MultiTurnConfig(format="llama3"),
        chat_template_kwargs=kwargs,
    )
    loop = ToolAgentLoop(AgentLoopContext(server, llama, config, {"brave_search": SearchTool()}))
    prompt = [{"role": "user", "content": "Weather in Menlo Park?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)

    tools = [SearchTool().tool_schema]
    assert out.prompt_ids == full_ids(llama, prompt, tools, **kwargs)
    assert "Environment: ipython\nTools: brave_search, wolfram_alpha" in decode(
        llama, out.prompt_ids
    )
    (delta,) = mask_spans(out.response_ids, out.response_mask, 0)
    assert decode(llama, delta) == f'{IPYTHON}"Sunny in Menlo Park"{EOT}{ASSISTANT}'
    history = [*prompt, {"role": "assistant", "content": turns[0].removesuffix(EOM)}]
    new = [{"role": "tool", "content": "Sunny in Menlo Park"}]
    assert delta == encode_delta(
        llama, history, new, tools, eot_token=[EOT, EOM], chat_template_kwargs=kwargs
    )
    assert [decode(llama, s) for s in mask_spans(out.response_ids, out.response_mask, 1)] == turns
    assert out.record.tool_calls == 1 and out.record.tool_errors == 0
    assert out.record.stop_reason == "no_tool_call"


async def test_a_builtin_call_of_a_tool_not_registered_is_the_unknown_tool_error(llama):
    turns = ['<|python_tag|>wolfram_alpha.call(query="2+2")' + EOM, "4." + EOT]
    server = ScriptedServer(llama, turns, end_turn=False)
    config = RolloutConfig(
        prompt_length=1024, response_length=512, multi_turn=MultiTurnConfig(format="llama3")
    )
    loop = ToolAgentLoop(AgentLoopContext(server, llama, config, {"brave_search": SearchTool()}))
    out = await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "2+2?"}])
    (delta,) = mask_spans(out.response_ids, out.response_mask, 0)
    assert json.dumps("Error: unknown tool 'wolfram_alpha'; available tools: brave_search") in (
        decode(llama, delta)
    )
    assert out.record.tool_error_kinds == ["unknown_tool"]

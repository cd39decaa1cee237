"""react_agent and the token chat model on the mistral (v3 and v7+), gpt-oss and GLM-4.5 and
GLM-4.7 test tokenizers:
a two-tool-call episode gives prompt + sampled turns + template deltas, the same trajectory
and record as tool_agent; tool messages are paired to the calls of the turn they answer;
messages the graph writes itself render with the arguments each template needs."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import get_format
from agentloop.formats.mistral import CALL_HINT
from agentloop.langgraph import AgentLoopChatModel, ReactAgentLoop, from_chat_dicts
from agentloop.langgraph.messages import takes_string_arguments, to_chat_dicts
from agentloop.tokens import encode_prompt, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import decode, family_tokenizer, template_text
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

PROMPT = [{"role": "user", "content": "What is 2 + 3 + 1?"}]
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
RECORD_KEYS = [
    "stop_reason",
    "finish_reasons",
    "turn_ends",
    "assistant_turns",
    "user_turns",
    "tool_calls",
    "tool_errors",
    "tool_error_kinds",
    "tool_rewards",
]


@dataclass(frozen=True)
class Family:
    """A family's test tokenizer and a scripted two-tool-call episode."""

    format: str
    template: str
    """The test template; its tokens are the ``FAMILY_TOKENS`` entry."""
    turns: list[tuple[str, str]]
    """(text, end token) of each model turn."""
    deltas: list[str]
    """The decoded template deltas of the episode (a regex)."""
    answer: str
    """The content of the final AIMessage."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def _mistral_calls(*calls: str) -> tuple[str, str]:
    return "[TOOL_CALLS] [" + ", ".join(calls) + "]", "</s>"


def _calc_json(a: int, b: int) -> str:
    return json.dumps({"name": "calc", "arguments": {"a": a, "b": b}})


_MISTRAL_BAD = f"tool call 2 is not valid JSON (Expecting ',' delimiter at char 38); {CALL_HINT}"
_RESULT = r'\[TOOL_RESULTS\] \{{"content": {}, "call_id": "[A-Za-z0-9]{{9}}"}}\[/TOOL_RESULTS\]'
MISTRAL = Family(
    format="mistral",
    template="mistral",
    turns=[
        _mistral_calls(_calc_json(2, 3)),
        _mistral_calls(_calc_json(5, 1), '{"name": "calc", "arguments": {"a": 1 2}}'),
        ("The answer is 6.", "</s>"),
    ],
    deltas=[
        _RESULT.format(5),
        _RESULT.format(6) + _RESULT.format(re.escape(json.dumps(f"Error: {_MISTRAL_BAD}"))),
    ],
    answer="The answer is 6.",
)

_OSS_NEXT = "<|start|>assistant"
_OSS_RESULT = "<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"
GPT_OSS = Family(
    format="gpt-oss",
    template="gpt_oss",
    turns=[
        (
            "<|channel|>analysis<|message|>Add 2 and 3 first.<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.calc <|constrain|>json<|message|>"
            '{"a": 2, "b": 3}',
            "<|call|>",
        ),
        (' to=functions.calc<|channel|>commentary json<|message|>{"a": 5, "b": 1}', "<|call|>"),
        (
            "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant"
            "<|channel|>final<|message|>The answer is 6.",
            "<|return|>",
        ),
    ],
    deltas=[
        re.escape(f'{_OSS_RESULT}"5"<|end|>{_OSS_NEXT}'),
        re.escape(f'{_OSS_RESULT}"6"<|end|>{_OSS_NEXT}'),
    ],
    answer="The answer is 6.",
    template_kwargs={"current_date": "2025-06-28"},
)


def _glm_call(a: int, b: int) -> str:
    return (
        f"<tool_call>calc\n<arg_key>a</arg_key>\n<arg_value>{a}</arg_value>\n"
        f"<arg_key>b</arg_key>\n<arg_value>{b}</arg_value>\n</tool_call>"
    )


GLM = Family(
    format="glm45",
    template="glm45",
    turns=[
        ("\n<think>First add.</think>\nLet me add.\n" + _glm_call(2, 3), "<|observation|>"),
        ("\n<think>Now + 1.</think>\n" + _glm_call(5, 1), "<|observation|>"),
        ("\n<think>Done.</think>\nThe answer is 6.", "<|user|>"),
    ],
    deltas=[
        re.escape("\n<tool_response>\n5\n</tool_response><|assistant|>"),
        re.escape("\n<tool_response>\n6\n</tool_response><|assistant|>"),
    ],
    answer="<think>Done.</think>\nThe answer is 6.",
)
_V7_RESULT = r"\[TOOL_RESULTS\][A-Za-z0-9]{{9}}\[TOOL_CONTENT\]{}\[/TOOL_RESULTS\]"
MISTRAL_V7 = Family(
    format="mistral_v7",
    template="mistral_v7",
    turns=MISTRAL.turns,
    deltas=[
        _V7_RESULT.format(5),
        _V7_RESULT.format(6) + _V7_RESULT.format(re.escape(f"Error: {_MISTRAL_BAD}")),
    ],
    answer="The answer is 6.",
)


def _glm47_call(a: int, b: int) -> str:
    return (
        f"<tool_call>calc<arg_key>a</arg_key><arg_value>{a}</arg_value>"
        f"<arg_key>b</arg_key><arg_value>{b}</arg_value></tool_call>"
    )


GLM47 = Family(
    format="glm47",
    template="glm47",
    turns=[  # the generation prompt opens the reasoning: <|assistant|><think>
        ("First add.</think>Let me add." + _glm47_call(2, 3), "<|observation|>"),
        ("Now + 1.</think>" + _glm47_call(5, 1), "<|observation|>"),
        ("Done.</think>The answer is 6.", "<|user|>"),
    ],
    deltas=[
        re.escape("<tool_response>5</tool_response><|assistant|><think>"),
        re.escape("<tool_response>6</tool_response><|assistant|><think>"),
    ],
    answer="Done.</think>The answer is 6.",
)
FAMILIES = {f.format: f for f in (MISTRAL, MISTRAL_V7, GPT_OSS, GLM, GLM47)}


@pytest.fixture(scope="module")
def tokenizers(tiny_qwen3_path):
    return {f.format: family_tokenizer(tiny_qwen3_path, f.template) for f in FAMILIES.values()}


class TurnServer(ScriptedServer):
    """Scripted (text, end token) turns: the text's ids, then the end token's id."""

    def __init__(self, tokenizer, turns: list[tuple[str, str]]) -> None:
        super().__init__(tokenizer, [text for text, _ in turns])
        self.turn_ends = [tokenizer.convert_tokens_to_ids(end) for _, end in turns]

    async def generate(self, request):
        self.eot = self.turn_ends.pop(0)
        return await super().generate(request)


def make_config(family: Family, **multi_turn: Any) -> RolloutConfig:
    return RolloutConfig(
        prompt_length=2048,
        response_length=1024,
        multi_turn=MultiTurnConfig(format=family.format, **multi_turn),
        chat_template_kwargs=dict(family.template_kwargs),
    )


def run(loop_cls, tok, family: Family, turns: list[tuple[str, str]], **multi_turn: Any):
    server = TurnServer(tok, turns)
    context = AgentLoopContext(server, tok, make_config(family, **multi_turn), {"calc": CalcTool()})
    loop = loop_cls(context)
    return asyncio.run(loop.run(dict(SAMPLING), raw_prompt=PROMPT)), server, loop


def same_as_tool_agent(tok, family: Family, turns: list[tuple[str, str]], **multi_turn: Any):
    """(react output, react server, react loop) after checking that tool_agent, run on the
    same scripted turns, produced the same trajectory, requests and record."""
    tool_out, tool_srv, _ = run(ToolAgentLoop, tok, family, turns, **multi_turn)
    react_out, react_srv, loop = run(ReactAgentLoop, tok, family, turns, **multi_turn)
    assert react_out.prompt_ids == tool_out.prompt_ids
    assert react_out.response_ids == tool_out.response_ids
    assert react_out.response_mask == tool_out.response_mask
    assert react_out.response_log_probs == tool_out.response_log_probs
    assert react_out.num_turns == tool_out.num_turns
    for key in RECORD_KEYS:
        assert getattr(react_out.record, key) == getattr(tool_out.record, key), key
    assert [r["prompt_ids"] for r in react_srv.requests] == [
        r["prompt_ids"] for r in tool_srv.requests
    ]
    assert [r["stop_token_ids"] for r in react_srv.requests] == [
        r["stop_token_ids"] for r in tool_srv.requests
    ]
    return react_out, react_srv, loop


@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_tool_turns_are_prompt_sampled_and_deltas_as_in_tool_agent(tokenizers, name):
    family, tok = FAMILIES[name], tokenizers[name]
    out, server, loop = same_as_tool_agent(tok, family, family.turns, max_parallel_calls=2)

    assert out.prompt_ids == encode_prompt(
        tok, PROMPT, tools=[CALC_SCHEMA], chat_template_kwargs=family.template_kwargs
    )
    s = server.sampled
    deltas = mask_spans(out.response_ids, out.response_mask, 0)
    assert mask_spans(out.response_ids, out.response_mask, 1) == s
    assert out.response_ids == s[0] + deltas[0] + s[1] + deltas[1] + s[2]
    assert [decode(tok, span) for span in s] == [text + end for text, end in family.turns]
    for got, expected in zip(deltas, family.deltas, strict=True):
        assert re.fullmatch(expected, decode(tok, got)), decode(tok, got)
    assert server.requests[2]["prompt_ids"] == out.prompt_ids + out.response_ids[: -len(s[2])]
    ends = {tok.convert_tokens_to_ids(t) for t in get_format(name).end_tokens}
    assert all(ends & set(r["stop_token_ids"]) for r in server.requests)
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 2 and out.num_turns == 6
    final = loop.messages[-1]
    assert isinstance(final, AIMessage) and final.tool_calls == []
    assert final.content == family.answer


def test_mistral_tool_messages_carry_the_ids_of_the_calls_they_answer(tokenizers):
    tok = tokenizers["mistral"]
    _, _, loop = same_as_tool_agent(tok, MISTRAL, MISTRAL.turns, max_parallel_calls=2)
    rendered = to_chat_dicts(loop.messages, loop.chat_format, string_arguments=True)
    roles = [m["role"] for m in rendered]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]
    first, second = rendered[1], rendered[3]
    assert [r["tool_call_id"] for r in rendered[2:3]] == [c["id"] for c in first["tool_calls"]]
    assert [r["tool_call_id"] for r in rendered[4:6]] == [c["id"] for c in second["tool_calls"]]
    assert [c["function"]["name"] for c in second["tool_calls"]] == ["calc", "invalid_call"]
    assert [r["content"] for r in rendered[4:6]] == ["6", json.dumps(f"Error: {_MISTRAL_BAD}")]
    # the LangChain messages keep LangChain's ids; the 9-character ids are the template's
    ai = loop.messages[3]
    assert [c["id"] for c in ai.tool_calls + ai.invalid_tool_calls] == [
        m.tool_call_id for m in loop.messages[4:6]
    ]


def test_glm_calls_before_a_non_call_end_do_not_run_as_in_tool_agent(tokenizers):
    turns = [
        (_glm_call(1, 1) + "\n<tool_call>\n<arg_key>a</arg_key></tool_call>", "<|observation|>"),
        (_glm_call(2, 2), "<|user|>"),  # not <|observation|>: a final turn
    ]
    out, server, loop = same_as_tool_agent(tokenizers["glm45"], GLM, turns)
    assert out.record.tool_error_kinds == ["missing_name"] and out.record.tool_calls == 1
    assert len(server.requests) == 2 and out.record.stop_reason == "no_tool_call"
    final = loop.messages[-1]
    assert final.tool_calls == [] and final.invalid_tool_calls == []


def test_gpt_oss_error_results_are_named_after_the_call(tokenizers):
    turns = [
        (
            '<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"a": 1 2}',
            "<|call|>",
        ),
        ("<|channel|>final<|message|>ok", "<|return|>"),
    ]
    out, _, _ = same_as_tool_agent(tokenizers["gpt-oss"], GPT_OSS, turns)
    (delta,) = mask_spans(out.response_ids, out.response_mask, 0)
    assert decode(tokenizers["gpt-oss"], delta).startswith(
        "<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"
        '"Error: tool call 1 (calc) is not valid JSON'
    )
    assert out.record.tool_error_kinds == ["bad_json"]


class AskAgainLoop(ReactAgentLoop):
    """After the model's final answer, a node asks once more (a human message delta)."""

    def build_graph(self, model, tools_node):
        async def agent(state):
            return {"messages": [await model.ainvoke(state["messages"])]}

        def route(state):
            if self.route(state) == "tools":
                return "tools"
            asked = sum(isinstance(m, HumanMessage) for m in state["messages"]) > 1
            return END if asked else "ask"

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools_node)
        graph.add_node("ask", lambda state: {"messages": [HumanMessage("Sure?")]})
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", "ask", END])
        graph.add_edge("tools", "agent")
        graph.add_edge("ask", "agent")
        return graph.compile()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_human_message_after_the_answer_is_a_masked_delta(tokenizers, name):
    """The template's documented rewrites (mistral moves the tools to the new user message,
    gpt-oss re-renders <|return|> as <|end|>) leave the sampled turns as they were."""
    family, tok = FAMILIES[name], tokenizers[name]
    again = {
        "mistral": ("Yes, 6.", "</s>"),
        "gpt-oss": ("<|channel|>final<|message|>Yes.", "<|return|>"),
        "glm45": ("\n<think></think>\nYes.", "<|user|>"),
        "mistral_v7": ("Yes, 6.", "</s>"),
        # GLM-4.7 re-renders the earlier reasoning as a bare </think> once "Sure?" follows
        "glm47": ("Checked.</think>Yes.", "<|user|>"),
    }
    server = TurnServer(tok, [*family.turns, again[name]])
    context = AgentLoopContext(server, tok, make_config(family), {"calc": CalcTool()})
    out = asyncio.run(AskAgainLoop(context).run(dict(SAMPLING), raw_prompt=PROMPT))
    assert (out.record.assistant_turns, out.record.user_turns) == (4, 3)
    assert mask_spans(out.response_ids, out.response_mask, 1) == server.sampled
    human = mask_spans(out.response_ids, out.response_mask, 0)[2]
    assert "Sure?" in decode(tok, human)
    last = len(server.sampled[3])
    assert server.requests[3]["prompt_ids"] == out.prompt_ids + out.response_ids[:-last]


# ---- messages the graph writes ------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3_template(tiny_qwen3_path) -> str:
    return (tiny_qwen3_path / "chat_template.jinja").read_text()


def test_only_templates_that_test_for_string_arguments_get_json_text(qwen3_template):
    qwen3 = qwen3_template
    assert takes_string_arguments(qwen3) and takes_string_arguments(template_text("mistral"))
    for name in ("glm45", "gpt_oss", "llama3", "qwen25"):
        assert not takes_string_arguments(template_text(name)), name
    assert not takes_string_arguments(None)
    assert takes_string_arguments({"default": "x", "tool_use": qwen3})


WRITTEN = [
    {"role": "user", "content": "Add 1 and 2."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "abcDEF123",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"a": 1, "b": 2, "note": "é"}'},
            }
        ],
    },
    {"role": "tool", "content": "3", "tool_call_id": "abcDEF123"},
    {"role": "user", "content": "And 2 + 2?"},
]


def test_a_written_tool_call_keeps_the_json_text_where_the_template_takes_strings(
    tokenizers, qwen3_template
):
    """Qwen3 renders string arguments verbatim: the text is json.dumps of the args (ASCII
    escapes kept) and the tool message is plain, as before the chat model was format-aware.
    A tool message answering no call of the turn before it keeps its id and name."""
    messages = from_chat_dicts(WRITTEN)
    rendered = to_chat_dicts(messages, get_format("hermes"))
    assert rendered == [
        WRITTEN[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "abcDEF123",
                    "type": "function",
                    "function": {
                        "name": "calc",
                        "arguments": '{"a": 1, "b": 2, "note": "\\u00e9"}',
                    },
                }
            ],
        },
        {"role": "tool", "content": "3"},
        WRITTEN[3],
    ]
    assert to_chat_dicts(messages) == rendered
    text = tokenizers["glm45"].apply_chat_template(
        rendered, tokenize=False, chat_template=qwen3_template
    )
    assert '"arguments": {"a": 1, "b": 2, "note": "\\u00e9"}}' in text
    stray = ToolMessage("4", tool_call_id="other", name="calc")
    assert to_chat_dicts([*messages, stray])[-1] == {
        "role": "tool",
        "content": "4",
        "tool_call_id": "other",
        "name": "calc",
    }


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_a_written_tool_call_in_the_prompt_renders_in_every_family(tokenizers, name):
    """GLM iterates the arguments (a dict is needed), gpt-oss applies tojson to them (a
    string would be quoted), mistral needs the id on the tool message."""
    family, tok = FAMILIES[name], tokenizers[name]
    context = AgentLoopContext(ScriptedServer(tok, []), tok, make_config(family), {})
    model = AgentLoopChatModel.for_loop(ReactAgentLoop(context), {})
    messages = from_chat_dicts(WRITTEN)
    answer = await model.bind_tools([CALC_SCHEMA]).ainvoke(messages)
    prompt = decode(tok, answer.response_metadata["agentloop"]["prompt_ids"])
    fmt = get_format(name)
    rendered = to_chat_dicts(
        messages, fmt, string_arguments=takes_string_arguments(tok.chat_template)
    )
    arguments = rendered[1]["tool_calls"][0]["function"]["arguments"]
    assert arguments == (
        {"a": 1, "b": 2, "note": "é"}
        if name not in ("mistral", "mistral_v7")
        else json.dumps({"a": 1, "b": 2, "note": "é"})
    )
    assert prompt == tok.apply_chat_template(
        rendered,
        tools=[CALC_SCHEMA],
        add_generation_prompt=True,
        tokenize=False,
        **family.template_kwargs,
    )
    shown = {
        "mistral": '[TOOL_RESULTS] {"content": 3, "call_id": "abcDEF123"}[/TOOL_RESULTS]',
        "gpt-oss": "<|start|>assistant to=functions.calc<|channel|>commentary json<|message|>"
        '{"a": 1, "b": 2, "note": "é"}<|call|><|start|>functions.calc to=assistant',
        "glm45": "<arg_key>note</arg_key>\n<arg_value>é</arg_value>\n</tool_call>"
        "<|observation|>\n<tool_response>\n3\n</tool_response>",
        "mistral_v7": "[TOOL_RESULTS]abcDEF123[TOOL_CONTENT]3[/TOOL_RESULTS]",
        "glm47": "<arg_key>note</arg_key><arg_value>é</arg_value></tool_call>"
        "<|observation|><tool_response>3</tool_response>",
    }
    assert shown[name] in prompt
    if name == "gpt-oss":
        assert rendered[2] == {"role": "tool", "name": "calc", "content": "3"}


def test_tool_messages_of_a_sampled_turn_in_the_hermes_rendering_are_plain():
    """Without a format (and for hermes) a sampled turn is its text and its results are
    plain tool messages, as tool_agent renders them."""
    ai = AIMessage(
        content="Adding.",
        tool_calls=[{"name": "calc", "args": {"a": 1, "b": 2}, "id": "call_1"}],
        response_metadata={
            "agentloop": {
                "text": "Adding.\n<tool_call>x</tool_call>",
                "parsed": {
                    "content": "Adding.",
                    "items": [
                        {
                            "name": "calc",
                            "arguments": {"a": 1, "b": 2},
                            "raw": "x",
                            "repaired": False,
                        }
                    ],
                },
                "call_order": ["call_1"],
            }
        },
    )
    messages = [HumanMessage("hi"), ai, ToolMessage("3", tool_call_id="call_1", name="calc")]
    expected = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Adding.\n<tool_call>x</tool_call>"},
        {"role": "tool", "content": "3"},
    ]
    assert to_chat_dicts(messages) == expected
    assert to_chat_dicts(messages, get_format("hermes")) == expected

"""gpt-oss (Harmony): the parser (both recipient placements, per-call errors, repair), end
tokens (``<|call|>``/``<|return|>``; ``<|end|>`` inside a turn never ends it), template
detection, exact trajectories on the project's gpt-oss template (property test: prompt +
sampled + deltas == full render apart from the template's analysis drop and ``<|return|>``
-> ``<|end|>``), ToolAgentLoop runs, and the template and parser against openai_harmony."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import detect_format, end_tokens, get_format, resolve_format
from agentloop.formats.gpt_oss import (
    CALL_HINT,
    GPT_OSS,
    GptOssToolParser,
    harmony_assistant_message,
    harmony_history_rewrite,
    split_messages,
)
from agentloop.parsers import ToolCall, ToolCallError
from agentloop.tokens import TemplateDeltaError, Trajectory, encode_delta, encode_prompt, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import (
    FAMILY_TOKENS,
    TEMPLATES,
    decode,
    family_tokenizer,
    property_settings,
    template_text,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
SPECIAL = FAMILY_TOKENS["gpt_oss"].special
ASSISTANT = "<|start|>assistant"
DATE = "2025-06-28"
KW = {"current_date": DATE}
PROPERTY = property_settings(50)


@pytest.fixture(scope="module")
def tok(tiny_qwen3_path):
    return family_tokenizer(tiny_qwen3_path, "gpt_oss")


@pytest.fixture(scope="module")
def harmony():
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def parse(text: str, repair: bool = True):
    return GptOssToolParser(repair=repair).parse(text)


def render(tokenizer, messages, tools=None, *, add_generation_prompt=True) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **KW
    )


def full_ids(tokenizer, messages, tools=None, *, add_generation_prompt=True) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **KW,
    )


def delta(tokenizer, history, new, tools=None, *, ends, sampled_end=CALL, head=None) -> list[int]:
    return encode_delta(
        tokenizer,
        history,
        new,
        tools,
        eot_token=ends,
        sampled_end=sampled_end,
        head=head,
        check=head is not None,
        history_rewrite=GPT_OSS.history_rewrite,
        chat_template_kwargs=KW,
    )


def call_text(name: str, args: str, *, harmony_style: bool = True) -> str:
    """A call message as the model samples it, right after ``<|start|>assistant``."""
    if harmony_style:
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
    return f" to=functions.{name}<|channel|>commentary json<|message|>{args}"


def analysis(text: str) -> str:
    return f"<|channel|>analysis<|message|>{text}<|end|>{ASSISTANT}"


# ---- parser ----------------------------------------------------------------------------------
def test_a_call_after_analysis_in_harmony_placement():
    text = analysis("Need to add.") + call_text("calc", '{"a": 2, "b": 3}')
    parsed = parse(text)
    assert parsed.items == [ToolCall("calc", {"a": 2, "b": 3}, raw='{"a": 2, "b": 3}')]
    assert parsed.content == ""


def test_the_recipient_may_also_precede_the_channel():
    parsed = parse(call_text("calc", '{"a": 1, "b": 2}', harmony_style=False))
    assert parsed.items == [ToolCall("calc", {"a": 1, "b": 2}, raw='{"a": 1, "b": 2}')]


def test_several_calls_keep_their_order_and_a_malformed_one_is_one_error():
    text = (
        "<|channel|>commentary<|message|>Checking both.<|end|>"
        + ASSISTANT
        + call_text("calc", '{"a": 1, "b": 2}')
        + CALL
        + ASSISTANT
        + call_text("calc", '{"a": 1 2}', harmony_style=False)
        + CALL
        + ASSISTANT
        + call_text("now", "")
    )
    parsed = parse(text)
    assert parsed.items == [
        ToolCall("calc", {"a": 1, "b": 2}, raw='{"a": 1, "b": 2}'),
        ToolCallError(
            "bad_json",
            f"tool call 2 (calc) is not valid JSON (Expecting ',' delimiter at char 8); "
            f"{CALL_HINT}",
            '{"a": 1 2}',
            "calc",
        ),
        ToolCall("now", {}, raw=""),
    ]
    assert parsed.content == "Checking both."


def test_repair_fixes_single_quotes_and_trailing_commas_and_is_marked():
    (item,) = parse(call_text("calc", "{'a': 2, 'b': 3,}")).items
    assert item == ToolCall("calc", {"a": 2, "b": 3}, raw="{'a': 2, 'b': 3,}", repaired=True)


def test_without_repair_the_same_call_is_the_error_the_served_model_would_get():
    (item,) = parse(call_text("calc", "{'a': 2, 'b': 3,}"), repair=False).items
    assert item == ToolCallError(
        "bad_json",
        "tool call 1 (calc) is not valid JSON (Expecting property name enclosed in double "
        f"quotes at char 1); {CALL_HINT}",
        "{'a': 2, 'b': 3,}",
        "calc",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            call_text("calc", "[1, 2]"),
            ToolCallError(
                "bad_arguments",
                "arguments of tool call 1 (calc) must be a JSON object, got an array",
                "[1, 2]",
                "calc",
            ),
        ),
        (
            "<|channel|>commentary <|constrain|>json<|message|>{}",
            ToolCallError("missing_name", f"tool call 1 names no function; {CALL_HINT}", "{}"),
        ),
        (
            "<|channel|>commentary to=functions. <|constrain|>json<|message|>{}",
            ToolCallError("missing_name", f"tool call 1 names no function; {CALL_HINT}", "{}"),
        ),
        (
            f"<|channel|>commentary<|message|>x{CALL}",
            ToolCallError("missing_name", f"tool call 1 names no function; {CALL_HINT}", "x"),
        ),
    ],
    ids=["not-an-object", "no-recipient", "empty-name", "call-without-recipient"],
)
def test_each_malformed_call_is_one_error(text, error):
    assert parse(text).items == [error]


def test_other_namespaces_keep_the_full_recipient_for_the_unknown_tool_check():
    (item,) = parse('<|channel|>analysis to=browser.search<|message|>{"q": "x"}').items
    assert item == ToolCall("browser.search", {"q": "x"}, raw='{"q": "x"}')


def test_content_is_the_final_and_commentary_text_without_the_reasoning():
    text = (
        analysis("The user wants 5.")
        + "<|channel|>commentary<|message|>Preamble.<|end|>"
        + ASSISTANT
        + "<|channel|>final<|message|>The answer is 5."
    )
    parsed = parse(text)
    assert (parsed.content, parsed.items) == ("Preamble.\nThe answer is 5.", [])
    assert parse("just text, no channel").content == "just text, no channel"


def test_messages_of_other_roles_are_neither_calls_nor_content():
    text = (
        call_text("calc", '{"a": 1, "b": 1}')
        + CALL
        + '<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"2"<|end|>'
    )
    parsed = parse(text)
    assert [i.name for i in parsed.items] == ["calc"] and parsed.content == ""


def test_split_messages_reads_both_headers():
    text = analysis("hmm") + call_text("calc", "{}", harmony_style=False)
    first, second = split_messages(text)
    assert (first.channel, first.recipient, first.body, first.end) == ("analysis", None, "hmm", END)
    assert (second.channel, second.recipient, second.body, second.end) == (
        "commentary",
        "functions.calc",
        "{}",
        None,
    )


# ---- format, end tokens, detection -----------------------------------------------------------
def test_the_format_is_registered_under_verls_name_and_its_aliases():
    assert get_format("gpt-oss") is get_format("harmony") is get_format("openai") is GPT_OSS
    assert isinstance(GPT_OSS.new_parser(repair=False), GptOssToolParser)


def test_end_tokens_are_call_and_return_and_only_call_runs_tools(tok):
    ends = end_tokens(tok, GPT_OSS)
    ids = {t: tok.convert_tokens_to_ids(t) for t in (CALL, RETURN, END)}
    assert ends.strings == (CALL, RETURN)
    assert ends.ids == {ids[CALL], ids[RETURN]}
    assert ends.call_ids == {ids[CALL]}
    assert ids[END] not in ends.ids  # <|end|> closes messages inside a turn
    assert ends.opens_next is False


def test_detect_format_finds_gpt_oss_and_only_in_its_template(tiny_qwen3_path, tok):
    assert detect_format(template_text("gpt_oss")) == "gpt-oss"
    assert resolve_format(None, tok) is GPT_OSS
    assert detect_format(AutoTokenizer.from_pretrained(tiny_qwen3_path).chat_template) != "gpt-oss"
    for path in TEMPLATES.glob("*.jinja"):
        if path.stem != "gpt_oss":
            assert detect_format(path.read_text()) != "gpt-oss", path.name


# ---- template --------------------------------------------------------------------------------
def test_the_template_renders_system_developer_tools_calls_results_and_the_prompt(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "thinking": "Use calc.",
            "tool_calls": [{"function": {"name": "calc", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    assert render(tok, messages, [CALC_SCHEMA]) == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {DATE}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Add two integers.\ntype calc = (_: {\na: number,\n"
        "b: number,\n}) => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>What is 2 + 3?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Use calc.<|end|>"
        '<|start|>assistant to=functions.calc<|channel|>commentary json<|message|>{"a": 2, "b": 3}'
        "<|call|>"
        '<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"5"<|end|>'
        "<|start|>assistant"
    )


def test_the_template_drops_tool_call_analysis_once_a_final_answer_follows(tok):
    chain = [
        {"role": "user", "content": "Add."},
        {
            "role": "assistant",
            "thinking": "Use calc.",
            "tool_calls": [{"function": {"name": "calc", "arguments": {}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    assert "Use calc." in render(tok, chain)
    answered = [*chain, {"role": "assistant", "thinking": "Done.", "content": "5"}]
    last = render(tok, answered, add_generation_prompt=False)
    assert "Use calc." not in last
    assert last.endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Done.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>5<|return|>"
    )
    later = render(tok, [*answered, {"role": "user", "content": "Again"}])
    assert "Done." not in later
    assert "<|channel|>final<|message|>5<|end|><|start|>user<|message|>Again<|end|>" in later


def test_history_rewrite_drops_analysis_and_maps_return_to_end():
    text = (
        "<|start|>user<|message|>x<|end|><|start|>assistant<|channel|>analysis<|message|>a<|end|>"
        "<|start|>assistant<|channel|>final<|message|>y<|return|>"
    )
    assert harmony_history_rewrite(text) == (
        "<|start|>user<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y<|end|>"
    )


# ---- deltas ----------------------------------------------------------------------------------
def test_a_tool_delta_is_the_json_encoded_result_and_the_generation_prompt(tok):
    text = analysis("Use calc.") + call_text("calc", '{"a": 2, "b": 3}')
    history = [{"role": "user", "content": "2 + 3?"}, harmony_assistant_message(text, parse(text))]
    new = [{"role": "tool", "name": "calc", "content": "5"}]
    ends = end_tokens(tok, GPT_OSS).strings
    ids = delta(tok, history, new, [CALC_SCHEMA], ends=ends, head=1)
    assert decode(tok, ids) == (
        '<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"5"<|end|>' + ASSISTANT
    )
    # counting every message-closing token cuts at the same place
    assert delta(tok, history, new, [CALC_SCHEMA], ends=(END, CALL, RETURN), head=1) == ids


def test_after_a_final_answer_the_cut_counts_the_message_closing_tokens(tok):
    # The template renders the last final answer with <|return|> and, once a user message
    # follows, with <|end|>: counting only <|call|>/<|return|> (the tokens that stop the
    # engine) finds no cut; the format's boundaries count <|end|> too.
    ends = end_tokens(tok, GPT_OSS)
    assert ends.boundaries == (END, CALL, RETURN)
    assert ends.strings == (CALL, RETURN)
    text = analysis("Greet.") + "<|channel|>final<|message|>Hello."
    history = [
        {"role": "user", "content": "Hi"},
        harmony_assistant_message(text, parse(text)),
    ]
    assert history[1] == {"role": "assistant", "content": "Hello."}
    new = [{"role": "user", "content": "Again"}]
    with pytest.raises(TemplateDeltaError) as info:
        delta(tok, history, new, ends=ends.strings, sampled_end=RETURN)
    assert str(info.value) == (
        "the chat template renders the new messages without the end-of-turn token "
        "'<|call|>' or '<|return|>' that closes the history; a delta cannot be appended to the "
        "sampled tokens"
    )
    ids = delta(tok, history, new, ends=ends.boundaries, sampled_end=RETURN)
    assert decode(tok, ids) == "<|start|>user<|message|>Again<|end|>" + ASSISTANT


# ---- property: sampled ids + deltas == the full render, apart from the documented rewrites ----
MARKUP = [
    "<|start",
    "end|>",
    "<|",
    "|>",
    "to=functions.x",
    "<|channel",
    "analysis",
    "commentary",
    '{"a": 1}',
    "assistant",
    "\n",
    "\n\n",
    "  ",
    "é",
    "日本語",
    "🙂",
]


def no_special(text: str) -> bool:
    return not any(token in text for token in SPECIAL)


texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=10), st.sampled_from(MARKUP)
        ),
        max_size=5,
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)))
    .filter(no_special)
)
names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
values = st.one_of(st.integers(-1000, 1000), st.booleans(), texts)


@dataclass
class Turn:
    sampled: str
    """The turn as sampled, end token included (what the template renders for it as last)."""
    end: str
    thinking: str | None
    body: str
    """The sampled turn without its analysis and end token."""
    final: bool
    new: list[dict[str, Any]]


@st.composite
def conversations(draw) -> tuple[list[dict], list[dict] | None, list[Turn]]:
    first: list[dict[str, Any]] = []
    if draw(st.booleans()):
        first.append({"role": "system", "content": draw(texts)})
    first.append({"role": "user", "content": draw(texts)})
    tool_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
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
            for name in tool_names
        ]
    turns = []
    # each turn is a final answer (True) or a tool call (False)
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=4))
    for i, final in enumerate(kinds):
        last = i == len(kinds) - 1
        thinking = f"r{i}-" + draw(texts) if draw(st.booleans()) else None
        if final:  # a final answer; a user message may follow
            body = "<|channel|>final<|message|>" + draw(texts)
            end = RETURN
            new = (
                [{"role": "user", "content": draw(texts)}]
                if not last or draw(st.booleans())
                else []
            )
        else:  # one call (Harmony ends the turn at <|call|>), its result, maybe a user message
            args = draw(st.dictionaries(names, values, max_size=3))
            body = call_text(
                draw(st.sampled_from(tool_names)),
                json.dumps(args, ensure_ascii=False),
                harmony_style=False,
            )
            end = CALL
            new = []
            if not last or draw(st.booleans()):
                new = [{"role": "tool", "content": draw(texts)}]
                if draw(st.booleans()):
                    new.append({"role": "user", "content": draw(texts)})
        sampled = (analysis(thinking) if thinking else "") + body + end
        turns.append(Turn(sampled, end, thinking, body, final, new))
    return first, tools, turns


def rendered_as_last(tok, message: dict[str, Any]) -> str:
    """What the template renders for ``message`` as the last message after a generation
    prompt: the text the model samples for it."""
    head = render(tok, [{"role": "user", "content": "q"}])
    text = render(tok, [{"role": "user", "content": "q"}, message], add_generation_prompt=False)
    assert text.startswith(head)
    return text[len(head) :]


@PROPERTY
@given(conversation=conversations())
def test_sampled_ids_plus_deltas_equal_the_full_tokenization_apart_from_the_rewrites(
    tok, conversation
):
    first, tools, turns = conversation
    ends = end_tokens(tok, GPT_OSS).strings
    prompt = full_ids(tok, first, tools)
    traj = Trajectory(prompt, budget=100_000)
    history = list(first)
    for turn in turns:
        text = turn.sampled.removesuffix(turn.end)
        message = harmony_assistant_message(text, parse(text))
        if not turn.final:  # the history message renders the sampled turn back exactly
            assert rendered_as_last(tok, message) == turn.sampled
        traj.add_sampled(tok.encode(turn.sampled, add_special_tokens=False), None)
        history.append(message)
        if not turn.new:
            continue
        boundaries = end_tokens(tok, GPT_OSS).boundaries
        ids = delta(
            tok, history, turn.new, tools, ends=boundaries, sampled_end=turn.end, head=len(first)
        )
        if turn.end == CALL:  # the format's own end tokens give the same delta
            assert delta(tok, history, turn.new, tools, ends=ends, head=len(first)) == ids
        assert decode(tok, ids).endswith(ASSISTANT)
        assert traj.add_template(ids)
        history += turn.new

    # the mask-1 spans are exactly the sampled turns
    spans = mask_spans(traj.response_ids, traj.response_mask, 1)
    assert [decode(tok, s) for s in spans] == [t.sampled for t in turns]

    # the full render holds each turn as the template rewrites it: a tool-call turn loses its
    # analysis once a final answer follows; a final answer never shows its analysis in history
    # and ends with <|end|> unless it is the conversation's last message
    expected = list(prompt)
    deltas = iter(mask_spans(traj.response_ids, traj.response_mask, 0))
    rewritten = False
    for i, turn in enumerate(turns):
        later_final = any(t.final for t in turns[i + 1 :])
        keep = turn.thinking is not None and not turn.final and not later_final
        end = END if turn.final and (turn.new or i < len(turns) - 1) else turn.end
        shown = (analysis(turn.thinking) if keep else "") + turn.body + end
        rewritten = rewritten or shown != turn.sampled
        expected += tok.encode(shown, add_special_tokens=False)
        if turn.new:
            expected += next(deltas)
    full = full_ids(tok, history, tools, add_generation_prompt=bool(turns[-1].new))
    assert expected == full
    if not rewritten:  # no rewrite applies: the trajectory is the full tokenization itself
        assert traj.context_ids() == full


# ---- ToolAgentLoop ---------------------------------------------------------------------------
class HarmonyServer(ScriptedServer):
    """Scripted turns, each ending with its own end token (<|call|> or <|return|>)."""

    def __init__(self, tokenizer, turns: list[tuple[str, str]]) -> None:
        super().__init__(tokenizer, [text for text, _ in turns], end_token=CALL)
        self.turn_ends = [tokenizer.convert_tokens_to_ids(end) for _, end in turns]

    async def generate(self, request):
        self.eot = self.turn_ends.pop(0)
        return await super().generate(request)


PROMPT = [{"role": "user", "content": "What is 2 + 3 + 1?"}]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


def make_loop(tok, turns):
    server = HarmonyServer(tok, turns)
    config = RolloutConfig(
        prompt_length=2048,
        response_length=1024,
        multi_turn=MultiTurnConfig(format="gpt-oss"),
        chat_template_kwargs=dict(KW),
    )
    return ToolAgentLoop(AgentLoopContext(server, tok, config, {"calc": CalcTool()})), server


async def test_tool_agent_runs_two_tool_turns_then_stops_at_the_final_answer(tok):
    turns = [
        (analysis("Add 2 and 3 first.") + call_text("calc", '{"a": 2, "b": 3}'), CALL),
        (call_text("calc", '{"a": 5, "b": 1}', harmony_style=False), CALL),
        (analysis("Done.") + "<|channel|>final<|message|>The answer is 6.", RETURN),
    ]
    loop, server = make_loop(tok, turns)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)

    tools = [CALC_SCHEMA]
    prompt = encode_prompt(tok, PROMPT, tools=tools, chat_template_kwargs=KW)
    ends = end_tokens(tok, GPT_OSS).strings
    history = list(PROMPT)
    deltas = []
    for (text, _), result in zip(turns[:2], ["5", "6"], strict=True):
        history.append(harmony_assistant_message(text, parse(text)))
        new = [{"role": "tool", "name": "calc", "content": result}]
        deltas.append(delta(tok, history, new, tools, ends=ends, head=len(PROMPT)))
        history += new
    s = server.sampled
    assert out.prompt_ids == prompt
    assert out.response_ids == s[0] + deltas[0] + s[1] + deltas[1] + s[2]
    assert mask_spans(out.response_ids, out.response_mask, 0) == deltas
    assert [decode(tok, span) for span in mask_spans(out.response_ids, out.response_mask, 1)] == [
        text + end for text, end in turns
    ]
    assert [decode(tok, d) for d in deltas] == [
        f'<|start|>functions.calc to=assistant<|channel|>commentary<|message|>"{r}"<|end|>'
        + ASSISTANT
        for r in ("5", "6")
    ]
    # <|end|> inside a turn did not stop it; the engine stops on <|call|> and <|return|> only
    ids = {t: tok.convert_tokens_to_ids(t) for t in (CALL, RETURN, END)}
    for request in server.requests:
        assert {ids[CALL], ids[RETURN]} <= set(request["stop_token_ids"])
        assert ids[END] not in request["stop_token_ids"]
    assert server.requests[2]["prompt_ids"] == prompt + out.response_ids[: -len(s[2])]
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 2 and out.record.tool_errors == 0
    assert out.num_turns == 6


@pytest.mark.parametrize(
    ("turn", "name", "message"),
    [
        (
            call_text("calc", '{"a": 1 2}'),
            "calc",
            "Error: tool call 1 (calc) is not valid JSON (Expecting ',' delimiter at char 8); "
            + CALL_HINT,
        ),
        (
            "<|channel|>commentary <|constrain|>json<|message|>{}",
            "unknown",
            f"Error: tool call 1 names no function; {CALL_HINT}",
        ),
        (
            call_text("browser.search", '{"q": "x"}').replace("functions.", ""),
            "browser.search",
            "Error: unknown tool 'browser.search'; available tools: calc",
        ),
    ],
    ids=["bad_json", "missing_name", "unknown_tool"],
)
async def test_a_malformed_call_is_answered_by_a_tool_message_naming_it(tok, turn, name, message):
    loop, server = make_loop(tok, [(turn, CALL), ("<|channel|>final<|message|>ok", RETURN)])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    (tool_delta,) = mask_spans(out.response_ids, out.response_mask, 0)
    assert decode(tok, tool_delta) == (
        f"<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>"
        f"{json.dumps(message, ensure_ascii=False)}<|end|>{ASSISTANT}"
    )
    assert len(server.requests) == 2 and out.record.tool_calls == 0


async def test_a_call_in_a_turn_that_ends_with_return_is_not_run(tok):
    loop, server = make_loop(tok, [(call_text("calc", '{"a": 1, "b": 1}'), RETURN)])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert out.record.stop_reason == "no_tool_call"
    assert len(server.requests) == 1 and out.record.tool_calls == 0
    assert out.response_mask == [1] * len(out.response_ids)


# ---- the official renderer and parser (openai_harmony) ---------------------------------------
def harmony_text(harmony, messages: list[Message], *, completion: bool = True) -> str:
    conversation = Conversation.from_messages(messages)
    if completion:
        return harmony.decode(
            harmony.render_conversation_for_completion(conversation, Role.ASSISTANT)
        )
    return harmony.decode(harmony.render_conversation(conversation))


def harmony_system() -> Message:
    return Message.from_role_and_content(
        Role.SYSTEM, SystemContent.new().with_conversation_start_date(DATE)
    )


PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": "string", "nullable": True},
    },
    "required": ["city"],
}


def test_prompt_with_instructions_and_tools_matches_harmony(tok, harmony):
    tools = [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Forecast.", "parameters": PARAMETERS},
        },
        {"type": "function", "function": {"name": "now", "description": "Current time."}},
    ]
    ours = render(
        tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], tools
    )
    developer = (
        DeveloperContent.new()
        .with_instructions("Be brief.")
        .with_function_tools(
            [
                ToolDescription.new("weather", "Forecast.", parameters=PARAMETERS),
                ToolDescription.new("now", "Current time."),
            ]
        )
    )
    official = harmony_text(
        harmony,
        [
            harmony_system(),
            Message.from_role_and_content(Role.DEVELOPER, developer),
            Message.from_role_and_content(Role.USER, "Hi"),
        ],
    )
    assert ours == official


def test_history_with_final_answers_matches_harmony_analysis_dropped(tok, harmony):
    ours = render(
        tok,
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "thinking": "Greet back.", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
    )
    official = harmony_text(
        harmony,
        [
            harmony_system(),
            Message.from_role_and_content(Role.USER, "Hi"),
            Message.from_role_and_content(Role.ASSISTANT, "Greet back.").with_channel("analysis"),
            Message.from_role_and_content(Role.ASSISTANT, "Hello!").with_channel("final"),
            Message.from_role_and_content(Role.USER, "Bye"),
        ],
    )
    assert ours == official


def harmony_chain(final: bool) -> list[Message]:
    args = json.dumps({"city": "Oslo"})
    messages = [
        harmony_system(),
        Message.from_role_and_content(Role.USER, "Weather?"),
        Message.from_role_and_content(Role.ASSISTANT, "Ask the tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, args)
        .with_channel("commentary")
        .with_recipient("functions.weather")
        .with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.weather"), "Sunny, 20 C")
        .with_channel("commentary")
        .with_recipient("assistant"),
    ]
    if final:
        messages.append(
            Message.from_role_and_content(Role.ASSISTANT, "Sunny.").with_channel("final")
        )
        messages.append(Message.from_role_and_content(Role.USER, "Thanks"))
    return messages


def ours_chain(final: bool) -> list[dict[str, Any]]:
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "thinking": "Ask the tool.",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "Sunny, 20 C"},
    ]
    if final:
        messages += [
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Thanks"},
        ]
    return messages


def as_harmony_headers(text: str) -> str:
    """The official HF template's tool-call and tool-result headers written the way
    openai_harmony writes them (recipient after the channel, ``<|constrain|>json``, the result
    as sent rather than JSON-encoded)."""
    text = re.sub(
        r"<\|start\|>assistant to=(\S+?)<\|channel\|>commentary json<\|message\|>",
        r"<|start|>assistant<|channel|>commentary to=\1 <|constrain|>json<|message|>",
        text,
    )
    return re.sub(
        r"<\|start\|>(functions\.\S+?) to=assistant<\|channel\|>commentary<\|message\|>"
        r"(.*?)<\|end\|>",
        lambda m: (
            f"<|start|>{m.group(1)}<|channel|>commentary to=assistant<|message|>"
            f"{json.loads(m.group(2))}<|end|>"
        ),
        text,
    )


@pytest.mark.parametrize("final", [False, True], ids=["in-chain", "after-final"])
def test_tool_chain_matches_harmony_apart_from_the_header_placement(tok, harmony, final):
    ours = render(tok, ours_chain(final))
    assert ('"Sunny, 20 C"' in ours) and ("to=functions.weather<|channel|>commentary json" in ours)
    assert ("Ask the tool." in ours) is not final  # both drop the analysis once answered
    official = harmony_text(harmony, harmony_chain(final))
    assert as_harmony_headers(ours) == official


def test_known_differences_from_harmony_are_the_official_templates(tok, harmony):
    # instructions without tools: the template keeps the "\n\n" after them
    ours = render(
        tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert "# Instructions\n\nBe brief.\n\n<|end|>" in ours
    official = harmony_text(
        harmony,
        [
            harmony_system(),
            Message.from_role_and_content(
                Role.DEVELOPER, DeveloperContent.new().with_instructions("Be brief.")
            ),
            Message.from_role_and_content(Role.USER, "Hi"),
        ],
    )
    assert "# Instructions\n\nBe brief.<|end|>" in official
    assert ours.replace("Be brief.\n\n<|end|>", "Be brief.<|end|>") == official
    # a parameter default: the template writes a comma after the comment too
    params = {"type": "object", "properties": {"n": {"type": "integer", "default": 3}}}
    tool = {
        "type": "function",
        "function": {"name": "f", "description": "F.", "parameters": params},
    }
    assert "n?: number, // default: 3,\n}" in render(
        tok, [{"role": "user", "content": "Hi"}], [tool]
    )
    developer = DeveloperContent.new().with_function_tools(
        [ToolDescription.new("f", "F.", parameters=params)]
    )
    assert "n?: number, // default: 3\n}" in harmony_text(
        harmony,
        [
            harmony_system(),
            Message.from_role_and_content(Role.DEVELOPER, developer),
            Message.from_role_and_content(Role.USER, "Hi"),
        ],
    )


@st.composite
def sampled_turns(draw) -> str:
    """A turn as a gpt-oss model writes it: analysis/commentary messages, then a call (either
    recipient placement) or a final answer, ended by its <|call|>/<|return|>."""
    parts = []
    for _ in range(draw(st.integers(0, 2))):
        channel = draw(st.sampled_from(["analysis", "commentary"]))
        parts.append(f"<|channel|>{channel}<|message|>{draw(texts)}<|end|>")
    if draw(st.booleans()):
        args = json.dumps(draw(st.dictionaries(names, values, max_size=2)), ensure_ascii=False)
        tail = call_text(draw(names), args, harmony_style=draw(st.booleans())) + CALL
    else:
        tail = f"<|channel|>final<|message|>{draw(texts)}{RETURN}"
    return ASSISTANT.join([*parts, tail])


@PROPERTY
@given(turn=sampled_turns())
def test_the_parser_reads_turns_as_openai_harmony_does(harmony, turn):
    theirs = harmony.parse_messages_from_completion_tokens(
        harmony.encode(turn, allowed_special="all"), Role.ASSISTANT
    )
    end = CALL if turn.endswith(CALL) else RETURN
    ours = split_messages(turn.removesuffix(end))
    assert [(m.channel, m.recipient, m.body) for m in ours] == [
        (m.channel, m.recipient, m.content[0].text) for m in theirs
    ]
    assert [m.constrain for m in ours] == [
        (m.content_type or "").removeprefix("<|constrain|>") or None
        if "<|constrain|>" in (m.content_type or "")
        else None
        for m in theirs
    ]
    parsed = parse(turn.removesuffix(end))
    calls = [m for m in theirs if m.recipient]
    assert [item.name for item in parsed.items] == [
        m.recipient.removeprefix("functions.") for m in calls
    ]
    assert [item.arguments for item in parsed.items] == [
        json.loads(m.content[0].text) for m in calls
    ]

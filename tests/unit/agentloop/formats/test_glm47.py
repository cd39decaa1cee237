"""The glm47 format (GLM-4.7, a variant of glm45): its template selects it, also under
``multi_turn.format=glm45``; earlier reasoning re-rendered as a bare ``</think>`` is the
documented rewrite, so a user message after an answer (with reasoning or without) is a delta
where glm45's rewrite raised ``TemplateDeltaError``; exact deltas over random conversations;
one ``ToolAgentLoop`` run with the format derived from the template."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.formats import detect_format, end_tokens, get_format, resolve_format
from agentloop.formats.glm import GLM45, GLM47, GlmToolParser, drop_earlier_reasoning
from agentloop.tokens import TemplateDeltaError, encode_delta, mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.chat_families import decode, family_tokenizer, property_settings, render, template_text
from tests.unit.agentloop.formats.test_glm import SCHEMAS, TOOLS
from tests.unit.agentloop.scripted import CALC_SCHEMA, CalcTool, ScriptedServer

ENDS = ("<|observation|>", "<|user|>", "<|endoftext|>")
PROPERTY = property_settings(40)


@pytest.fixture(scope="module")
def glm(tiny_qwen3_path):
    return family_tokenizer(tiny_qwen3_path, "glm47")


def call(name: str, **arguments: Any) -> str:
    """A call as GLM-4.7 writes it (and its template renders it): no line breaks."""
    pairs = "".join(
        f"<arg_key>{k}</arg_key><arg_value>"
        f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</arg_value>"
        for k, v in arguments.items()
    )
    return f"<tool_call>{name}{pairs}</tool_call>"


def delta(tokenizer, history, new, tools=TOOLS, *, sampled_end, fmt=GLM47, **kwargs) -> list[int]:
    return encode_delta(
        tokenizer,
        history,
        new,
        tools,
        eot_token=ENDS,
        opens_next=True,
        sampled_end=sampled_end,
        history_rewrite=fmt.history_rewrite,
        **kwargs,
    )


# ---- selection -------------------------------------------------------------------------------
def test_the_glm47_template_selects_glm47_also_when_glm45_is_configured(glm, tiny_qwen3_path):
    assert detect_format(template_text("glm47")) == "glm47"
    assert detect_format(template_text("glm45")) == "glm45"
    for name in (None, "glm45", "glm4.5", "glm46", "glm47", "glm4.7"):
        assert resolve_format(name, glm) is GLM47
    glm45 = family_tokenizer(tiny_qwen3_path, "glm45")
    assert resolve_format("glm45", glm45) is GLM45
    assert get_format("glm4.7") is GLM47


def test_glm47_keeps_glm45_s_parser_and_end_tokens(glm):
    ends = end_tokens(glm, GLM47)
    assert ends.strings == ENDS and ends.opens_next
    assert ends.call_ids == {glm.convert_tokens_to_ids("<|observation|>")}
    parsed = GLM47.new_parser().parse("Add.</think>Sure." + call("calc", a=2, b=3))
    assert [(c.name, c.arguments) for c in parsed.items] == [("calc", {"a": 2, "b": 3})]


# ---- the rewrite -----------------------------------------------------------------------------
ANSWERED = [
    {"role": "user", "content": "2 + 3?"},
    {"role": "assistant", "content": "Add them.</think>It is 5."},
]
NEW = [{"role": "user", "content": "And 5 + 5?"}]


def test_earlier_reasoning_renders_as_a_bare_end_of_thinking(glm):
    assert render(glm, ANSWERED, add_generation_prompt=False).endswith(
        "<|assistant|><think>Add them.</think>It is 5."
    )
    assert render(glm, [*ANSWERED, *NEW]) == (
        "[gMASK]<sop><|user|>2 + 3?<|assistant|></think>It is 5.<|user|>And 5 + 5?"
        "<|assistant|><think>"
    )
    kept = render(glm, [*ANSWERED, *NEW], clear_thinking=False)
    assert "<|assistant|><think>Add them.</think>It is 5.<|user|>" in kept
    assert drop_earlier_reasoning("<think>x\ny</think>A<think></think>B</think>C") == (
        "</think>A</think>B</think>C"
    )


@pytest.mark.parametrize(
    "answer",
    ["Add them.</think>It is 5.", "</think>It is 5.", "It is 5."],
    ids=["reasoning", "empty reasoning", "thinking off"],
)
def test_a_user_message_after_an_answer_is_a_delta(glm, answer):
    history = [ANSWERED[0], {"role": "assistant", "content": answer}]
    for head in (None, 1):
        ids = delta(glm, history, NEW, sampled_end="<|user|>", head=head, check=head == 1)
        assert decode(glm, ids) == "And 5 + 5?<|assistant|><think>"
    off = delta(
        glm, history, NEW, sampled_end="<|user|>", chat_template_kwargs={"enable_thinking": False}
    )
    assert decode(glm, off) == "And 5 + 5?<|assistant|></think>"


def test_glm45_s_rewrite_does_not_explain_glm47_s_history(glm):
    """The failure the variant fixes: glm45's ``<think></think>`` is not what 4.7 writes."""
    with pytest.raises(TemplateDeltaError) as info:
        delta(glm, ANSWERED, NEW, sampled_end="<|user|>", fmt=GLM45)
    assert str(info.value).startswith("the chat template rewrites history when new messages")


def test_the_delta_starts_right_after_the_sampled_observation(glm):
    history = [ANSWERED[0], {"role": "assistant", "content": "Add.</think>" + call("calc", a=2)}]
    two = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "7"}]
    assert decode(glm, delta(glm, history, two, sampled_end="<|observation|>")) == (
        "<tool_response>5</tool_response><tool_response>7</tool_response><|assistant|><think>"
    )


# ---- property: prompt + sampled turns + deltas == the template's full tokenization -----------
PIECES = ["a", "B c", "\n", "  ", "é", "日本語", "🙂", "<", ">", "{", "}", '"', "/", "[1]", "think"]
words = st.lists(st.sampled_from(PIECES), max_size=5).map("".join).map(str.strip)
nonblank = words.map(lambda word: word or "w")


@st.composite
def tool_calls(draw) -> tuple[str, dict[str, Any]]:
    if draw(st.booleans()):
        return "calc", {"a": draw(st.integers(-9, 99)), "b": draw(st.integers(-9, 99))}
    return "lookup", {"q": draw(nonblank)} if draw(st.booleans()) else {}


@st.composite
def conversations(draw) -> dict[str, Any]:
    thinking = draw(st.booleans())
    first = [{"role": "system", "content": draw(words)}] if draw(st.booleans()) else []
    first.append({"role": "user", "content": draw(words)})
    n = draw(st.integers(1, 4))
    turns = []
    for i in range(n):
        calls = draw(st.lists(tool_calls(), max_size=2))
        reasoning = (f"r{i} " + draw(words)).strip() if thinking and draw(st.booleans()) else ""
        turn = {"reasoning": reasoning, "content": draw(words), "calls": calls}
        if calls:
            turn["new"] = [{"role": "tool", "content": draw(words)} for _ in calls]
        elif i < n - 1 or draw(st.booleans()):
            turn["new"] = [{"role": "user", "content": draw(words)}]
        else:
            turn["new"] = []
        turns.append(turn)
    tools = draw(st.sampled_from([TOOLS, None]))
    return {"thinking": thinking, "first": first, "tools": tools, "turns": turns}


def sampled_text(turn: dict[str, Any], thinking: bool) -> str:
    """The turn after the generation prompt (which opened ``<think>`` when thinking)."""
    text = f"{turn['reasoning']}</think>" if thinking else ""
    return text + turn["content"] + "".join(call(n, **a) for n, a in turn["calls"])


@PROPERTY
@given(conversation=conversations())
def test_sampled_ids_plus_deltas_equal_the_full_tokenization(glm, conversation):
    first, tools, thinking = conversation["first"], conversation["tools"], conversation["thinking"]
    kwargs = {} if thinking else {"enable_thinking": False}
    parser = GlmToolParser(schemas=SCHEMAS)
    ids = glm.apply_chat_template(
        first, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    mask, history, sampled_spans = [0] * len(ids), list(first), []
    reasoning_at = []  # (history index, reasoning) of each model turn
    for turn in conversation["turns"]:
        reasoning_at.append((len(history), turn["reasoning"]))
        text = sampled_text(turn, thinking)
        end = "<|observation|>" if turn["calls"] else "<|user|>"
        sampled = glm.encode(text + end, add_special_tokens=False)
        sampled_spans.append(text + end)
        ids += sampled
        mask += [1] * len(sampled)
        parsed = parser.parse(text)
        assert [(c.name, c.arguments) for c in parsed.items] == turn["calls"]
        history.append(GLM47.assistant_message(text, parsed))
        if turn["new"]:
            new_ids = delta(
                glm,
                history,
                turn["new"],
                tools,
                sampled_end=end,
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
        full += "<|user|>"  # the end token the model sampled last
    got = decode(glm, ids)
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    rewritten = [r for at, r in reasoning_at if thinking and (at < last_user or not r)]
    if rewritten:
        # the documented rewrite: reasoning before the last user message (and empty
        # reasoning anywhere) renders as a bare </think>; the trajectory keeps it as sampled
        for reasoning in rewritten:
            got = got.replace(f"<think>{reasoning}</think>", "</think>", 1)
        assert got == full
    else:
        assert ids == glm.encode(full, add_special_tokens=False)
    assert [decode(glm, span) for span in mask_spans(ids, mask, 1)] == sampled_spans


# ---- one tool_agent run ----------------------------------------------------------------------
async def test_tool_agent_run_with_the_format_derived_from_the_template(glm):
    turns = [
        "First add.</think>Let me add." + call("calc", a=2, b=3) + "<|observation|>",
        "Now + 2.</think>" + call("calc", a=5, b=2) + "<|observation|>",
        "Done.</think>The answer is 7.<|user|>",
    ]
    server = ScriptedServer(glm, turns, end_turn=False)
    config = RolloutConfig(
        prompt_length=1024, response_length=512, multi_turn=MultiTurnConfig(format="glm45")
    )
    loop = ToolAgentLoop(AgentLoopContext(server, glm, config, {"calc": CalcTool()}))
    prompt = [{"role": "user", "content": "What is 2 + 3, then + 2?"}]
    out = await loop.run({"temperature": 1.0}, raw_prompt=prompt)
    assert loop.chat_format is GLM47
    assert [decode(glm, d) for d in mask_spans(out.response_ids, out.response_mask, 0)] == [
        "<tool_response>5</tool_response><|assistant|><think>",
        "<tool_response>7</tool_response><|assistant|><think>",
    ]
    history = [*prompt]
    for text, result in zip(turns, ["5", "7", None], strict=True):
        history.append({"role": "assistant", "content": text.rsplit("<|", 1)[0]})
        if result is not None:
            history.append({"role": "tool", "content": result})
    full = render(glm, history, [CALC_SCHEMA], add_generation_prompt=False) + "<|user|>"
    assert out.prompt_ids + out.response_ids == glm.encode(full, add_special_tokens=False)
    assert out.record.tool_calls == 2 and out.record.stop_reason == "no_tool_call"

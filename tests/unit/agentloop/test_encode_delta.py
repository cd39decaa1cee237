"""encode_delta and Trajectory against the project's real chat templates (tiny-qwen3 with
<think> handling, SmolLM2): exact deltas, no history rewrite (property test over random
conversations, the suffix-only render checked against the full one), Qwen3's reasoning drop
kept out of the trajectory, template errors, budget."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from agentloop.tokens import TemplateDeltaError, Trajectory, encode_delta
from tests.chat_families import FAMILY_TOKENS, decode, property_settings, render
from tests.unit.agentloop.scripted import CALC_SCHEMA

SPECIAL = FAMILY_TOKENS["qwen25"].special  # Qwen3 has the same chat tokens
ASSISTANT = "<|im_start|>assistant\n"
TOOLS = [CALC_SCHEMA]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
PROPERTY = property_settings(60)


@pytest.fixture(scope="module")
def qwen(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def smollm(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def full_ids(tokenizer, messages, tools=None, **kwargs) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )


def suffix_after_history(before: str, after: str) -> str:
    """``after`` from just past the <|im_end|> that closes the history rendered as ``before``."""
    cut = -1
    for _ in range(before.count("<|im_end|>")):
        cut = after.index("<|im_end|>", cut + 1)
    return after[cut + len("<|im_end|>") :]


def assistant_texts(rendered: str) -> list[str]:
    """What the template renders for each assistant turn, between header and <|im_end|>."""
    return re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", rendered, re.DOTALL)


# ---- exact deltas ----------------------------------------------------------------------------
def test_qwen_tool_delta_starts_after_im_end_and_ends_with_the_generation_prompt(qwen):
    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": CALL},
    ]
    delta = encode_delta(qwen, history, [{"role": "tool", "content": "5"}], TOOLS)
    assert decode(qwen, delta) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_two_tool_messages_share_one_user_turn(qwen):
    history = [
        {"role": "user", "content": "Add twice."},
        {"role": "assistant", "content": CALL + "\n" + CALL},
    ]
    new = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "7"}]
    delta = encode_delta(qwen, history, new, TOOLS)
    assert decode(qwen, delta) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen_delta_with_thinking_disabled_ends_with_the_empty_think_block(qwen):
    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": CALL},
    ]
    delta = encode_delta(
        qwen,
        history,
        [{"role": "tool", "content": "5"}],
        TOOLS,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert decode(qwen, delta) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_smollm_delta_holds_a_tool_turn_then_a_user_turn(smollm):
    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": CALL},
    ]
    new = [{"role": "tool", "content": "5"}, {"role": "user", "content": "And 5 + 5?"}]
    delta = encode_delta(smollm, history, new, TOOLS)
    assert decode(smollm, delta) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nAnd 5 + 5?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("text", [" Sure.\n" + CALL, "\n" + CALL, "  \n" + CALL])
@pytest.mark.parametrize("new_role", ["tool", "user"])
def test_qwen_accepts_assistant_text_starting_with_whitespace(qwen, text, new_role):
    # The template adds an empty think block to the last assistant turn and drops it once the
    # turn is no longer last; the text after it is left as sampled (leading whitespace kept).
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": text}]
    new = [{"role": new_role, "content": "5"}]
    delta = encode_delta(qwen, history, new, TOOLS)
    before = render(qwen, history, TOOLS, add_generation_prompt=False)
    after = render(qwen, [*history, *new], TOOLS)
    assert decode(qwen, delta) == suffix_after_history(before, after)
    assert decode(qwen, delta).startswith("\n<|im_start|>user\n")


def test_qwen_accepts_a_think_block_followed_by_an_answer_starting_with_spaces(qwen):
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\n  Hello."},
    ]
    delta = encode_delta(qwen, history, [{"role": "user", "content": "Again"}])
    assert decode(qwen, delta) == "\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"


def test_qwen_accepts_a_literal_think_tag_in_an_earlier_message(qwen):
    history = [
        {"role": "user", "content": "What does <think> mean?"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA tag."},
    ]
    delta = encode_delta(qwen, history, [{"role": "user", "content": "Thanks"}])
    assert decode(qwen, delta) == "\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"


# ---- property A: appending deltas to sampled ids reproduces the full render ----------------
MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    '{"name": "calc", "arguments": {"a": 1}}',
    "<|im_start",
    "im_end|>",
    "<|",
    "|>",
    "<jupyter_code>",
    "user\n",
    "assistant\n",
    "\n",
    "\n\n",
    "  ",
    "\t",
    "é",
    "日本語",
    "🙂",
    "Ω≈ç",
]


def no_special(text: str) -> bool:
    return not any(token in text for token in SPECIAL)


texts = (
    st.lists(
        st.one_of(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=12), st.sampled_from(MARKUP)
        ),
        max_size=6,
    )
    .map(lambda parts: unicodedata.normalize("NFC", "".join(parts)))
    .filter(no_special)
)


def sampled_start(text: str) -> bool:
    # A sampled turn's first token never merges with the header's "\n"; whole-text
    # tokenization would merge "\n" with following whitespace, so that case cannot be compared
    # with a full re-tokenization (a single space before a non-space does not merge).
    return not text[:1].isspace() or re.match(r" \S", text) is not None


@st.composite
def conversations(draw, *, think: bool = False) -> tuple[list[dict], list[dict] | None, list]:
    """(first messages, tools, rounds); a round is (assistant message, new messages)."""
    first: list[dict[str, Any]] = []
    if draw(st.booleans()):
        first.append({"role": "system", "content": draw(texts)})
    first.append({"role": "user", "content": draw(texts)})
    tools = None
    if draw(st.booleans()):
        names = draw(
            st.lists(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), min_size=1, max_size=3)
        )
        tools = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": draw(texts),
                    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
                },
            }
            for name in names
        ]
    rounds = []
    # a user message wrapped in <tool_response> tags is not a new query for the template
    queries = texts.filter(
        lambda t: not (t.startswith("<tool_response>") and t.endswith("</tool_response>"))
    )
    answer_texts = texts.filter(lambda t: "think>" not in t)
    for i in range(draw(st.integers(1, 3))):
        if think:
            reasoning = f"reasoning-{i}-" + draw(answer_texts)
            content = f"<think>\n{reasoning}\n</think>\n\n" + draw(answer_texts)
            new = [{"role": "tool", "content": draw(texts)} for _ in range(draw(st.integers(0, 2)))]
            new.append({"role": "user", "content": draw(queries)})
        else:
            content = draw(answer_texts.filter(sampled_start))
            roles = draw(st.lists(st.sampled_from(["tool", "user"]), min_size=1, max_size=3))
            new = [{"role": role, "content": draw(texts)} for role in roles]
        rounds.append(({"role": "assistant", "content": content}, new))
    return first, tools, rounds


def check_no_history_rewrite(tokenizer, first, tools, rounds) -> None:
    all_messages = list(first)
    for assistant, new in rounds:
        all_messages += [assistant, *new]
    sampled = assistant_texts(render(tokenizer, all_messages, tools))
    assert len(sampled) == len(rounds)

    ids = full_ids(tokenizer, first, tools)
    history = list(first)
    for (assistant, new), text in zip(rounds, sampled, strict=True):
        ids += tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        history.append(assistant)
        # the suffix path (prompt + last turn rendered), checked against the full render
        ids += encode_delta(tokenizer, history, new, tools, head=len(first), check=True)
        history += new
    assert ids == full_ids(tokenizer, all_messages, tools)


@PROPERTY
@given(conversation=conversations())
def test_smollm_sampled_ids_plus_deltas_equal_the_full_tokenization(smollm, conversation):
    check_no_history_rewrite(smollm, *conversation)


@PROPERTY
@given(conversation=conversations())
def test_qwen_sampled_ids_plus_deltas_equal_the_full_tokenization_without_think(qwen, conversation):
    check_no_history_rewrite(qwen, *conversation)


# ---- property B: Qwen3 drops earlier reasoning, the trajectory keeps it ---------------------
@PROPERTY
@given(conversation=conversations(think=True))
def test_qwen_delta_after_a_think_turn_keeps_the_sampled_reasoning(qwen, conversation):
    first, tools, rounds = conversation
    ids = full_ids(qwen, first, tools)
    history = list(first)
    think_blocks = []
    for assistant, new in rounds:
        history.append(assistant)
        before = render(qwen, history, tools, add_generation_prompt=False)
        # sampled as the template rendered the turn while it was the last one
        text = assistant_texts(before)[-1]
        assert text.startswith("<think>\n")
        think_blocks.append(text[: text.index("</think>\n\n") + len("</think>\n\n")])
        ids += qwen.encode(text + "<|im_end|>", add_special_tokens=False)

        delta = encode_delta(qwen, history, new, tools, head=len(first), check=True)
        delta_text = decode(qwen, delta)
        assert delta_text.startswith("\n")
        assert delta_text.endswith(ASSISTANT)
        after = render(qwen, [*history, *new], tools)
        assert delta_text == suffix_after_history(before, after)
        ids += delta
        history += new

    full = render(qwen, history, tools)
    trajectory = decode(qwen, ids)
    for i, block in enumerate(think_blocks):
        assert f"reasoning-{i}-" in trajectory
        assert f"reasoning-{i}-" not in full
        trajectory = trajectory.replace(block, "", 1)
    # the trajectory is the full render plus exactly the sampled think blocks
    assert trajectory == full


# ---- template errors -------------------------------------------------------------------------
class FakeTokenizer:
    """A chat template as a Python function; ids are code points."""

    def __init__(self, template, eos_token: str | None = "</s>") -> None:
        self.template = template
        self.eos_token = eos_token

    def apply_chat_template(
        self, messages, tools=None, add_generation_prompt=False, tokenize=False, **kwargs
    ):
        assert tokenize is False
        return self.template(messages, add_generation_prompt)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def plain_template(messages, add_generation_prompt) -> str:
    text = "".join(f"{m['role']}: {m['content']}</s>\n" for m in messages)
    return text + ("assistant: " if add_generation_prompt else "")


HISTORY = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
TOOL = [{"role": "tool", "content": "5"}]


def test_fake_template_delta_is_the_suffix_after_the_last_end_of_turn():
    delta = encode_delta(FakeTokenizer(plain_template), HISTORY, TOOL)
    assert "".join(map(chr, delta)) == "\ntool: 5</s>\nassistant: "


def test_a_tokenizer_without_eos_token_needs_eot_token():
    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(FakeTokenizer(plain_template, eos_token=None), HISTORY, TOOL)
    assert str(info.value) == "the tokenizer has no eos token: pass eot_token= explicitly"
    delta = encode_delta(
        FakeTokenizer(plain_template, eos_token=None), HISTORY, TOOL, eot_token="</s>"
    )
    assert "".join(map(chr, delta)) == "\ntool: 5</s>\nassistant: "


def test_a_template_that_never_renders_the_eos_token_is_rejected():
    def no_eos(messages, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages)

    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(FakeTokenizer(no_eos), HISTORY, TOOL)
    assert str(info.value) == (
        "the rendered conversation has no end-of-turn token '</s>'; set "
        "multi_turn.format to the model's family (or pass eot_token=)"
    )


def test_a_real_template_with_the_wrong_eot_token_is_rejected(qwen):
    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(qwen, HISTORY, TOOL, eot_token="<|endoftext|>")
    assert str(info.value) == (
        "the rendered conversation has no end-of-turn token '<|endoftext|>'; set "
        "multi_turn.format to the model's family (or pass eot_token=)"
    )


def test_a_template_with_text_after_the_last_end_of_turn_is_rejected():
    def trailer(messages, add_generation_prompt):
        return plain_template(messages, add_generation_prompt) + "END"

    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(FakeTokenizer(trailer), HISTORY, TOOL)
    assert str(info.value) == (
        "the chat template puts '\\nEND' after the last end-of-turn token '</s>'; only "
        "whitespace separators can follow a turn the model closed"
    )


def test_a_template_that_rewrites_history_is_rejected():
    def counting(messages, add_generation_prompt):
        return f"[{len(messages)} messages]</s>\n" + plain_template(messages, add_generation_prompt)

    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(FakeTokenizer(counting), HISTORY, TOOL)
    message = str(info.value)
    assert message.startswith("the chat template rewrites history")
    assert message == (
        "the chat template rewrites history when new messages are added (first difference at "
        "char 1: '2 messages]</s>\\nuser: hi</s>\\nassistant: ' vs "
        "'3 messages]</s>\\nuser: hi</s>\\nassistant: '); a delta cannot be appended to the "
        "sampled tokens"
    )


def test_a_template_that_drops_closed_turns_is_rejected():
    def last_only(messages, add_generation_prompt):
        return plain_template(messages[-1:], add_generation_prompt)

    with pytest.raises(TemplateDeltaError, match="^the chat template rewrites history"):
        encode_delta(FakeTokenizer(last_only), HISTORY, TOOL)


# ---- the suffix-only path (head=) --------------------------------------------------------------
LONG = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "a"},
    {"role": "tool", "content": "1"},
    {"role": "assistant", "content": "b"},
]


def test_the_suffix_path_renders_only_the_prompt_the_last_turn_and_the_new_messages():
    seen: list[list[str]] = []

    def recording(messages, add_generation_prompt):
        seen.append([m["content"] for m in messages])
        return plain_template(messages, add_generation_prompt)

    delta = encode_delta(FakeTokenizer(recording), LONG, TOOL, head=1)
    assert "".join(map(chr, delta)) == "\ntool: 5</s>\nassistant: "
    assert seen == [["hi", "b"], ["hi", "b", "5"]]


def test_the_full_check_catches_a_template_whose_new_messages_depend_on_history():
    def numbered(messages, add_generation_prompt):
        text = "".join(f"{i} {m['role']}: {m['content']}</s>\n" for i, m in enumerate(messages))
        return text + ("assistant: " if add_generation_prompt else "")

    fast = encode_delta(FakeTokenizer(numbered), LONG, TOOL, head=1)
    assert "".join(map(chr, fast)) == "\n2 tool: 5</s>\nassistant: "  # wrong: the turn is 4
    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(FakeTokenizer(numbered), LONG, TOOL, head=1, check=True)
    assert str(info.value) == (
        "the chat template renders the new messages differently when only the prompt and the "
        "last message precede them (first difference at char 1: '4 tool: 5</s>\\nassistant: ' "
        "vs '2 tool: 5</s>\\nassistant: '); set multi_turn.delta_check=full for this template"
    )


def test_an_end_token_that_opens_the_next_message_must_be_the_one_sampled():
    def headed(messages, add_generation_prompt):
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    ends = ["<|tool|>", "<|user|>"]
    delta = encode_delta(
        FakeTokenizer(headed), LONG, TOOL, eot_token=ends, opens_next=True, sampled_end="<|tool|>"
    )
    assert "".join(map(chr, delta)) == "5<|assistant|>"
    with pytest.raises(TemplateDeltaError) as info:
        encode_delta(
            FakeTokenizer(headed),
            LONG,
            TOOL,
            eot_token=ends,
            opens_next=True,
            sampled_end="<|user|>",
        )
    assert str(info.value) == (
        "the model ended its turn with '<|user|>' but the chat template opens the new messages "
        "with '<|tool|>'"
    )


# ---- Trajectory ------------------------------------------------------------------------------
def test_mask_is_one_exactly_on_sampled_tokens_and_log_probs_align():
    traj = Trajectory([1, 2, 3], budget=20)
    traj.add_sampled([10, 11], [-0.5, -0.25])
    assert traj.add_template([20, 21, 22]) is True
    traj.add_sampled([12], None)
    traj.add_sampled([13, 14], [-1.0, -2.0])
    assert traj.response_ids == [10, 11, 20, 21, 22, 12, 13, 14]
    assert traj.response_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert traj.response_log_probs == [-0.5, -0.25, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0]
    assert traj.context_ids() == [1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14]
    assert len(traj) == 8
    assert traj.room == 12


def test_add_template_appends_nothing_when_no_sampled_token_would_fit():
    traj = Trajectory([1], budget=5)
    traj.add_sampled([10], [-0.1])
    assert traj.add_template([20, 21, 22, 23]) is False  # would fill the budget exactly
    assert traj.add_template([20, 21, 22, 23, 24]) is False
    assert (traj.response_ids, traj.response_mask, traj.response_log_probs) == (
        [10],
        [1],
        [-0.1],
    )
    assert traj.add_template([20, 21, 22]) is True  # leaves one token to sample
    assert traj.room == 1


def test_add_sampled_beyond_the_budget_raises_and_appends_nothing():
    traj = Trajectory([], budget=3)
    traj.add_sampled([10, 11], None)
    with pytest.raises(ValueError, match="^2 sampled tokens exceed the 1 left in the budget$"):
        traj.add_sampled([12, 13], [-0.1, -0.2])
    assert traj.response_ids == [10, 11]
    traj.add_sampled([12], [-0.3])  # filling the budget exactly is allowed
    assert traj.room == 0


def test_log_probs_must_match_the_sampled_tokens():
    traj = Trajectory([], budget=10)
    with pytest.raises(ValueError, match="^1 log-probs for 2 sampled tokens$"):
        traj.add_sampled([10, 11], [-0.1])
    assert len(traj) == 0


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="^response budget must be >= 1, got 0$"):
        Trajectory([1], budget=0)


def test_response_views_are_copies():
    traj = Trajectory([1], budget=4)
    traj.add_sampled([10], [-0.1])
    traj.response_ids.append(99)
    traj.response_mask.append(0)
    traj.response_log_probs.append(1.0)
    traj.context_ids().append(99)
    assert (traj.response_ids, traj.response_mask, traj.response_log_probs) == ([10], [1], [-0.1])
    assert traj.context_ids() == [1, 10]


@settings(deadline=None, max_examples=200, derandomize=True)
@given(
    budget=st.integers(1, 30),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=20),
)
def test_trajectory_never_exceeds_its_budget(budget, steps):
    traj = Trajectory([7, 7], budget=budget)
    expected_mask: list[int] = []
    for sampled, n in steps:
        ids = list(range(n))
        if sampled:
            if n > traj.room:
                with pytest.raises(ValueError):
                    traj.add_sampled(ids, [-1.0] * n)
            else:
                traj.add_sampled(ids, [-1.0] * n)
                expected_mask += [1] * n
        elif traj.add_template(ids):
            expected_mask += [0] * n
            assert traj.room >= 1  # a delta always leaves room for one sampled token
        assert len(traj) <= budget
        assert traj.room == budget - len(traj)
    assert traj.response_mask == expected_mask
    assert traj.response_log_probs == [-1.0 if m else 0.0 for m in expected_mask]

"""The langgraph_agent recipe's pieces: expressions and their values, the reward, and a
scripted ReAct episode that solves a two-operator expression with the real custom_op tool."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, get_agent_loop
from agentloop.base import load_agent_loop_config
from recipes.langgraph_agent.data import main as data_main
from recipes.langgraph_agent.data import make_expression, make_rows, make_sft_rows
from recipes.langgraph_agent.reward import compute_score, final_answer
from recipes.langgraph_agent.tools import apply_op
from tests.unit.agentloop.scripted import ScriptedServer


def evaluate(expression: str) -> int:
    """Independent evaluator: rewrite ``x @ y`` into a call and let Python parse it."""
    import ast

    tree = ast.parse(expression.replace("@", "*"), mode="eval")

    def walk(node):
        if isinstance(node, ast.Constant):
            return node.value
        return apply_op(walk(node.left), walk(node.right))

    return walk(tree.body)


def test_expressions_have_the_value_of_the_operator_applied_innermost_first():
    rng = random.Random(3)
    for ops in (1, 2, 3):
        for _ in range(50):
            text, value, steps = make_expression(rng, ops)
            assert text.count("@") == ops and len(steps) == ops
            assert evaluate(text) == value
            assert all(apply_op(a, b) == r for a, b, r in steps) and steps[-1][2] == value
            # each step after the first uses the previous result
            assert all(prev[2] in cur[:2] for prev, cur in zip(steps, steps[1:], strict=False))


def test_rows_are_seeded_verl_rows_for_the_math_expression_loop(tmp_path):
    rows = make_rows(20, seed=5, split="train")
    assert rows == make_rows(20, seed=5, split="train")
    for row in rows:
        assert row["agent_name"] == "math_expression"
        assert row["prompt"][0]["role"] == "system" and "custom_op" in row["prompt"][0]["content"]
        expression = row["extra_info"]["expression"]
        assert row["prompt"][1]["content"] == f"Compute {expression}."
        assert row["reward_model"]["ground_truth"] == str(evaluate(expression))
    data_main(["--out", str(tmp_path), "--train", "3", "--val", "2"])
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["data_source"] == "langgraph_math"
    with pytest.raises(SystemExit):
        data_main(["--out", str(tmp_path), "--max-ops", "0"])


def test_reward_scores_the_last_answer_after_the_tools_and_shapes_tool_use():
    ok = {"name": "custom_op", "ok": True}
    info = {"ops": 2, "calls": [ok, ok]}
    assert compute_score("langgraph_math", "so <answer>39</answer>", "39", info)["score"] == 1.0
    wrong = compute_score("langgraph_math", "<answer>40</answer>", "39", info)
    assert wrong == {"score": pytest.approx(0.3), "correct": 0.0, "tool_use": 1.0}
    extra_calls = {"ops": 1, "calls": [ok, ok, ok]}
    assert compute_score("x", "no answer", "4", extra_calls)["score"] == pytest.approx(0.2)
    assert compute_score("x", "", "4", {"ops": 1, "calls": []})["score"] == 0.0
    # an answer inside a tool response does not count
    assert final_answer("<tool_response>\n<answer>4</answer>\n</tool_response>") is None


def test_sft_conversations_train_the_calls_the_rollout_parses(tiny_qwen3_path):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from agentloop.formats import get_format
    from agentloop.tokens import mask_spans
    from recipes.langgraph_agent.tools import custom_op
    from trainer.sft.data import encode_conversation

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    parser = get_format("hermes").new_parser()
    for row in make_sft_rows(10, seed=1):
        assert row["tools"] == [convert_to_openai_tool(custom_op)]  # what the loop binds
        sample = encode_conversation(tokenizer, row["messages"], row["tools"])
        turns = [
            tokenizer.decode(span, skip_special_tokens=False).removesuffix("<|im_end|>")
            for span in mask_spans(sample.response_ids, sample.response_mask, 1)
        ]
        calls = [m for m in row["messages"] if m.get("tool_calls")]
        assert len(turns) == len(calls) + 1
        for turn, message in zip(turns, calls, strict=False):
            (parsed,) = parser.parse(turn).calls
            assert parsed.name == "custom_op"
            assert parsed.arguments == message["tool_calls"][0]["function"]["arguments"]
        answer = row["messages"][-1]["content"]
        assert turns[-1].endswith(answer) and final_answer(answer) is not None


async def test_a_scripted_episode_solves_an_expression_with_the_real_tool(tiny_qwen3_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    (name,) = load_agent_loop_config("recipes/langgraph_agent/agent.yaml")
    spec = get_agent_loop(name)

    def call(a, b):
        body = json.dumps({"name": "custom_op", "arguments": {"a": a, "b": b}})
        return f"<tool_call>\n{body}\n</tool_call>"

    turns = [call(7, 1), call(19, 9), "<answer>39</answer>"]
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=512, response_length=256, multi_turn=MultiTurnConfig(max_assistant_turns=4)
    )
    loop = spec.cls(AgentLoopContext(server, tokenizer, config, {}), **spec.kwargs)
    row = make_rows(1, seed=0, split="train")[0]
    assert row["extra_info"]["expression"] == "(7 @ 1) @ 9"
    out = await loop.run({"temperature": 1.0}, raw_prompt=row["prompt"])
    assert [c.arguments for c in out.record.calls] == [{"a": 7, "b": 1}, {"a": 19, "b": 9}]
    text = tokenizer.decode(out.response_ids, skip_special_tokens=False)
    assert "<tool_response>\n19\n</tool_response>" in text
    assert "<tool_response>\n39\n</tool_response>" in text
    info = {**row["extra_info"], "calls": [dataclasses.asdict(c) for c in out.record.calls]}
    assert compute_score("langgraph_math", text, "39", info)["score"] == 1.0

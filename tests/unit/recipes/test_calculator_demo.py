"""The demo's pieces: the calculator task generator, its SFT conversations (tokenized exactly
as RL trajectories, calls the rollout parser reads back), the reward, the evaluation summary
and the reward-curve PNG."""

from __future__ import annotations

import json
import random

from transformers import AutoTokenizer

from agentloop.formats import get_format
from agentloop.parsers import check_calls
from agentloop.tokens import mask_spans
from agentloop.tools.calculator import CALCULATOR_SCHEMA, evaluate, format_value
from recipes.calculator.data import make_problem, make_rows, make_sft_rows, write_task
from recipes.calculator.demo import (
    evaluate_records,
    grpo_mode,
    lora_overrides,
    reward_curve,
    trained_model,
)
from recipes.calculator.reward import compute_score, final_answer
from trainer.sft.data import encode_conversation


def test_problems_are_multi_digit_and_rows_carry_the_exact_answer():
    rng = random.Random(0)
    for _ in range(100):
        question, expression = make_problem(rng)
        assert expression in question and "*" in expression
        assert abs(int(format_value(evaluate(expression)))) >= 1000
    rows = make_rows(10, seed=3, split="val")
    assert rows == make_rows(10, seed=3, split="val")
    for i, row in enumerate(rows):
        truth = format_value(evaluate(row["extra_info"]["expression"]))
        assert row["reward_model"]["ground_truth"] == truth
        assert row["extra_info"]["index"] == i and row["agent_name"] == "tool_agent"
        kwargs = row["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]
        assert kwargs == {"ground_truth": truth}


def test_sft_conversations_teach_a_call_the_rollout_parses_and_the_answer_line(
    smollm2_path,
):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    parser = get_format("hermes").new_parser()
    for row in make_sft_rows(8, seed=1):
        sample = encode_conversation(tokenizer, row["messages"], row["tools"])
        turns = [
            tokenizer.decode(s, skip_special_tokens=False)
            for s in mask_spans(sample.response_ids, sample.response_mask, 1)
        ]
        assert len(turns) == 2
        parsed = check_calls(parser.parse(turns[0]), {"calculator": CALCULATOR_SCHEMA})
        (call,) = parsed.calls
        expression = row["messages"][2]["tool_calls"][0]["function"]["arguments"]["expression"]
        assert call.arguments == {"expression": expression}
        truth = format_value(evaluate(expression))
        assert row["messages"][3] == {"role": "tool", "content": truth}
        assert compute_score("calculator", turns[1], truth, {}) == 1.0


def test_reward_reads_only_the_answer_line_after_the_last_tool_response():
    assert compute_score("calculator", "#### 57,840", "57840", {}) == 1.0
    assert compute_score("calculator", "the answer is 57840", "57840", {}) == 0.0
    assert compute_score("calculator", "#### 5784", "57840", {}) == 0.0
    text = "<tool_response>\n#### 57840\n</tool_response>\nI think\n#### 1"
    assert final_answer(text) == "1"


def test_evaluation_summary_and_reward_curve(tmp_path):
    rows = make_rows(3, seed=0, split="val")
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    records = [
        {"index": 0, "response_text": f"#### {truths[0]}", "tool_calls": 1, "tool_errors": 0},
        {"index": 1, "response_text": "#### 0", "tool_calls": 1, "tool_errors": 1},
        {"index": 2, "response_text": f"#### {truths[2]}", "tool_calls": 0, "tool_errors": 0},
    ]
    summary = evaluate_records(records, rows)
    assert summary == {"accuracy": 2 / 3, "valid_tool_calls": 1 / 3, "samples": 3}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": s, "reward/mean": s / 10, "agent_loop/tool_calls/mean": 1.0}) + "\n"
            for s in (1, 2, 3)
        )
    )
    png = tmp_path / "curve.png"
    reward_curve(metrics, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_task_writes_the_three_files(tmp_path):
    write_task(tmp_path, train=4, val=2, sft=3)
    files = ("train.jsonl", "val.jsonl", "sft.jsonl")
    assert [len((tmp_path / f).read_text().splitlines()) for f in files] == [4, 2, 3]


def test_grpo_mode_names_the_mode_and_turns_async_training_on_only_when_asked():
    assert grpo_mode(False) == ("sync", [])
    name, overrides = grpo_mode(True)
    assert name == "async (staleness 1, partial rollout)"
    assert "async_training.enable=True" in overrides
    from trainer.config import load_config  # the overrides are real config keys

    config, _ = load_config(["actor_rollout_ref.model.path=tiny-qwen3", *overrides])
    assert config.async_training.enable and config.async_training.staleness_threshold == 1


def test_demo_lora_trains_an_adapter_and_serves_the_sft_model_with_it(tmp_path):
    from trainer.config import load_config  # the overrides are real config keys

    config, _ = load_config(["actor_rollout_ref.model.path=tiny-qwen3", *lora_overrides()])
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (16, 32, "all-linear")
    assert config.actor_rollout_ref.rollout.lora_sync == "adapter"
    config, _ = load_config(["actor_rollout_ref.model.path=m", *lora_overrides(sync="merged")])
    assert config.actor_rollout_ref.rollout.lora_sync == "merged"
    assert trained_model(tmp_path, 5, "sft", lora=False) == (
        str(tmp_path / "global_step_5/actor/huggingface"),
        (),
    )
    export = tmp_path / "global_step_5/actor/huggingface"
    export.mkdir(parents=True)
    (export / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32}))
    base, serve = trained_model(tmp_path, 5, "sft", lora=True)
    assert base == "sft"  # the SFT model, with the exported adapter on top
    config, _ = load_config(["actor_rollout_ref.model.path=sft", *serve])
    model = config.actor_rollout_ref.model
    assert model.lora_rank == 16
    assert model.lora_adapter_path == str(export)


async def test_demo_gateway_rows_name_the_openai_agent_and_its_loop_registers(tmp_path, tokenizer):
    from agentloop import AgentLoopContext, RolloutConfig, get_agent_loop, load_agent_loop_config
    from recipes.calculator.data import write_task
    from recipes.calculator.demo import gateway_rows
    from tests.unit.agentloop.scripted import ScriptedServer
    from trainer.config import load_config

    write_task(tmp_path, train=4, val=2, sft=2)
    name, overrides = gateway_rows(tmp_path, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
    assert len(rows) == 4 and {r["agent_name"] for r in rows} == {"calc_gateway"}
    config, _ = load_config(["actor_rollout_ref.model.path=m", *overrides])
    path = config.actor_rollout_ref.rollout.agent.agent_loop_config_path
    assert load_agent_loop_config(path) == ["calc_gateway"]
    spec = get_agent_loop("calc_gateway")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    server = ScriptedServer(tokenizer, [call, "#### 42"], end_token="<|im_end|>")
    context = AgentLoopContext(server, tokenizer, RolloutConfig(prompt_length=1024))
    loop = spec.cls(context, **spec.kwargs)
    row = {**rows[0], "raw_prompt": rows[0]["prompt"]}
    out = await loop.run({}, **row)
    assert out.reward_score is None  # scored by the run's reward function, as tool_agent is
    text = tokenizer.decode(out.response_ids)
    assert "<tool_response>\n42\n</tool_response>" in text and text.endswith("#### 42<|im_end|>")

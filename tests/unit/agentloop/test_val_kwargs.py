"""``rollout.val_kwargs`` (verl's keys and defaults): greedy validation by default, checked
values with errors naming the key, and validation batches of an AgentLoopWorker sampled with
them while training batches keep the rollout's sampling."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentloop import AgentLoopWorker, RolloutConfig, TraceContext, from_dict
from agentloop.config import ValKwargsConfig
from tests.unit.agentloop.scripted import ScriptedServer

USER = [{"role": "user", "content": "hi"}]


def test_defaults_are_verls_greedy_validation():
    val = RolloutConfig().val_kwargs
    assert val == ValKwargsConfig(top_k=-1, top_p=1.0, temperature=0.0, n=1, do_sample=False)
    assert val.sampling_params() == {"temperature": 0.0, "top_p": 1.0, "top_k": -1}


def test_validation_sampling_params_replace_the_rollouts_and_keep_the_turn_cap():
    config = from_dict(
        RolloutConfig,
        {
            "temperature": 0.9,
            "top_p": 0.95,
            "multi_turn": {"max_tokens_per_turn": 16},
            "val_kwargs": {"do_sample": True, "temperature": 0.6, "top_p": 0.7, "top_k": 20},
        },
    )
    assert config.sampling_params() == {
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": -1,
        "max_tokens": 16,
    }
    assert config.sampling_params(validate=True) == {
        "temperature": 0.6,
        "top_p": 0.7,
        "top_k": 20,
        "max_tokens": 16,
    }


def test_val_kwargs_from_verl_yaml_values():
    # verl's yaml writes the greedy temperature as the integer 0
    config = from_dict(RolloutConfig, {"val_kwargs": {"temperature": 0, "n": 1}})
    assert config.val_kwargs.temperature == 0.0 and isinstance(config.val_kwargs.temperature, float)
    sampled = from_dict(
        RolloutConfig, {"val_kwargs": {"do_sample": True, "temperature": 1, "n": 8}}
    )
    assert sampled.val_kwargs.n == 8


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"n": 0}, "rollout.val_kwargs.n must be >= 1, got 0"),
        (
            {"do_sample": True, "temperature": -0.5},
            "rollout.val_kwargs.temperature must be >= 0, got -0.5",
        ),
        ({"top_p": 0.0}, "rollout.val_kwargs.top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "rollout.val_kwargs.top_p must be in (0, 1], got 1.5"),
        ({"top_k": 0}, "rollout.val_kwargs.top_k must be -1 (no limit) or >= 1, got 0"),
    ],
)
def test_bad_val_kwargs_are_named(values, message):
    with pytest.raises(ValueError) as info:
        ValKwargsConfig(**values)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("values", "params", "warning"),
    [
        (
            {"do_sample": True},
            {"temperature": 0.0, "top_p": 1.0, "top_k": -1},
            "rollout.val_kwargs.do_sample=true has no effect: validation follows "
            "rollout.val_kwargs.temperature=0 (greedy), as verl's agent loops do",
        ),
        (
            {"temperature": 1.0, "top_p": 0.6, "n": 30},  # verl's retool script
            {"temperature": 1.0, "top_p": 0.6, "top_k": -1},
            "rollout.val_kwargs.do_sample=false has no effect: validation follows "
            "rollout.val_kwargs.temperature=1 (sampled), as verl's agent loops do",
        ),
        (
            {"n": 4},
            {"temperature": 0.0, "top_p": 1.0, "top_k": -1},
            "rollout.val_kwargs.n=4 at temperature 0 validates 4 identical greedy responses per "
            "prompt: set rollout.val_kwargs.temperature > 0 to sample them, or n=1",
        ),
    ],
)
def test_val_kwargs_follow_the_temperature_as_verls_agent_loops_and_warn(values, params, warning):
    config = ValKwargsConfig(**values)
    assert config.sampling_params() == params
    assert config.warnings() == [warning]


def test_the_trainer_logs_val_kwargs_warnings_once_at_start_up(caplog):
    from trainer.config import load_config

    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "data.val_files=/v.jsonl",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
        ]
    )
    with caplog.at_level("WARNING", logger="trainer.config.schema"):
        config.check()
    assert [r.getMessage() for r in caplog.records] == [
        "rollout.val_kwargs.do_sample=false has no effect: validation follows "
        "rollout.val_kwargs.temperature=0.7 (sampled), as verl's agent loops do"
    ]


def test_unknown_val_kwargs_key_is_named():
    with pytest.raises(ValueError) as info:
        from_dict(RolloutConfig, {"val_kwargs": {"temprature": 0}}, path="rollout")
    assert str(info.value) == (
        "unknown config key rollout.val_kwargs.temprature; known keys under "
        "rollout.val_kwargs: top_k, top_p, temperature, n, do_sample"
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
async def test_worker_samples_validation_batches_with_val_kwargs_only(tokenizer, do_sample):
    val = {"do_sample": True, "temperature": 0.6, "top_p": 0.8, "top_k": 5} if do_sample else {}
    config = from_dict(
        RolloutConfig, {"response_length": 32, "temperature": 0.9, "top_p": 0.95, "val_kwargs": val}
    )
    server = ScriptedServer(tokenizer, ["a"] * 6)
    worker = AgentLoopWorker(config, server, tokenizer)
    rows = [{"raw_prompt": USER, "uid": str(i)} for i in range(2)]

    await worker.generate_sequences(rows, trace=TraceContext(step=1))
    await worker.generate_sequences(rows, trace=TraceContext(step=1, validate=True))
    await worker.generate_sequences(rows)  # no trace context: a training batch

    sampled = [{k: r[k] for k in ("temperature", "top_p", "top_k")} for r in server.requests]
    train = {"temperature": 0.9, "top_p": 0.95, "top_k": -1}
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}
    validation = {"temperature": 0.6, "top_p": 0.8, "top_k": 5} if do_sample else greedy
    assert sampled == [train, train, validation, validation, train, train]

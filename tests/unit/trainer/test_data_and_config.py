"""Dataset rows (parquet/jsonl, verl layout, length filtering) and the Hydra config."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.config import ConfigError, DataConfig, load_config
from trainer.data.rows import load_rows, read_rows, to_agent_rows

MSG = [{"role": "user", "content": "What is 2+2?"}]


def test_parquet_and_jsonl_rows_read_the_same(tmp_path):
    rows = [
        {
            "prompt": MSG,
            "data_source": "a",
            "extra_info": {"index": 5, "tools_kwargs": {"calc": {"create_kwargs": {"k": 1}}}},
        },
        {
            "prompt": MSG,
            "data_source": "b",
            "extra_info": {"index": 6, "tools_kwargs": {"calc": {"create_kwargs": {"k": 2}}}},
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_rows([str(tmp_path / "d.parquet")]) == rows
    assert read_rows([str(tmp_path / "d.jsonl")]) == rows


def test_agent_rows_carry_raw_prompt_and_index():
    out = to_agent_rows(
        [{"prompt": MSG, "extra_info": {"index": 9}}, {"prompt": "plain text"}], DataConfig()
    )
    assert out[0]["raw_prompt"] == MSG and out[0]["index"] == 9
    assert out[1]["raw_prompt"] == [{"role": "user", "content": "plain text"}]
    assert out[1]["index"] == 1


def test_overlong_prompts_are_dropped_counted_and_tool_schemas_count(tmp_path, tokenizer, caplog):
    long = [{"role": "user", "content": "word " * 300}]
    rows = [{"prompt": MSG}, {"prompt": long}, {"prompt": MSG}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        kept = load_rows([str(tmp_path / "d.jsonl")], DataConfig(max_prompt_length=64), tokenizer)
    assert len(kept) == 2
    assert "dropped 1 of 3 rows with prompts over data.max_prompt_length=64 tokens" in caplog.text
    schema = {"type": "function", "function": {"name": "t", "description": "x " * 100}}
    with pytest.raises(ValueError) as info:
        load_rows(
            [str(tmp_path / "d.jsonl")], DataConfig(max_prompt_length=64), tokenizer, tools=[schema]
        )
    assert str(info.value) == (
        f"no rows left in {tmp_path}/d.jsonl (3 read) after filtering prompts over "
        "data.max_prompt_length=64: raise it"
    )


def test_bad_data_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="no data files: set data.train_files"):
        read_rows([])
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"expected a \.parquet or \.jsonl file"):
        read_rows([str(tmp_path / "d.csv")])
    (tmp_path / "bad.jsonl").write_text('{"prompt": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON object"):
        read_rows([str(tmp_path / "bad.jsonl")])


def test_hydra_config_takes_verl_overrides_and_extras():
    cfg, extras = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "data.max_prompt_length=300",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
            "actor_rollout_ref.rollout.multi_turn.repair_tool_calls=false",
            "+output=o.jsonl",
        ]
    )
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.prompt_length == 300  # interpolated from data.max_prompt_length
    assert rollout.multi_turn.max_assistant_turns == 4
    assert rollout.multi_turn.repair_tool_calls is False
    assert extras == {"output": "o.jsonl"}


def test_hydra_config_missing_model_path_says_what_to_set():
    with pytest.raises(ConfigError) as info:
        load_config([])
    assert str(info.value) == (
        "missing config key actor_rollout_ref.model.path: set it, e.g. "
        "actor_rollout_ref.model.path=..."
    )


@pytest.mark.parametrize("cls", ["TrainerConfig", "SFTTrainerConfig"])
def test_rl_and_sft_resolve_the_device_alike(monkeypatch, cls):
    """One ``RunConfig.resolve_device`` for both commands: auto picks what is there, cuda
    without a GPU and more GPUs per node than the node has are errors that say what to set."""
    import torch

    from trainer.config import run, sft

    make = getattr(run, cls, None) or getattr(sft, cls)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert make(device="auto").resolve_device() == "cpu"
    with pytest.raises(ValueError) as err:
        make(device="cuda").resolve_device()
    assert str(err.value) == (
        "trainer.device=cuda but no CUDA device is visible: set trainer.device=cpu"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert make(device="auto", n_gpus_per_node=2).resolve_device() == "cuda"
    assert make(device="cuda", nnodes=2, n_gpus_per_node=4).resolve_device() == "cuda"
    with pytest.raises(ValueError) as err:
        make(device="cuda", n_gpus_per_node=4).resolve_device()
    assert str(err.value) == "trainer.n_gpus_per_node=4 but this node has 2 GPU(s): lower it"

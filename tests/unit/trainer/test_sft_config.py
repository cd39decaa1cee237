"""``agentloop-sft`` config and start-up checks: typed keys, and every bad setting fails before
any worker starts with a message that says what to set."""

from __future__ import annotations

import json

import pytest

from trainer.cli.sft import main
from trainer.config import ConfigError
from trainer.config.sft import load_sft_config

BASE = ["model.path=tiny-qwen3", "data.train_files=d.jsonl"]
CONVERSATION = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5."},
]


def test_verl_sft_keys_become_typed_config():
    cfg = load_sft_config(
        [
            *BASE,
            "data.max_length=512",
            "+data.chat_template_kwargs.enable_thinking=false",
            "optim.lr=1e-3",
            "model.fsdp_config.mixed_precision=fp32",
            "trainer.n_gpus_per_node=2",
            "trainer.logger=[console,jsonl]",
            "trainer.experiment_name=warm",
        ]
    )
    assert cfg.data.max_length == 512 and cfg.data.messages_key == "messages"
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.optim.lr == 1e-3 and cfg.optim.clip_grad == 1.0
    assert cfg.model.fsdp_config.mixed_precision == "fp32"
    assert cfg.trainer.world_size == 2 and cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.trainer.default_local_dir == "checkpoints/agentloop-sft/warm"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "missing config key model.path: set it, e.g. model.path=..."),
        (
            ["model.path=x"],
            "no training data: set data.train_files=<parquet or jsonl file(s)>",
        ),
        (
            [*BASE, "data.batch=3"],
            "unknown config key data.batch: check its spelling against "
            "trainer/config/sft_trainer.yaml",
        ),
        (
            [*BASE, "data.train_batch_size=5", "trainer.n_gpus_per_node=2"],
            "data.train_batch_size=5 must be divisible by the 2 rank(s) "
            "(trainer.nnodes x trainer.n_gpus_per_node)",
        ),
        (
            [*BASE, "data.train_batch_size=6", "data.micro_batch_size_per_gpu=2"]
            + ["trainer.n_gpus_per_node=2"],
            "data.train_batch_size=6 must be divisible by ranks x data.micro_batch_size_per_gpu "
            "= 2 x 2 = 4 (or set data.use_dynamic_bsz=true)",
        ),
        (
            [*BASE, "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=100"],
            "data.max_token_len_per_gpu=100 is below data.max_length=2048: a kept conversation "
            "could not fit in a micro-batch; raise data.max_token_len_per_gpu",
        ),
        ([*BASE, "optim.lr=0"], "optim.lr must be > 0, got 0.0"),
        (
            [*BASE, "trainer.resume_mode=resume_path"],
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N dir>",
        ),
    ],
)
def test_bad_config_says_what_to_set(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_sft_config(overrides)
    assert str(info.value) == message


def test_dynamic_batching_lifts_the_micro_batch_divisibility_rule():
    cfg = load_sft_config(
        [*BASE, "data.train_batch_size=6", "data.use_dynamic_bsz=true", "trainer.n_gpus_per_node=2"]
    )
    assert cfg.data.use_dynamic_bsz


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"messages": CONVERSATION}) + "\n" for _ in range(4)))
    return path


def run_main(capsys, *overrides: str) -> tuple[int, str]:
    code = main(list(overrides))
    return code, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.slow
def test_cli_start_up_errors_name_the_setting(tmp_path, data_file, capsys):
    ckpt = f"trainer.default_local_dir={tmp_path / 'ckpt'}"
    code, err = run_main(capsys, f"model.path={tmp_path}/nope", f"data.train_files={data_file}")
    assert code == 2
    assert err.startswith(
        f"agentloop-sft: error: model.path '{tmp_path}/nope' is neither a model folder nor a "
        "known asset name ("
    )
    code, err = run_main(capsys, "model.path=tiny-qwen3", f"data.train_files={tmp_path}/x.jsonl")
    assert (code, err) == (
        2,
        f"agentloop-sft: error: data.train_files: data file '{tmp_path}/x.jsonl' does not exist",
    )
    code, err = run_main(
        capsys, "model.path=tiny-qwen3", f"data.train_files={data_file}", ckpt,
        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=1",
    )  # fmt: skip
    assert (code, err) == (
        2,
        "agentloop-sft: error: data.train_batch_size=8 is more than the 4 training "
        "conversations: lower it",
    )
    code, err = run_main(
        capsys, "model.path=tiny-qwen3", f"data.train_files={data_file}", ckpt,
        "data.train_batch_size=2", "data.micro_batch_size_per_gpu=1",
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}",
    )  # fmt: skip
    assert (code, err) == (
        2,
        f"agentloop-sft: error: {tmp_path} is not a checkpoint folder (no trainer_state.json): "
        "point trainer.resume_from_path at a global_step_N folder",
    )


def test_cli_bad_row_names_the_file_and_row(tmp_path, data_file, capsys):
    with data_file.open("a") as f:
        f.write(json.dumps({"messages": CONVERSATION[:1]}) + "\n")
    code, err = run_main(capsys, "model.path=tiny-qwen3", f"data.train_files={data_file}")
    assert (code, err) == (
        2,
        f"agentloop-sft: error: {data_file}: row 4 has no assistant message: there is nothing "
        "to train on",
    )


def test_help_prints_the_usage(capsys):
    assert main(["--help"]) == 0
    assert "agentloop-sft data.train_files=" in capsys.readouterr().out


def test_cli_refuses_to_resume_from_a_checkpoint_without_a_data_position(
    tmp_path, data_file, capsys
):
    step_dir = tmp_path / "ckpt" / "global_step_3"
    step_dir.mkdir(parents=True)
    (step_dir / "trainer_state.json").write_text('{"step": 3}')  # e.g. an RL run's folder
    code, err = run_main(
        capsys, "model.path=tiny-qwen3", f"data.train_files={data_file}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "data.train_batch_size=2", "data.micro_batch_size_per_gpu=1",
    )  # fmt: skip
    assert (code, err) == (
        2,
        f"agentloop-sft: error: {step_dir} is not an agentloop-sft checkpoint (no data position "
        "in its trainer_state.json): set trainer.resume_mode=disable or another "
        "trainer.default_local_dir",
    )

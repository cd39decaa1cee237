"""``agentloop-train`` start-up errors: each bad input fails before any server or trainer rank
starts, with one line that says what to change (exit code 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainer.cli.train import main

USER = [{"role": "user", "content": "Add 2 and 3."}]


@pytest.fixture()
def data(tmp_path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": USER, "data_source": "openai/gsm8k", "extra_info": {"index": i}})
            + "\n"
            for i in range(8)
        )
    )
    return path


def run(capsys, tmp_path, data: Path, *overrides: str, run_dir: Path | None = None) -> str:
    """``agentloop-train`` with a small valid config plus ``overrides``; its one-line error."""
    code = main(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            f"data.train_files={data}",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            f"trainer.default_local_dir={run_dir or tmp_path / 'run'}",
            *overrides,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("agentloop-train: error: ")
    return err.removeprefix("agentloop-train: error: ")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.train_files=/nowhere/train.jsonl"],
            "data file '/nowhere/train.jsonl' does not exist",
        ),
        (
            ["actor_rollout_ref.model.path=/nowhere/model"],
            "actor_rollout_ref.model.path '/nowhere/model' is neither a model folder nor a known "
            "asset name (smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long)",
        ),
        (
            ["data.train_batch_size=3"],
            "data.train_batch_size=3 is not divisible by actor_rollout_ref.actor."
            "ppo_mini_batch_size=2: make it a multiple",
        ),
        (
            ["trainer.n_gpus_per_node=3"],
            "a mini-batch of 4 samples (ppo_mini_batch_size=2 x rollout.n=2) does not split over "
            "3 trainer ranks (trainer.nnodes x trainer.n_gpus_per_node): make it a multiple",
        ),
        (
            ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
            "4 samples per rank per mini-batch is not divisible by actor_rollout_ref.actor."
            "ppo_micro_batch_size_per_gpu=3: make it a divisor (or set actor_rollout_ref.actor."
            "use_dynamic_bsz=True)",
        ),
        (
            ["algorithm.adv_estimator=ppo2"],
            "algorithm.adv_estimator='ppo2' is not supported; use one of grpo, rloo, "
            "reinforce_plus_plus",
        ),
        (
            ["actor_rollout_ref.actor.loss_agg_mode=token-sum"],
            "actor_rollout_ref.actor.loss_agg_mode='token-sum' is not supported; use one of "
            "token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm",
        ),
        (
            ["actor_rollout_ref.rollout.n=1"],
            "algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n=1: every group has "
            "one sample, so every advantage is 0; set actor_rollout_ref.rollout.n=2 or more (or "
            "algorithm.adv_estimator=reinforce_plus_plus)",
        ),
        (
            ["actor_rollout_ref.rollout.mode=sync"],
            "actor_rollout_ref.rollout.mode='sync' is not supported: agent loops run against "
            "servers; set actor_rollout_ref.rollout.mode=async",
        ),
        (
            ["data.max_prompt_length=5"],
            "after filtering prompts over data.max_prompt_length=5: raise it",
        ),
        (
            ["custom_reward_function.path=/nowhere/reward.py"],
            "custom_reward_function.path='/nowhere/reward.py': there is no file "
            "'/nowhere/reward.py'; point it at an existing .py file (a relative path starts at "
            "the working directory)",
        ),
        (
            ["trainer.logger=[console,neptune]"],
            "trainer.logger has unknown backend 'neptune'; use console, jsonl, mlflow, "
            "tensorboard, wandb",
        ),
        (
            ["trainer.resume_mode=resume_path"],
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N dir>",
        ),
        (["+epochs=3"], "unknown extra +epochs: agentloop-train takes none"),
        (
            ["custom_reward_function.executor=fork"],
            "custom_reward_function.executor must be one of 'thread', 'process', got 'fork'",
        ),
        (
            ["+reward_model.weights.fmt=0.5"],
            "reward_model.weights.fmt names no reward; known: judge, rule, verify (add extra "
            "rule rewards under reward_model.rules)",
        ),
        (
            ["reward_model.judge.enable=True"],
            "reward_model.judge.enable=True needs reward_model.judge.model_path=<model>",
        ),
        (
            ["reward_model.judge.enable=True", "reward_model.judge.model_path=/nowhere/judge"],
            "reward_model.judge.model_path '/nowhere/judge' is neither a model folder nor a "
            "known asset name",
        ),
        (
            ["reward_model.verify.path=/nowhere/verify.py"],
            "reward_model.verify.path='/nowhere/verify.py': there is no file "
            "'/nowhere/verify.py'; point it at an existing .py file",
        ),
        (
            ["reward_model.rules=[{name: fmt, path: /nowhere/fmt.py}]"],
            "reward_model.rules[0].path='/nowhere/fmt.py': there is no file '/nowhere/fmt.py'; "
            "point it at an existing .py file",
        ),
        (
            ["trainer.val_only=True"],
            "trainer.val_only=True validates and ends, but there are no validation rows: set "
            "data.val_files",
        ),
        (
            ["actor_rollout_ref.rollout.weight_transfer=rdma"],
            "actor_rollout_ref.rollout.weight_transfer='rdma': use host, nccl or ipc",
        ),
        (
            [
                "actor_rollout_ref.rollout.weight_transfer=nccl",
                "actor_rollout_ref.rollout.name=sglang",
            ],
            "actor_rollout_ref.rollout.weight_transfer=nccl is vLLM's weight-transfer API: set it "
            "to host with rollout.name=sglang",
        ),
        (
            ["actor_rollout_ref.rollout.weight_transfer=nccl", "trainer.device=cpu"],
            "actor_rollout_ref.rollout.weight_transfer=nccl needs CUDA GPUs: set "
            "actor_rollout_ref.rollout.weight_transfer=host on CPU",
        ),
    ],
)
def test_bad_input_fails_at_start_up(capsys, tmp_path, data, overrides, message):
    assert message in run(capsys, tmp_path, data, *overrides)


def test_empty_dataset_after_filtering_is_an_error_that_names_the_file(capsys, tmp_path, data):
    err = run(capsys, tmp_path, data, "data.max_prompt_length=5")
    assert err.startswith(f"no rows left in {data} (8 read) after filtering")


def test_raw_chat_off_without_raw_prompt(capsys, tmp_path, data):
    err = run(capsys, tmp_path, data, "data.return_raw_chat=False")
    assert err == (
        f"{data}: row 0 has no 'raw_prompt' and data.return_raw_chat is False; agent loops need "
        "the chat messages: set data.return_raw_chat=True"
    )


def test_unwritable_checkpoint_folder(capsys, tmp_path, data):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = run(capsys, tmp_path, data, f"trainer.default_local_dir={blocker / 'run'}")
    assert err.startswith(f"checkpoint folder {blocker / 'run'} is not writable (")
    assert err.endswith("set trainer.default_local_dir to a writable folder")


def test_wandb_logger_without_the_package(capsys, tmp_path, data, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    err = run(capsys, tmp_path, data, "trainer.logger=[console,wandb]")
    assert err == (
        "trainer.logger contains 'wandb' but the wandb package is not installed: pip install "
        "wandb, or remove wandb from trainer.logger"
    )


def test_cuda_requested_without_a_gpu(capsys, tmp_path, data):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    err = run(capsys, tmp_path, data, "trainer.device=cuda")
    assert err == "trainer.device=cuda but no CUDA device is visible: set trainer.device=cpu"


# ---- start-up warnings: silent fallbacks said out loud, once each ----------------------------
CALC_TOOLS = Path(__file__).resolve().parents[3] / "recipes" / "calculator" / "tool_config.yaml"


def test_tools_that_rows_never_see_and_validation_never_run_are_warned_at_start_up(
    capsys, tmp_path, data, caplog
):
    blocker = tmp_path / "a_file"  # stops the start after the checks that warn
    blocker.write_text("")
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run(
            capsys,
            tmp_path,
            data,
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={CALC_TOOLS}",
            f"data.val_files={data}",
            f"trainer.default_local_dir={blocker / 'run'}",
        )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "data.val_files is set but validation never runs (trainer.test_freq=-1, "
        "trainer.val_before_train=False): set trainer.test_freq=N to validate every N steps and "
        "after the last one",
        *(
            f"data.{split}_files: 8 of 8 rows never see the configured tools (calculator) "
            "because their agent loop offers none (8 run single_turn_agent): give the rows "
            "agent_name: tool_agent, or set actor_rollout_ref.rollout.agent."
            "default_agent_loop=tool_agent for rows without one"
            for split in ("train", "val")
        ),
    ]


def test_rows_on_a_tool_loop_and_scheduled_validation_are_not_warned(
    capsys, tmp_path, data, caplog
):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run(
            capsys,
            tmp_path,
            data,
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={CALC_TOOLS}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            f"data.val_files={data}",
            "trainer.test_freq=5",
            f"trainer.default_local_dir={blocker / 'run'}",
        )
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_val_only_is_not_warned_that_validation_never_runs(capsys, tmp_path, data, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run(
            capsys,
            tmp_path,
            data,
            f"data.val_files={data}",
            "trainer.val_only=True",  # trainer.test_freq=-1: the only validation is val_only's
            f"trainer.default_local_dir={blocker / 'run'}",
        )
    assert not [r for r in caplog.records if "validation never runs" in r.getMessage()]


@pytest.mark.parametrize(
    ("transfer", "hybrid", "message"),
    [
        (
            "nccl",
            True,
            "actor_rollout_ref.rollout.weight_transfer=nccl needs rollout servers on their own "
            "GPUs: set actor_rollout_ref.hybrid_engine=False, or actor_rollout_ref.rollout."
            "weight_transfer=ipc for colocated servers",
        ),
        (
            "ipc",
            False,
            "actor_rollout_ref.rollout.weight_transfer=ipc reaches only engines on the trainer's "
            "own GPUs: set actor_rollout_ref.hybrid_engine=True, or actor_rollout_ref.rollout."
            "weight_transfer=nccl for servers on other GPUs",
        ),
    ],
)
def test_gpu_weight_transfer_must_fit_the_placement(transfer, hybrid, message):
    from trainer.config import load_config

    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "data.train_files=/x.jsonl",
            f"actor_rollout_ref.rollout.weight_transfer={transfer}",
            f"actor_rollout_ref.hybrid_engine={hybrid}",
        ]
    )
    with pytest.raises(ValueError) as info:
        config.actor_rollout_ref.check_weight_transfer("cuda")
    assert str(info.value) == message
    default, _ = load_config(["actor_rollout_ref.model.path=x", "data.train_files=/x"])
    default.actor_rollout_ref.check_weight_transfer("cpu")  # host: any placement


def test_gpu_only_offload_keys_warn_on_cpu_once_each(caplog, monkeypatch):
    import trainer.config as config_pkg
    from trainer.config import load_config

    monkeypatch.setattr(config_pkg, "_warned", set())
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=m",
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
            "actor_rollout_ref.ref.param_offload=true",
        ]
    )
    with caplog.at_level("WARNING", logger="trainer.config.schema"):
        config.actor_rollout_ref.warn_cpu_noops("cuda")
        assert caplog.records == []
        config.actor_rollout_ref.warn_cpu_noops("cpu")
        config.actor_rollout_ref.warn_cpu_noops("cpu")
    assert [r.getMessage() for r in caplog.records] == [
        f"actor_rollout_ref.{key}=True has no effect on CPU: parameters are in CPU memory"
        for key in ("actor.fsdp_config.param_offload", "ref.param_offload")
    ]


# ---- rollout servers and their engine arguments ---------------------------------------------
def _config(*overrides: str):
    from trainer.config import load_config

    config, _ = load_config(["actor_rollout_ref.model.path=m", "data.train_files=/x", *overrides])
    return config


TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"


@pytest.mark.parametrize(
    ("overrides", "cpu", "cuda"),
    [
        ([], 1, 1),
        (["trainer.n_gpus_per_node=8"], 1, 8),  # verl: world_size // tp replicas
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=8", f"{TP}=2"], 1, 8),
        (["trainer.n_gpus_per_node=2", f"{TP}=4"], 1, 1),  # fewer GPUs than one server: one
        (["trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.num_servers=3"], 3, 3),
    ],
)
def test_num_servers_null_is_one_on_cpu_and_one_per_tp_group_of_gpus_on_cuda(overrides, cpu, cuda):
    config = _config(*overrides)
    assert (config.servers_for("cpu"), config.servers_for("cuda")) == (cpu, cuda)


def test_gpus_that_do_not_split_into_tensor_parallel_servers_are_refused():
    config = _config("trainer.n_gpus_per_node=6", f"{TP}=4")
    with pytest.raises(ValueError) as info:
        config.servers_for("cuda")
    assert str(info.value) == (
        "6 trainer GPUs (trainer.nnodes x trainer.n_gpus_per_node) do not split into rollout "
        "servers of actor_rollout_ref.rollout.tensor_model_parallel_size=4 GPUs: make the GPUs "
        "a multiple of it, or set actor_rollout_ref.rollout.num_servers"
    )
    assert config.servers_for("cpu") == 1


def test_an_engine_argument_a_rollout_key_sets_fails_at_start_up(capsys, tmp_path, data):
    err = run(
        capsys,
        tmp_path,
        data,
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.tensor_parallel_size=2",
    )
    assert err == (
        "actor_rollout_ref.rollout.engine_kwargs.vllm.tensor_parallel_size: the server sets this "
        "engine argument from actor_rollout_ref.rollout.tensor_model_parallel_size; set "
        "actor_rollout_ref.rollout.tensor_model_parallel_size instead"
    )


KW = "+actor_rollout_ref.rollout.engine_kwargs"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            f"{KW}.vllm.max_num_batchd_tokens=64",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_batchd_tokens is not an engine "
            "argument of vLLM (did you mean max_num_batched_tokens? set actor_rollout_ref."
            "rollout.max_num_batched_tokens for it): fix the name or remove it",
        ),
        (
            f"{KW}.vllm.dtype=float16",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.dtype: the server sets this engine "
            "argument itself and it cannot be changed; remove it",
        ),
        (
            f"{KW}.vllm.model=/other",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.model: the server sets this engine "
            "argument from actor_rollout_ref.model.path; set actor_rollout_ref.model.path instead",
        ),
    ],
)
def test_bad_engine_kwargs_name_the_key_to_change(override, message):
    from trainer.launch.rollout import check_engine_kwargs

    with pytest.raises(ValueError) as info:
        check_engine_kwargs(_config(override).actor_rollout_ref.rollout)
    assert str(info.value) == message


def test_engine_kwargs_of_the_other_backend_and_known_names_pass():
    from trainer.launch.rollout import check_engine_kwargs

    rollout = _config(
        f"{KW}.vllm.max_logprobs=5", f"{KW}.sglang.tp_size=2"
    ).actor_rollout_ref.rollout
    check_engine_kwargs(rollout)  # name=vllm: the sglang table is not used
    assert rollout.engine.engine_kwargs == {"max_logprobs": 5}

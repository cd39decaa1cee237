"""Cross-key checks of a training config, run before anything starts. Each message says which
key to change."""

from __future__ import annotations

import logging

from trainer.config.schema import Config

logger = logging.getLogger(__name__)

__all__ = [
    "async_groups_per_step",
    "check_async_config",
    "check_train_config",
    "check_weight_transfer",
    "resolve_device",
    "servers_for",
    "warn_cpu_noops",
]


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "trainer.device=cuda but no CUDA device is visible: set trainer.device=cpu"
        )
    return device


def check_train_config(config: Config) -> None:
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    algo = config.algorithm
    world = config.trainer.world_size
    batch = config.data.train_batch_size
    if algo.adv_estimator in ("grpo", "rloo") and rollout.n < 2:
        raise ValueError(
            f"algorithm.adv_estimator={algo.adv_estimator} with actor_rollout_ref.rollout.n="
            f"{rollout.n}: every group has one sample, so every advantage is 0; set "
            "actor_rollout_ref.rollout.n=2 or more (or algorithm.adv_estimator=reinforce_plus_plus)"
        )
    if batch % actor.ppo_mini_batch_size:
        raise ValueError(
            f"data.train_batch_size={batch} is not divisible by actor_rollout_ref.actor."
            f"ppo_mini_batch_size={actor.ppo_mini_batch_size}: make it a multiple"
        )
    mini_samples = actor.ppo_mini_batch_size * rollout.n
    if mini_samples % world:
        raise ValueError(
            f"a mini-batch of {mini_samples} samples (ppo_mini_batch_size="
            f"{actor.ppo_mini_batch_size} x rollout.n={rollout.n}) does not split over {world} "
            "trainer ranks (trainer.nnodes x trainer.n_gpus_per_node): make it a multiple"
        )
    per_rank = mini_samples // world
    if not actor.use_dynamic_bsz and per_rank % actor.ppo_micro_batch_size_per_gpu:
        raise ValueError(
            f"{per_rank} samples per rank per mini-batch is not divisible by actor_rollout_ref."
            f"actor.ppo_micro_batch_size_per_gpu={actor.ppo_micro_batch_size_per_gpu}: make it "
            "a divisor (or set actor_rollout_ref.actor.use_dynamic_bsz=True)"
        )
    context = rollout.prompt_length + rollout.response_length
    if actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu < context:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu}"
            f" is below one full sample ({context} = prompt_length + response_length): raise it"
        )
    if config.trainer.total_training_steps is not None and config.trainer.total_training_steps < 1:
        raise ValueError("trainer.total_training_steps must be >= 1 (or null)")
    lora = config.actor_rollout_ref.model.use_lora
    if "hf_merged" in actor.checkpoint.save_contents and not lora:
        raise ValueError(
            "actor_rollout_ref.actor.checkpoint.save_contents has hf_merged, which merges a LoRA "
            "adapter, but actor_rollout_ref.model.lora_rank=0: hf_model is the full model "
            "already; drop hf_merged (or set actor_rollout_ref.model.lora_rank)"
        )
    check_async_config(config)
    check_cpu_cores(config)
    if config.data.val_files:
        for message in rollout.val_kwargs.warnings():
            logger.warning(message)


def check_cpu_cores(config: Config) -> None:
    """The core lists name cores this machine has (``parse_cores`` says what to write)."""
    from servers.config import parse_cores

    ref = config.actor_rollout_ref
    if ref.rollout.cpu_cores is not None:
        parse_cores(ref.rollout.cpu_cores, "actor_rollout_ref.rollout.cpu_cores")
    if ref.actor.cpu_cores is not None:
        parse_cores(ref.actor.cpu_cores, "actor_rollout_ref.actor.cpu_cores")


def warn_cpu_noops(config: Config, device: str) -> None:
    """Keys accepted on every device that only act on GPU say so on CPU."""
    if device != "cpu":
        return
    ref = config.actor_rollout_ref
    keys = {
        "actor_rollout_ref.actor.fsdp_config.param_offload": ref.actor.fsdp_config.param_offload,
        "actor_rollout_ref.ref.param_offload": ref.ref.param_offload,
    }
    for key, on in keys.items():
        if on:
            logger.warning("%s=True has no effect on CPU: parameters are in CPU memory", key)


def servers_for(config: Config, device: str) -> int:
    """Rollout servers to start on ``device``: ``actor_rollout_ref.rollout.num_servers`` when
    set, else verl's count on CUDA: one server per tensor-parallel group of the trainer's GPUs
    (``trainer.nnodes x trainer.n_gpus_per_node // tensor_model_parallel_size``, at least 1),
    and one on CPU: a CPU engine is a whole process whose threads take every core it is given
    (``rollout.cpu_cores``), so a second engine on the node would only share those cores and
    hold a second KV cache in RAM. Raises when the GPUs do not split into whole groups."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.num_servers is not None:
        return rollout.num_servers
    if device != "cuda":
        return 1
    world, tp = config.trainer.world_size, rollout.tensor_model_parallel_size
    if world > tp and world % tp:
        raise ValueError(
            f"{world} trainer GPUs (trainer.nnodes x trainer.n_gpus_per_node) do not split into "
            f"rollout servers of actor_rollout_ref.rollout.tensor_model_parallel_size={tp} GPUs: "
            "make the GPUs a multiple of it, or set actor_rollout_ref.rollout.num_servers"
        )
    return max(1, world // tp)


def check_weight_transfer(config: Config, device: str) -> None:
    """vLLM's GPU weight transfer fits the placement: NCCL cannot put trainer rank 0 and an
    engine on one GPU, and CUDA IPC reaches only engines on the trainer ranks' own GPUs."""
    ref = config.actor_rollout_ref
    transfer = ref.rollout.weight_transfer
    key = "actor_rollout_ref.rollout.weight_transfer"
    if transfer == "host":
        return
    if device != "cuda":
        raise ValueError(f"{key}={transfer} needs CUDA GPUs: set {key}=host on CPU")
    if transfer == "nccl" and ref.hybrid_engine:
        raise ValueError(
            f"{key}=nccl needs rollout servers on their own GPUs: set "
            f"actor_rollout_ref.hybrid_engine=False, or {key}=ipc for colocated servers"
        )
    if transfer == "ipc" and not ref.hybrid_engine:
        raise ValueError(
            f"{key}=ipc reaches only engines on the trainer's own GPUs: set "
            f"actor_rollout_ref.hybrid_engine=True, or {key}=nccl for servers on other GPUs"
        )


def async_groups_per_step(config: Config) -> int:
    """Prompts (GRPO groups) one async step trains on."""
    required = config.async_training.require_batches
    if required is None:
        return config.data.train_batch_size
    return required * config.actor_rollout_ref.actor.ppo_mini_batch_size


def check_async_config(config: Config) -> None:
    """The combinations of ``async_training`` and ``algorithm.rollout_correction`` /
    ``filter_groups`` that cannot work."""
    run = config.async_training
    algo = config.algorithm
    if run.use_rollout_log_probs and algo.rollout_correction.mode != "none":
        raise ValueError(
            "async_training.use_rollout_log_probs=True makes the old policy the engine's, so "
            f"algorithm.rollout_correction.mode={algo.rollout_correction.mode} has nothing to "
            "correct (every weight is 1): set one of them off"
        )
    if not run.enable:
        if algo.filter_groups.enable:
            raise ValueError(
                "algorithm.filter_groups.enable=True refills dropped groups from the rollout "
                "stream: set async_training.enable=True (staleness_threshold=0 keeps it "
                "on-policy)"
            )
        return
    if algo.filter_groups.enable and algo.adv_estimator not in ("grpo", "rloo"):
        raise ValueError(
            "algorithm.filter_groups.enable=True drops groups whose samples scored alike, which "
            f"only means 'no signal' for group baselines: use algorithm.adv_estimator=grpo or "
            f"rloo, not {algo.adv_estimator}"
        )

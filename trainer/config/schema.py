"""Typed config tree (verl key names). Each component gets only its own subtree; the
rollout subtree is ``agentloop.RolloutConfig``. These dataclasses are the one source of the
defaults: ``ppo_trainer.yaml`` is written from them, each field's docstring as its comment
(``make config``, i.e. ``python -m trainer.config.generate``; a test fails while the file
is stale), so a new field is added here only.

Each field is checked where it is built (``__post_init__``); the checks across keys, and
those that need the device, run at start-up: ``Config.check``,
``ActorRolloutRefConfig.check_weight_transfer``, ``Config.servers_for``. Each message says
which key to change."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from agentloop.config import RolloutConfig
from trainer.algos import GROUPED
from trainer.algos.correction import CorrectionSpec
from trainer.config import warn_no_effect
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig, prefix_trees_blocked
from trainer.config.async_training import AsyncTrainingConfig
from trainer.config.critic import CriticConfig
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.config.run import AlgorithmConfig, RayKwargsConfig, TrainerConfig

__all__ = [
    "ActorRolloutRefConfig",
    "Config",
    "CustomClsConfig",
    "DataConfig",
    "EnvDatasetConfig",
    "ModelConfig",
    "SamplerConfig",
]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class CustomClsConfig:
    """verl's ``data.custom_cls``: a dataset class of the user's that reads the data files."""

    path: str | None = None
    """Where the class lives: ``pkg://package.module``, ``file://path/to/file.py`` or a
    ``.py`` path (verl's forms); None: rows are read from the files as they are."""
    name: str | None = None
    """The class's name in that module."""


@dataclass(kw_only=True, slots=True)
class SamplerConfig:
    """verl's ``data.sampler``: a sampler of the user's that picks the order of the rows (a
    curriculum sampler also gets ``update(batch)`` after every training step)."""

    class_path: str | None = None
    """Where the class lives (``pkg://...``, ``file://...`` or a ``.py`` path); None: the
    rows are shuffled from ``data.seed`` every epoch."""
    class_name: str | None = None
    """The class's name in that module."""


@dataclass(kw_only=True, slots=True)
class EnvDatasetConfig:
    """Rows from an environment's own dataset (a verifiers environment's), used where
    ``data.train_files`` / ``data.val_files`` is unset (``trainer.data.env_rows``)."""

    verifiers: str | None = None
    """The verifiers environment id whose dataset gives the rows (None: none)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Its ``load_environment`` keyword arguments (the rows carry them to the loop)."""
    paths: list[str] = field(default_factory=list)
    """Folders first on its ``PYTHONPATH`` (an environment that is not an installed package)."""
    python: str | None = None
    """Its interpreter (default ``$AGENTLOOP_VERIFIERS_PYTHON`` or ``.venv-verifiers``)."""
    agent_name: str = "verifiers"
    """The agent loop of its rows (the built-in ``verifiers`` loop reads the row's env)."""
    train_split: str = "train"
    """The environment's split for training rows: ``train`` (its dataset) or ``eval``."""
    train_size: int = -1
    """Training rows taken (-1: all)."""
    val_split: str = "eval"
    """The split for validation rows."""
    val_size: int = 0
    """Validation rows taken when ``data.val_files`` is unset (0: no validation rows from
    the environment; -1: all)."""

    def __post_init__(self) -> None:
        for key in ("train_split", "val_split"):
            if getattr(self, key) not in ("train", "eval"):
                raise ValueError(
                    f"data.env_dataset.{key} must be train or eval, got {getattr(self, key)!r}"
                )
        for key in ("train_size", "val_size"):
            if getattr(self, key) < -1:
                raise ValueError(f"data.env_dataset.{key} must be -1 (all), 0 or a row count")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    train_files: list[str] | str | None = None
    """Parquet or jsonl file(s) in the verl row layout."""
    val_files: list[str] | str | None = None
    """Validation rows, rolled out every trainer.test_freq steps."""
    prompt_key: str = "prompt"
    """Column holding the chat messages (a plain string becomes one user message)."""
    max_prompt_length: int = 1024
    """Prompt tokens, tool schemas included, above which a row is dropped (and counted)."""
    filter_overlong_prompts: bool = True
    """Drop rows whose prompt is longer than max_prompt_length (else they stop the start)."""
    return_raw_chat: bool = True
    """Hand agent loops the chat messages; required unless rows carry ``raw_prompt``."""
    train_batch_size: int = 8
    """Prompts per training step (each rolled out rollout.n times)."""
    shuffle: bool = True
    """Reshuffle the rows every epoch."""
    seed: int = 0
    """Seed of the shuffle."""
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    """A dataset class that reads the files (verl's contract: ``cls(data_files=, tokenizer=,
    processor=None, config=, max_samples=-1)``, ``len`` and ``[i]`` giving row dicts); its
    rows go through the same checks as file rows (docs/data.md)."""
    env_dataset: EnvDatasetConfig = field(default_factory=EnvDatasetConfig)
    """An environment whose own dataset gives the rows where the files are unset."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """A sampler class picking the row order (verl's contract: ``cls(data_source=,
    data_config=)`` iterating dataset indices; ``update(batch)`` after each step when it has
    one; ``state_dict``/``load_state_dict`` kept in checkpoints when it has them)."""

    def __post_init__(self) -> None:
        for key, pair in (
            ("custom_cls", (self.custom_cls.path, self.custom_cls.name)),
            ("sampler", (self.sampler.class_path, self.sampler.class_name)),
        ):
            if (pair[0] is None) != (pair[1] is None):
                names = "path and name" if key == "custom_cls" else "class_path and class_name"
                raise ValueError(f"data.{key}: set both {names}, or neither")
        if self.max_prompt_length < 1:
            raise ValueError("data.max_prompt_length must be >= 1")
        if self.train_batch_size < 1:
            raise ValueError("data.train_batch_size must be >= 1")

    @staticmethod
    def files(value: list[str] | str | None) -> list[str]:
        if value is None:
            return []
        return [value] if isinstance(value, str) else list(value)


@dataclass(kw_only=True, slots=True)
class ActorRolloutRefConfig:
    model: ModelConfig
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout servers, their sampling and the agent loops (``agentloop.RolloutConfig``)."""
    hybrid_engine: bool = True
    """GPU: servers sleep during the update and wake for the next rollout (colocated); False:
    servers keep their own GPUs (standalone). No effect on CPU."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)

    def __post_init__(self) -> None:
        blocked = prefix_trees_blocked(self.model, "actor_rollout_ref.model.use_remove_padding")
        if self.actor.shared_prefix is None:
            self.actor.shared_prefix = blocked is None
        elif self.actor.shared_prefix and blocked:
            raise ValueError(
                "actor_rollout_ref.actor.shared_prefix=true needs packed rows on sdpa or eager "
                f"attention, but {blocked}: set actor_rollout_ref.actor.shared_prefix=false "
                "(or null)"
            )

    def check_cpu_cores(self) -> None:
        """The core lists name cores this machine has (``parse_cores`` says what to write)."""
        from servers.config import parse_cores

        if self.rollout.engine.cpu_cores is not None:
            parse_cores(self.rollout.engine.cpu_cores, "actor_rollout_ref.rollout.cpu_cores")
        if self.actor.cpu_cores is not None:
            parse_cores(self.actor.cpu_cores, "actor_rollout_ref.actor.cpu_cores")

    def check_weight_transfer(self, device: str) -> None:
        """vLLM's GPU weight transfer fits the placement: NCCL cannot put trainer rank 0 and an
        engine on one GPU, and CUDA IPC reaches only engines on the trainer ranks' own GPUs."""
        transfer = self.rollout.engine.weight_transfer
        key = "actor_rollout_ref.rollout.weight_transfer"
        if transfer == "host":
            return
        if device != "cuda":
            raise ValueError(f"{key}={transfer} needs CUDA GPUs: set {key}=host on CPU")
        if transfer == "nccl" and self.hybrid_engine:
            raise ValueError(
                f"{key}=nccl needs rollout servers on their own GPUs: set "
                f"actor_rollout_ref.hybrid_engine=False, or {key}=ipc for colocated servers"
            )
        if transfer == "ipc" and not self.hybrid_engine:
            raise ValueError(
                f"{key}=ipc reaches only engines on the trainer's own GPUs: set "
                f"actor_rollout_ref.hybrid_engine=True, or {key}=nccl for servers on other GPUs"
            )

    def warn_cpu_noops(self, device: str) -> None:
        """Keys accepted on every device that only act on GPU say so on CPU (once each)."""
        if device != "cpu":
            return
        prefix = "actor_rollout_ref"
        keys = {
            f"{prefix}.actor.fsdp_config.param_offload": self.actor.fsdp_config.param_offload,
            f"{prefix}.ref.param_offload": self.ref.param_offload,
        }
        for key, on in keys.items():
            if on:
                warn_no_effect(logger, key, True, "on CPU: parameters are in CPU memory")


@dataclass(kw_only=True, slots=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model of PPO with GAE (on when ``algorithm.adv_estimator=gae``)."""
    custom_reward_function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    """The "rule" reward: a Python function called per sample (verl's signature)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """The rewards besides the rule and how they are summed: extra rules, a judge model, a
    verify hook that may call the tools."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Rollout as a stream that never waits for the trainer (docs/async-training.md)."""
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """How the run reaches Ray: a cluster to join, or Ray started here (docs/cluster.md)."""

    @property
    def use_critic(self) -> bool:
        """``critic.enable``, or when null verl's rule: a critic exactly for GAE."""
        if self.critic.enable is None:
            return self.algorithm.adv_estimator == "gae"
        return self.critic.enable

    @property
    def correction(self) -> CorrectionSpec:
        """``algorithm.rollout_correction`` resolved; bypass mode also where
        ``async_training.use_rollout_log_probs`` asks for the engine's log-probs (verl's
        async spelling of ``bypass_mode``)."""
        spec = self.algorithm.rollout_correction.spec
        if self.async_training.use_rollout_log_probs and not spec.bypass:
            spec = dataclasses.replace(spec, bypass=True)
        return spec

    @property
    def async_groups_per_step(self) -> int:
        """Prompts (GRPO groups) one async step trains on."""
        required = self.async_training.require_batches
        if required is None:
            return self.data.train_batch_size
        return required * self.actor_rollout_ref.actor.ppo_mini_batch_size

    def servers_for(self, device: str) -> int:
        """Rollout servers to start on ``device``: ``actor_rollout_ref.rollout.num_servers``
        when set, else verl's count on CUDA: one server per tensor-parallel group of the
        trainer's GPUs (``trainer.nnodes x trainer.n_gpus_per_node //
        tensor_model_parallel_size``, at least 1), and one on CPU: a CPU engine is a whole
        process whose threads take every core it is given (``rollout.cpu_cores``), so a second
        engine on the node would only share those cores and hold a second KV cache in RAM.
        Raises when the GPUs do not split into whole groups."""
        rollout = self.actor_rollout_ref.rollout
        if rollout.num_servers is not None:
            return rollout.num_servers
        if device != "cuda":
            return 1
        world, tp = self.trainer.world_size, rollout.engine.tensor_parallel_size
        if world > tp and world % tp:
            raise ValueError(
                f"{world} trainer GPUs (trainer.nnodes x trainer.n_gpus_per_node) do not split "
                "into rollout servers of actor_rollout_ref.rollout.tensor_model_parallel_size="
                f"{tp} GPUs: make the GPUs a multiple of it, or set "
                "actor_rollout_ref.rollout.num_servers"
            )
        return max(1, world // tp)

    def check(self) -> None:
        """The checks across keys of a training run, before anything starts."""
        actor = self.actor_rollout_ref.actor
        rollout = self.actor_rollout_ref.rollout
        algo = self.algorithm
        world = self.trainer.world_size
        batch = self.data.train_batch_size
        if algo.adv_estimator in ("grpo", "rloo", "grpo_passk", "gigpo") and rollout.n < 2:
            raise ValueError(
                f"algorithm.adv_estimator={algo.adv_estimator} with actor_rollout_ref.rollout.n="
                f"{rollout.n}: every group has one sample, so every advantage is 0; set "
                "actor_rollout_ref.rollout.n=2 or more (or "
                "algorithm.adv_estimator=reinforce_plus_plus)"
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
                f"{actor.ppo_mini_batch_size} x rollout.n={rollout.n}) does not split over "
                f"{world} trainer ranks (trainer.nnodes x trainer.n_gpus_per_node): make it a "
                "multiple"
            )
        per_rank = mini_samples // world
        if not actor.use_dynamic_bsz and per_rank % actor.ppo_micro_batch_size_per_gpu:
            raise ValueError(
                f"{per_rank} samples per rank per mini-batch is not divisible by "
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="
                f"{actor.ppo_micro_batch_size_per_gpu}: make it a divisor (or set "
                "actor_rollout_ref.actor.use_dynamic_bsz=True)"
            )
        context = rollout.prompt_length + rollout.response_length
        if actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu < context:
            raise ValueError(
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu="
                f"{actor.ppo_max_token_len_per_gpu} is below one full sample ({context} = "
                "prompt_length + response_length): raise it"
            )
        steps = self.trainer.total_training_steps
        if steps is not None and steps < 1:
            raise ValueError("trainer.total_training_steps must be >= 1 (or null)")
        if (
            "hf_merged" in actor.checkpoint.save_contents
            and not self.actor_rollout_ref.model.use_lora
        ):
            raise ValueError(
                "actor_rollout_ref.actor.checkpoint.save_contents has hf_merged, which merges a "
                "LoRA adapter, but actor_rollout_ref.model.lora_rank=0: hf_model is the full "
                "model already; drop hf_merged (or set actor_rollout_ref.model.lora_rank)"
            )
        self.check_critic()
        self.check_async()
        self.check_delta_sync()
        self.actor_rollout_ref.check_cpu_cores()
        if self.data.val_files:
            for message in rollout.val_kwargs.warnings():
                logger.warning(message)

    def check_critic(self) -> None:
        """GAE and the critic go together; the critic's batches split as the actor's must."""
        estimator = self.algorithm.adv_estimator
        if estimator == "gae" and not self.use_critic:
            raise ValueError(
                "algorithm.adv_estimator=gae learns from a critic's values but critic.enable="
                "False: set critic.enable=null (on for gae) or True"
            )
        if not self.use_critic:
            return
        if estimator != "gae":
            raise ValueError(
                f"critic.enable=True with algorithm.adv_estimator={estimator}: only gae uses "
                "a critic's values, so it would train for nothing; set "
                "algorithm.adv_estimator=gae, or critic.enable=null"
            )
        critic, actor = self.critic, self.actor_rollout_ref.actor
        n, world = self.actor_rollout_ref.rollout.n, self.trainer.world_size
        mini = critic.mini_batch_size(actor)
        if self.data.train_batch_size % mini:
            raise ValueError(
                f"data.train_batch_size={self.data.train_batch_size} is not divisible by "
                f"critic.ppo_mini_batch_size={mini}: make it a multiple"
            )
        if (mini * n) % world:
            raise ValueError(
                f"a critic mini-batch of {mini * n} samples (critic.ppo_mini_batch_size={mini} "
                f"x rollout.n={n}) does not split over {world} trainer ranks: make it a multiple"
            )
        micro, dynamic = critic.micro_batch_size(actor), critic.dynamic_bsz(actor)
        if not dynamic and (mini * n // world) % micro:
            raise ValueError(
                f"{mini * n // world} samples per rank per critic mini-batch is not divisible by "
                f"critic.ppo_micro_batch_size_per_gpu={micro}: make it a divisor (or set "
                "critic.use_dynamic_bsz=True)"
            )
        context = self.actor_rollout_ref.rollout.prompt_length
        context += self.actor_rollout_ref.rollout.response_length
        budget = critic.max_token_len(actor)
        if dynamic and budget < context:
            raise ValueError(
                f"critic.ppo_max_token_len_per_gpu={budget} is below one full sample "
                f"({context} = prompt_length + response_length): raise it"
            )

    def check_delta_sync(self) -> None:
        """Delta weight sync sends a full fine-tune's weights over the host route."""
        if not self.trainer.weight_sync_delta.enable:
            return
        key = "trainer.weight_sync_delta.enable=True"
        if self.actor_rollout_ref.model.use_lora:
            raise ValueError(
                f"{key} is for full fine-tuning; a LoRA actor sends only its adapter already: "
                "drop it, or set actor_rollout_ref.model.lora_rank=0"
            )
        transfer = self.actor_rollout_ref.rollout.engine.weight_transfer
        if transfer != "host":
            raise ValueError(
                f"{key} sends over the host route; actor_rollout_ref.rollout.weight_transfer="
                f"{transfer} sends every weight GPU to GPU: set weight_transfer=host, or drop it"
            )

    def check_async(self) -> None:
        """The combinations of ``async_training`` and ``algorithm.rollout_correction`` /
        ``filter_groups`` that cannot work."""
        run = self.async_training
        algo = self.algorithm
        engine = self.actor_rollout_ref.rollout.engine
        if run.enable and run.partial_rollout == "inflight":
            if engine.backend != "vllm":
                raise ValueError(
                    "async_training.partial_rollout=inflight loads weights under running vLLM "
                    f"requests; rollout.name={engine.backend} cannot: set "
                    "actor_rollout_ref.rollout.name=vllm, or partial_rollout=true"
                )
            if engine.weight_transfer != "host":
                raise ValueError(
                    "async_training.partial_rollout=inflight loads the host route's buckets "
                    f"between decode steps; actor_rollout_ref.rollout.weight_transfer="
                    f"{engine.weight_transfer} cannot pause there: set weight_transfer=host, or "
                    "partial_rollout=true"
                )
        correction = algo.rollout_correction
        loss_mode = self.actor_rollout_ref.actor.policy_loss.loss_mode
        if correction.loss_type == "reinforce" and loss_mode != "vanilla":
            raise ValueError(
                "algorithm.rollout_correction.loss_type=reinforce replaces the policy loss, so "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} would not run: set "
                "one of them back (loss_type=ppo_clip or loss_mode=vanilla)"
            )
        if run.use_rollout_log_probs and correction.mode != "none":
            # (verl's rollout_is keys are only measured there, as with bypass_mode)
            raise ValueError(
                "async_training.use_rollout_log_probs=True makes the old policy the engine's, "
                f"so algorithm.rollout_correction.mode={correction.mode}'s importance weights "
                "have nothing to correct (every weight is 1): set one of them off"
            )
        if run.enable and algo.adv_estimator == "remax":
            raise ValueError(
                "algorithm.adv_estimator=remax rolls out one greedy response per prompt beside "
                "each step's samples, which the async stream does not: set "
                "async_training.enable=False, or use another estimator"
            )
        if not run.enable:
            if algo.filter_groups.enable:
                raise ValueError(
                    "algorithm.filter_groups.enable=True refills dropped groups from the rollout "
                    "stream: set async_training.enable=True (staleness_threshold=0 keeps it "
                    "on-policy)"
                )
            return
        if algo.filter_groups.enable and algo.adv_estimator not in GROUPED:
            raise ValueError(
                "algorithm.filter_groups.enable=True drops groups whose samples scored alike, "
                "which only means 'no signal' for group baselines: use "
                f"algorithm.adv_estimator={' or '.join(GROUPED)}, not {algo.adv_estimator}"
            )

"""``algorithm`` and ``trainer``: the RL loop's own config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from servers.placement import check_resource_name
from trainer.algos import GROUPED, KL_TYPES, estimator_for
from trainer.algos.gigpo import GIGPO_MODES
from trainer.config.async_training import FilterGroupsConfig, RolloutCorrectionConfig

# Metric logger backends (trainer.metrics.tracking) and worker log levels
# (trainer.launch.worker_logs): the config is where they are named, the lower layer.
LOGGERS = ("console", "jsonl", "mlflow", "tensorboard", "wandb")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

__all__ = [
    "AlgorithmConfig",
    "KLControlConfig",
    "RayKwargsConfig",
    "RunConfig",
    "TrainerConfig",
    "WeightSyncDeltaConfig",
]


@dataclass(kw_only=True, slots=True)
class RayKwargsConfig:
    """``ray_kwargs`` (verl's keys): how the run reaches Ray (docs/cluster.md)."""

    ray_init: dict[str, Any] = field(default_factory=lambda: {"num_cpus": None})
    """Keyword arguments of ``ray.init``: ``address`` joins a running cluster (else
    ``RAY_ADDRESS``, else a cluster a ``ray start`` left on this machine, else Ray starts
    here), ``num_cpus`` sizes a Ray started here, ``runtime_env`` is merged with the run's;
    null values are left out."""
    timeline_json_file: str | None = None
    """Write Ray's timeline of tasks and actors here (chrome://tracing JSON) when the run
    ends; None: none."""


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """The ``trainer.*`` keys of every training run, RL (``TrainerConfig``) and SFT
    (``trainer.config.sft.SFTTrainerConfig``) alike."""

    project_name: str = "agentloop"
    """MLflow experiment / W&B project of the run."""
    experiment_name: str = "run"
    """MLflow / W&B run name."""
    total_epochs: int = 1
    total_training_steps: int | None = None
    """None: total_epochs x (rows // data.train_batch_size). Set, it wins over total_epochs."""
    logger: list[str] | str = field(default_factory=lambda: ["console"])
    """Metric backends: console, jsonl, mlflow, tensorboard, wandb; one name alone
    (``trainer.logger=console``) is a list of one."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda when a GPU is visible, else cpu."""
    nnodes: int = 1
    n_gpus_per_node: int = 1
    """Trainer ranks per node (FSDP2 processes; on CPU each is a gloo process)."""
    node_resource: str | None = None
    """A custom Ray resource the trainer's nodes declare (``ray start
    --resources='{"trainer": 1}'``): the ranks run only there, ``n_gpus_per_node`` on each of
    ``nnodes`` distinct nodes (docs/cluster.md); None: GPUs place them (one node on CPU: the
    driver's)."""
    save_freq: int = -1
    """Checkpoint every N steps (and at the last step); -1: never (SFT always saves the last
    step: its HF export is the result)."""
    test_freq: int = -1
    """Validate every N steps (and at the last step); -1: never. SFT: the validation loss,
    when data.val_files is set."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoints (``global_step_N/``) and the run's metric files."""
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    """auto: from the newest checkpoint in default_local_dir, if any; resume_path: from
    resume_from_path; disable: from scratch."""
    resume_from_path: str | None = None
    """The ``global_step_N`` folder to resume from with resume_mode=resume_path."""
    seed: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.logger, str):
            self.logger = [self.logger]
        bad = sorted(set(self.logger) - set(LOGGERS))
        if bad:
            raise ValueError(
                f"trainer.logger has unknown backend {bad[0]!r}; use {', '.join(LOGGERS)}"
            )
        if self.nnodes < 1 or self.n_gpus_per_node < 1:
            raise ValueError("trainer.nnodes and trainer.n_gpus_per_node must be >= 1")
        check_resource_name(self.node_resource, "trainer.node_resource")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ValueError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N dir>"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    def total_steps(self, batches_per_epoch: int) -> int:
        """Training steps of the run: ``total_training_steps``, else every epoch's batches."""
        return self.total_training_steps or self.total_epochs * batches_per_epoch

    def resolve_device(self) -> str:
        """``device`` with ``auto`` resolved; raises when CUDA is asked for and absent, or when
        one node is asked for more GPUs than it has."""
        import torch

        has_cuda = torch.cuda.is_available()
        if self.device == "cuda" and not has_cuda:
            raise ValueError(
                "trainer.device=cuda but no CUDA device is visible: set trainer.device=cpu"
            )
        device = self.device if self.device != "auto" else ("cuda" if has_cuda else "cpu")
        if (
            device == "cuda"
            and self.nnodes == 1
            and self.n_gpus_per_node > (count := torch.cuda.device_count())
        ):
            raise ValueError(
                f"trainer.n_gpus_per_node={self.n_gpus_per_node} but this node has {count} "
                "GPU(s): lower it"
            )
        return device


@dataclass(kw_only=True, slots=True)
class KLControlConfig:
    kl_coef: float = 0.001
    """Beta of the KL-in-reward penalty (fixed controller)."""


@dataclass(kw_only=True, slots=True)
class TurnCreditConfig:
    """Turn-level rewards in a group estimator's advantages (``trainer.algos.turns``)."""

    coef: float = 0.0
    """> 0: each token of model turn k also gets coef x the group-normalised discounted
    return of its sample's turn rewards from turn k on (the outcome advantage stays the
    scores'); 0: turn rewards only add to each sample's outcome. GAE and REINFORCE++ read
    turn rewards per token without this."""
    gamma: float = 1.0
    """Discount per model turn of the turn return."""
    norm_by_std: bool = True
    """Divide the turn term by the group's std of turn returns."""

    def __post_init__(self) -> None:
        if self.coef < 0 or not 0 <= self.gamma <= 1:
            raise ValueError(
                f"algorithm.turn_credit.coef={self.coef} must be >= 0 and "
                f"algorithm.turn_credit.gamma={self.gamma} in [0, 1]"
            )


@dataclass(kw_only=True, slots=True)
class GiGPOConfig:
    """``algorithm.gigpo`` (verl-agent's keys): the step term of ``adv_estimator=gigpo``
    (``trainer.algos.gigpo``)."""

    step_advantage_w: float = 1.0
    """Weight of the step advantage added to the episode advantage on each turn's tokens."""
    mode: str = "mean_std_norm"
    """mean_std_norm: episode and step advantages divided by their group's std; mean_norm:
    the mean subtracted only."""

    def __post_init__(self) -> None:
        if self.mode not in GIGPO_MODES:
            raise ValueError(
                f"algorithm.gigpo.mode={self.mode!r} is not supported; use one of "
                f"{', '.join(GIGPO_MODES)}"
            )
        if not self.step_advantage_w >= 0:
            raise ValueError(
                f"algorithm.gigpo.step_advantage_w={self.step_advantage_w} must be >= 0 "
                "(0: the episode advantage alone, GRPO's)"
            )


@dataclass(kw_only=True, slots=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | opo | grpo_passk | gpg |
    remax (a greedy rollout per prompt as baseline) | gigpo (GRPO plus step groups of turns that
    acted on the same state, ``algorithm.gigpo``) | gae (PPO with a critic), or a function of
    your own as package.module:function (``trainer.algos.estimators``)."""
    norm_adv_by_std_in_grpo: bool = True
    """False: GRPO advantages are (s - mean) only (Dr. GRPO)."""
    gamma: float = 1.0
    """Discount per sampled token (GAE, REINFORCE++; observation tokens are not steps), per
    model turn for GiGPO's step returns."""
    lam: float = 1.0
    """GAE's lambda: 1 is the Monte-Carlo return minus the value, 0 the one-step TD error."""
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Off-policy correction from the engine's log-probs (async training, or engine/trainer
    mismatch in sync training)."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling (needs async_training.enable=True)."""
    turn_credit: TurnCreditConfig = field(default_factory=TurnCreditConfig)
    """Turn-level rewards per turn for the group estimators (MT-GRPO style)."""
    gigpo: GiGPOConfig = field(default_factory=GiGPOConfig)
    """GiGPO's step groups (``adv_estimator=gigpo``; ``algorithm.gamma`` discounts per turn)."""

    def __post_init__(self) -> None:
        estimator_for(self.adv_estimator)  # unknown, or a user's function that does not import
        if self.turn_credit.coef > 0 and self.adv_estimator not in GROUPED:
            raise ValueError(
                f"algorithm.turn_credit.coef={self.turn_credit.coef} adds a turn term to a group "
                f"estimator's advantages, but algorithm.adv_estimator={self.adv_estimator} "
                f"reads turn rewards per token already (or is not one of {', '.join(GROUPED)}): "
                "set algorithm.turn_credit.coef=0"
            )
        if self.adv_estimator == "gigpo" and self.turn_credit.coef > 0:
            raise ValueError(
                f"algorithm.turn_credit.coef={self.turn_credit.coef} and "
                "algorithm.adv_estimator=gigpo both credit turns (GiGPO's step term already "
                "reads the turn rewards): set algorithm.turn_credit.coef=0"
            )
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ValueError(
                f"algorithm.gamma={self.gamma} and algorithm.lam={self.lam} must be in [0, 1]"
            )
        if self.kl_penalty not in KL_TYPES:
            raise ValueError(
                f"algorithm.kl_penalty={self.kl_penalty!r} is not supported; "
                f"use one of {', '.join(KL_TYPES)}"
            )


@dataclass(kw_only=True, slots=True)
class WeightSyncDeltaConfig:
    """``trainer.weight_sync_delta``: delta weight sync for full fine-tuning (verl's
    ``checkpoint_engine.backend=delta_sharded``; docs/async-training.md). Each server gets the
    weights whole once (and after a restart), then only what changed since the weights it
    holds, with a checksum per push on both sides."""

    enable: bool = False
    """Send every server that takes it (vLLM) only what changed; False: the whole weights
    each push (by shared-memory files on the trainer's node, else buckets)."""
    encoding: Literal["indices", "bf16_diff"] = "indices"
    """``indices``: the positions whose bits changed and their new values, exact (verl's
    name; small in bf16, where an RL step changes few elements); ``bf16_diff``: float32
    weights as bf16 differences (half the bytes; the rounding is carried to the next push)."""
    full_every: int = 10
    """The weights whole to every server every this many pushes (0: only when a server
    holds no base)."""
    min_change: float = 0.0
    """Skip a tensor whose relative change since what the servers hold is at most this
    (L2); 0: send every changed tensor."""
    checksum: bool = True
    """Check after each push that every server's weights equal the trainer's (an error
    names the server that differs)."""

    def __post_init__(self) -> None:
        if self.encoding not in ("indices", "bf16_diff"):
            raise ValueError(
                f"trainer.weight_sync_delta.encoding={self.encoding!r}: use indices or bf16_diff"
            )
        if self.full_every < 0:
            raise ValueError("trainer.weight_sync_delta.full_every must be >= 0 (0: never)")
        if self.min_change < 0:
            raise ValueError("trainer.weight_sync_delta.min_change must be >= 0")


@dataclass(kw_only=True, slots=True)
class TrainerConfig(RunConfig):
    """``trainer``: the run keys, plus those of the RL loop alone."""

    val_before_train: bool = False
    """Validate once before the first step (needs data.val_files)."""
    val_only: bool = False
    """Validate once and end (verl's key): the model's weights, or the checkpoint
    ``trainer.resume_mode`` resumes; no training step and no checkpoint (needs validation
    rows: data.val_files). ``trainer.validation_data_dir`` keeps the samples."""
    max_actor_ckpt_to_keep: int | None = None
    """Checkpoints kept in default_local_dir (older ones are deleted); None: all."""
    max_critic_ckpt_to_keep: int | None = None
    """Newest checkpoints that keep their critic folder (older ones lose it); None: all."""
    critic_warmup: int = 0
    """The first this many steps train the critic alone (the actor waits for useful values)."""
    balance_batch: bool = True
    """Spread each mini-batch's samples over the trainer ranks so that they get similar token
    counts (verl's default; ``balance/imbalance_{before,after}``); False: equal contiguous
    shares in batch order."""
    weight_sync_bucket_mb: int = 256
    """MiB of weights per bucket when the actor's weights are sent to the servers."""
    weight_sync_delta: WeightSyncDeltaConfig = field(default_factory=WeightSyncDeltaConfig)
    rollout_data_dir: str | None = None
    """Write each step's scored samples to ``<dir>/<step>.jsonl`` (verl's key): the lines
    ``agentloop-rollout`` writes (ids, text, mask, log-probs, record, ``score``, ``scores``)
    with ``step``; None: not written."""
    validation_data_dir: str | None = None
    """The same for each validation (``<dir>/<step>.jsonl``; 0: before training)."""
    worker_log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """Level at which Ray workers (servers, agent-loop workers, trainer ranks) log to this
    console, vLLM's engine logs included; INFO shows the engines' start-up."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)  # slots dataclasses cannot call super() bare
        if self.critic_warmup < 0:
            raise ValueError(f"trainer.critic_warmup must be >= 0, got {self.critic_warmup}")
        if self.worker_log_level not in LOG_LEVELS:
            raise ValueError(
                f"trainer.worker_log_level={self.worker_log_level!r}: use one of "
                f"{', '.join(LOG_LEVELS)}"
            )

"""``agentloop-sft`` config: ``sft_trainer.yaml`` (verl's SFT key names where they exist)
composed with ``key=value`` overrides into typed dataclasses. The model, optimizer and FSDP
subtrees reuse the actor's dataclasses, so a warm start and the RL run read the same keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainer.config import ConfigError, compose_tree
from trainer.config.actor import FSDPConfig, ModelConfig, OptimConfig
from trainer.config.run import RunConfig
from trainer.config.schema import DataConfig

__all__ = [
    "SFTConfig",
    "SFTDataConfig",
    "SFTModelConfig",
    "SFTOptimConfig",
    "SFTTrainerConfig",
    "load_sft_config",
]


@dataclass(kw_only=True, slots=True)
class SFTDataConfig:
    train_files: list[str] | str | None = None
    """Parquet or jsonl file(s); each row holds a chat conversation."""
    val_files: list[str] | str | None = None
    """Conversations whose loss is reported as ``val/loss`` (no training on them)."""
    messages_key: str = "messages"
    """Column with the OpenAI-style messages (system/user/assistant with tool_calls/tool)."""
    tools_key: str = "tools"
    """Column with the row's OpenAI function schemas (a list or a JSON string; optional)."""
    max_length: int = 2048
    """Conversations with more tokens (prompt + response) are dropped and counted."""
    train_batch_size: int = 16
    """Conversations per optimizer step, over all ranks."""
    micro_batch_size_per_gpu: int = 2
    """Conversations per forward/backward on one rank (ignored with use_dynamic_bsz)."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count (``max_token_len_per_gpu``) instead of count."""
    max_token_len_per_gpu: int = 16384
    """Tokens per micro-batch with use_dynamic_bsz (>= max_length): real tokens with
    model.use_remove_padding, else rows x the longest row."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra chat template variables (e.g. ``enable_thinking``), as in the rollout config."""
    shuffle: bool = True
    """Reshuffle the rows every epoch (seeded by trainer.seed and the epoch)."""

    def __post_init__(self) -> None:
        for name in ("max_length", "train_batch_size", "micro_batch_size_per_gpu"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if self.use_dynamic_bsz and self.max_token_len_per_gpu < self.max_length:
            raise ValueError(
                f"data.max_token_len_per_gpu={self.max_token_len_per_gpu} is below "
                f"data.max_length={self.max_length}: a kept conversation could not fit in a "
                "micro-batch; raise data.max_token_len_per_gpu"
            )

    files = staticmethod(DataConfig.files)


@dataclass(kw_only=True, slots=True)
class SFTModelConfig(ModelConfig):
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    PREFIX: ClassVar[str] = "model"


@dataclass(kw_only=True, slots=True)
class SFTOptimConfig(OptimConfig):
    lr: float = 1e-5
    clip_grad: float = 1.0
    """Max global gradient norm (0 or less: no clipping)."""

    PREFIX: ClassVar[str] = "optim"


@dataclass(kw_only=True, slots=True)
class SFTTrainerConfig(RunConfig):
    """``trainer``: the run keys, plus those of SFT alone."""

    project_name: str = "agentloop-sft"
    max_ckpt_to_keep: int | None = None
    """Checkpoints kept in default_local_dir (older ones are deleted); None: all."""

    def __post_init__(self) -> None:
        RunConfig.__post_init__(self)  # slots dataclasses cannot call super() bare
        if self.total_epochs < 1:
            raise ValueError(f"trainer.total_epochs must be >= 1, got {self.total_epochs}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            raise ValueError("trainer.total_training_steps must be >= 1 or null")


@dataclass(kw_only=True, slots=True)
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)

    def __post_init__(self) -> None:
        data, world = self.data, self.trainer.world_size
        if not self.data.files(data.train_files):
            raise ValueError("no training data: set data.train_files=<parquet or jsonl file(s)>")
        if data.train_batch_size % world:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} must be divisible by the "
                f"{world} rank(s) (trainer.nnodes x trainer.n_gpus_per_node)"
            )
        per_step = world * data.micro_batch_size_per_gpu
        if not data.use_dynamic_bsz and data.train_batch_size % per_step:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} must be divisible by ranks x "
                f"data.micro_batch_size_per_gpu = {world} x {data.micro_batch_size_per_gpu} = "
                f"{per_step} (or set data.use_dynamic_bsz=true)"
            )


def load_sft_config(overrides: list[str] | None = None) -> SFTConfig:
    """``sft_trainer.yaml`` + ``overrides``, validated; any problem is a ``ConfigError`` whose
    message says what to set."""
    from agentloop.config import from_dict

    tree = compose_tree(
        "sft_trainer", overrides, "check its spelling against trainer/config/sft_trainer.yaml"
    )
    try:
        return from_dict(SFTConfig, tree)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

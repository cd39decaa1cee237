"""Typed config tree (verl key names). Each component gets only its own subtree; the
rollout subtree is ``agentloop.RolloutConfig``. ``ppo_trainer.yaml`` holds every field of this
tree with the same default (a test walks both), so a new field goes into both."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentloop.config import RolloutConfig
from trainer.config.actor import ActorConfig, ModelConfig, RefConfig
from trainer.config.async_training import AsyncTrainingConfig
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.config.run import AlgorithmConfig, TrainerConfig

__all__ = ["ActorRolloutRefConfig", "Config", "DataConfig", "ModelConfig"]


@dataclass(kw_only=True, slots=True)
class DataConfig:
    train_files: list[str] | str | None = None
    """Parquet or jsonl file(s) in the verl row layout."""
    val_files: list[str] | str | None = None
    prompt_key: str = "prompt"
    """Column holding the chat messages (a plain string becomes one user message)."""
    max_prompt_length: int = 1024
    """Prompt tokens, tool schemas included, above which a row is dropped (and counted)."""
    filter_overlong_prompts: bool = True
    return_raw_chat: bool = True
    """Hand agent loops the chat messages; required unless rows carry ``raw_prompt``."""
    train_batch_size: int = 8
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
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
    hybrid_engine: bool = True
    """GPU: servers sleep during the update and wake for the next rollout (colocated); False:
    servers keep their own GPUs (standalone). No effect on CPU."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass(kw_only=True, slots=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    custom_reward_function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)

"""``actor_rollout_ref.actor`` / ``.ref`` / ``.model``: the FSDP2 policy's own config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from trainer.algos import KL_TYPES, LOSS_AGG_MODES, PolicyLossConfig, loss_for

__all__ = [
    "ActorConfig",
    "prefix_trees_blocked",
    "CheckpointConfig",
    "FSDPConfig",
    "ModelConfig",
    "OptimConfig",
    "RefConfig",
]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    path: str
    """Model folder, ``agentloop-models`` asset name, or Hugging Face hub id (``org/name``:
    its snapshot in the hub cache, ``$HF_HUB_CACHE`` or ``$HF_HOME/hub``, downloaded unless
    ``HF_HUB_OFFLINE=1``). Resolved to a folder once at start-up
    (``trainer.models.resolve_model_config``); every consumer loads that folder."""
    tokenizer_path: str | None = None
    """Tokenizer folder, asset name or hub id, wherever the policy's tokenizer is loaded (data
    filtering, agent loops, the servers, rewards, checkpoint export); None: the model's."""
    custom_chat_template: str | None = None
    """Jinja chat template (or a template file's path) replacing the tokenizer's own wherever
    a chat is rendered: agent-loop prompts, prompt-length filtering, the servers' chat
    endpoint, SFT, and the exported checkpoint's tokenizer."""
    trust_remote_code: bool = False
    """Let transformers and vLLM run code shipped with the model and tokenizer."""
    external_lib: str | None = None
    """Module imported at start-up and in every trainer rank before the model loads (e.g. one
    registering a custom architecture with transformers' Auto classes)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    enable_activation_offload: bool = False
    """On GPU, keep the tensors the backward pass needs in pinned host memory instead of GPU
    memory (``torch.autograd.graph.save_on_cpu``); with gradient checkpointing only the
    checkpointed layer inputs move. No effect on CPU (they are there already)."""
    use_remove_padding: bool = True
    """Pack each micro-batch's samples into one sequence without padding (attention confined
    to each sample; ``trainer.workers.varlen_attention``), and count token budgets
    (``ppo_max_token_len_per_gpu``) in real tokens. False: rows padded to the micro-batch's
    longest."""
    attn_implementation: str = "sdpa"
    """transformers attention kernel of the trainer's model."""
    lora_rank: int = 0
    """LoRA rank: > 0 trains only a PEFT LoRA adapter on the frozen model (its optimizer state
    and checkpoints hold the adapter alone, the reference policy is the model with the adapter
    switched off, weight sync sends the adapter); 0: full-parameter training. With
    ``lora_adapter_path`` and 0 here, the adapter's own rank."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's update is ``lora_alpha / lora_rank * B @ A``."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get an adapter: ``all-linear`` (every linear layer but the LM head), a list
    of module-name suffixes (``[q_proj, v_proj]``) or one regex (PEFT's ``target_modules``)."""
    exclude_modules: str | list[str] | None = None
    """Modules never adapted: name suffixes or a regex (PEFT's ``exclude_modules``)."""
    lora_adapter_path: str | None = None
    """A PEFT adapter folder (``adapter_config.json`` + weights) to start from and keep
    training; its config then sets the rank, alpha and modules."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.model"
    """Where these keys live, for error messages (SFT: ``model``)."""

    def __post_init__(self) -> None:
        key = self.PREFIX
        if self.lora_rank < 0:
            raise ValueError(f"{key}.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if self.lora_alpha <= 0:
            raise ValueError(f"{key}.lora_alpha must be > 0, got {self.lora_alpha}")
        if not self.target_modules:
            raise ValueError(
                f"{key}.target_modules is empty: use all-linear or a list of module names "
                "(e.g. [q_proj, v_proj])"
            )
        if self.lora_adapter_path is None:
            return
        folder = Path(self.lora_adapter_path)
        if not (folder / "adapter_config.json").is_file():
            what = "has no adapter_config.json" if folder.is_dir() else "is not a folder"
            raise ValueError(
                f"{key}.lora_adapter_path={self.lora_adapter_path} {what}: point it at a PEFT "
                "adapter folder (what PeftModel.save_pretrained writes), or set it to null"
            )
        rank = json.loads((folder / "adapter_config.json").read_text()).get("r")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(
                f"{key}.lora_adapter_path={self.lora_adapter_path}: its adapter_config.json has "
                f"no LoRA rank (r={rank!r}); only LoRA adapters can be loaded"
            )
        if self.lora_rank == 0:
            self.lora_rank = rank  # verl's behaviour: the adapter says its rank
        elif self.lora_rank != rank:
            raise ValueError(
                f"{key}.lora_rank={self.lora_rank} but the adapter at {key}.lora_adapter_path "
                f"has rank {rank}: set {key}.lora_rank={rank} (or 0), or point "
                f"{key}.lora_adapter_path at a rank-{self.lora_rank} adapter"
            )

    @property
    def use_lora(self) -> bool:
        return self.lora_rank > 0


def prefix_trees_blocked(model: ModelConfig, padding_key: str) -> str | None:
    """What keeps ``shared_prefix`` trees from running on ``model`` (the key and its value), or
    None: they need packed rows (``padding_key``, the ``use_remove_padding`` in force) and the
    project's packed attention (sdpa or eager)."""
    if not model.use_remove_padding:
        return f"{padding_key}=false"
    if model.attn_implementation not in ("sdpa", "eager"):
        return f"actor_rollout_ref.model.attn_implementation={model.attn_implementation}"
    return None


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    lr_warmup_steps: int = 0
    """Linear warm-up from 0 over this many training steps (as in verl), then constant."""
    lr_warmup_steps_ratio: float = 0.0
    """With ``lr_warmup_steps=0``: warm up over this fraction of the run's training steps."""

    PREFIX: ClassVar[str] = "actor_rollout_ref.actor.optim"
    """Where these keys live, for error messages."""

    def __post_init__(self) -> None:
        key = self.PREFIX
        if self.lr <= 0:
            raise ValueError(f"{key}.lr must be > 0, got {self.lr}")
        if not 0 <= self.lr_warmup_steps_ratio <= 1:
            raise ValueError(
                f"{key}.lr_warmup_steps_ratio must be in [0, 1], got {self.lr_warmup_steps_ratio}"
            )
        if len(self.betas) != 2:
            raise ValueError(f"{key}.betas must be two numbers, got {self.betas}")


@dataclass(kw_only=True, slots=True)
class FSDPConfig:
    param_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory (FSDP2
    ``CPUOffloadPolicy``; GPU only, a no-op on CPU)."""
    reshard_after_forward: bool | None = None
    """True: free gathered parameters after each forward (ZeRO-3: a gather for the forward
    and another for the backward of every micro-batch). False: keep them gathered from an
    optimizer step's first forward to its last backward (ZeRO-2-like: one gather per
    optimizer step, one full copy of the parameters held). None: True on GPU, False on CPU,
    where gloo's gathers cost more than the host memory of that copy."""
    mixed_precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Compute dtype on GPU (master weights and gradient reduction stay fp32). CPU: fp32."""

    def reshards(self, device: str) -> bool:
        """``reshard_after_forward`` on ``device`` (``"cpu"`` or ``"cuda"``)."""
        if self.reshard_after_forward is None:
            return device != "cpu"
        return self.reshard_after_forward


SAVE_CONTENTS = ("model", "optimizer", "extra", "hf_model", "hf_merged")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    save_contents: list[str] = field(
        default_factory=lambda: ["model", "optimizer", "extra", "hf_model"]
    )
    """``model``/``optimizer`` (sharded, for resume; with LoRA the adapter and its optimizer
    state only), ``extra`` (step, data position), ``hf_model`` (``actor/huggingface``: a full
    transformers folder of the actor; with LoRA a PEFT adapter folder), ``hf_merged`` (LoRA
    only: ``actor/huggingface_merged``, a full transformers folder with the adapter merged)."""

    def __post_init__(self) -> None:
        bad = sorted(set(self.save_contents) - set(SAVE_CONTENTS))
        if bad:
            raise ValueError(
                f"actor.checkpoint.save_contents has unknown item {bad[0]!r}; "
                f"use {', '.join(SAVE_CONTENTS)}"
            )


@dataclass(kw_only=True, slots=True)
class PolicyLossSettings:
    """verl's ``actor.policy_loss`` block."""

    loss_mode: str = "vanilla"
    """vanilla | gspo | sapo | gpg | clip_cov | kl_cov | geo_mean | cispo, or a function of your
    own as package.module:function (``trainer.algos.policy_losses``)."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: the share of sampled tokens whose gradient is cut."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance of the tokens that may be cut."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of that covariance."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: the share of sampled tokens (highest covariance) that get the KL term."""
    ppo_kl_coef: float = 0.1
    """kl_cov: the coefficient of that |logp - logp_old| term."""

    def __post_init__(self) -> None:
        loss_for(self.loss_mode)  # an unknown name or an unimportable function fails here
        ratio = {"clip_cov": "clip_cov_ratio", "kl_cov": "kl_cov_ratio"}.get(self.loss_mode)
        if ratio is not None and not 0 < getattr(self, ratio) <= 1:
            raise ValueError(f"actor_rollout_ref.actor.policy_loss.{ratio} must be in (0, 1]")
        if self.loss_mode == "clip_cov" and self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                "actor_rollout_ref.actor.policy_loss.clip_cov_lb must be below clip_cov_ub"
            )


@dataclass(kw_only=True, slots=True)
class ActorConfig:
    strategy: Literal["fsdp2", "fsdp"] = "fsdp2"
    """Both names mean FSDP2 (``fully_shard``)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 8
    """Prompts per optimizer step (times rollout.n samples), as in verl."""
    cpu_cores: str | int | None = None
    """CPU only: cores the trainer ranks run on (``"1"``, ``"2-7"``), split evenly among the
    ranks (a core may be shared); null: every core, ``cpu_count // ranks`` threads each."""
    ppo_micro_batch_size_per_gpu: int = 2
    """Samples per forward/backward on one rank (ignored with use_dynamic_bsz)."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per forward when computing old/ref log-probs (None: ppo_micro_batch_size)."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count (``ppo_max_token_len_per_gpu``) instead of count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one micro-batch with use_dynamic_bsz (real tokens when packed)."""
    log_prob_max_token_len_per_gpu: int | None = None
    """Token budget of one old-log-prob forward (None: ppo_max_token_len_per_gpu)."""
    log_prob_chunk_size: int = 2048
    """Positions per LM-head chunk when computing log-probs/entropy: the full-vocabulary
    logits of a micro-batch are never held at once (recomputed in backward). 0: whole
    micro-batch logits at once."""
    ppo_epochs: int = 1
    shared_prefix: bool | None = None
    """Pack the samples of a micro-batch that start with the same tokens (a group's prompt, a
    session's segments up to their branch point) as a prefix tree: the shared tokens computed
    once in every pass (old and reference log-probs, critic values, the update), each sample's
    continuation attending to them. Exact: the same log-probs and gradients as unshared.
    Micro-batches keep such samples together and count tree tokens. Needs
    ``model.use_remove_padding`` and sdpa or eager attention (the padded path is unchanged);
    null: on wherever those hold."""
    recompute_old_log_prob: bool = False
    """False: a step that takes one optimizer step (one mini-batch, one PPO epoch, no KL in
    the reward) takes its old log-probs from the update's own forward, detached (the same
    weights, so the same numbers; the ratio is exactly 1), and skips the separate
    old-log-prob pass; True: that pass runs before every update, as in verl."""
    shuffle: bool = False
    """Shuffle samples before splitting into mini-batches (seeded by the step)."""
    skip_zero_advantage_rows: bool = True
    """The update skips the samples whose advantage is 0 on every token (a group that scored
    alike, under GRPO), whose gradient is exactly 0: the same step, without their forward and
    backward. Applies with a vanilla, gpg or cispo loss, token-mean, no entropy or KL-loss term
    and no rollout correction (``trainer.workers.inert``); elsewhere every sample is
    computed. ``actor/skipped_rows`` counts them."""
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    """Lower PPO clip (None: clip_ratio)."""
    clip_ratio_high: float | None = None
    """Upper PPO clip (None: clip_ratio); DAPO's clip-higher uses e.g. 0.28."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (> 1)."""
    loss_agg_mode: str = "token-mean"
    policy_loss: PolicyLossSettings = field(default_factory=PolicyLossSettings)
    """The policy loss (verl's ``policy_loss`` block; ``trainer.algos.policy_losses``)."""
    tau_pos: float = 1.0
    """SAPO's gate temperature where the advantage is positive (``loss_mode=sapo``)."""
    tau_neg: float = 1.05
    """SAPO's gate temperature elsewhere (``loss_mode=sapo``)."""
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    grad_clip: float = 1.0
    """Max global gradient norm (0 or less: no clipping)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"actor_rollout_ref.actor.loss_agg_mode={self.loss_agg_mode!r} is not "
                f"supported; use one of {', '.join(LOSS_AGG_MODES)}"
            )
        if self.kl_loss_type not in KL_TYPES:
            raise ValueError(
                f"actor_rollout_ref.actor.kl_loss_type={self.kl_loss_type!r} is not supported; "
                f"use one of {', '.join(KL_TYPES)}"
            )
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"actor_rollout_ref.actor.{name} must be >= 1")
        if self.clip_ratio_c <= 1:
            raise ValueError("actor_rollout_ref.actor.clip_ratio_c must be > 1")
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise ValueError("actor_rollout_ref.actor.tau_pos and tau_neg must be > 0")
        if self.ppo_max_token_len_per_gpu < 1:
            raise ValueError("actor_rollout_ref.actor.ppo_max_token_len_per_gpu must be >= 1")
        if (self.log_prob_max_token_len_per_gpu or 1) < 1:
            raise ValueError(
                "actor_rollout_ref.actor.log_prob_max_token_len_per_gpu must be >= 1 (or null)"
            )
        if self.log_prob_chunk_size < 0:
            raise ValueError(
                "actor_rollout_ref.actor.log_prob_chunk_size must be >= 0 (0: no chunking)"
            )

    @property
    def loss_constants(self) -> PolicyLossConfig:
        """What the policy loss reads of this config."""
        p = self.policy_loss
        return PolicyLossConfig(
            clip_ratio_low=self.clip_low,
            clip_ratio_high=self.clip_high,
            clip_ratio_c=self.clip_ratio_c,
            clip_cov_ratio=p.clip_cov_ratio,
            clip_cov_lb=p.clip_cov_lb,
            clip_cov_ub=p.clip_cov_ub,
            kl_cov_ratio=p.kl_cov_ratio,
            ppo_kl_coef=p.ppo_kl_coef,
            tau_pos=self.tau_pos,
            tau_neg=self.tau_neg,
        )

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    @property
    def log_prob_micro_batch_size(self) -> int:
        return self.log_prob_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu

    @property
    def log_prob_max_token_len(self) -> int:
        return self.log_prob_max_token_len_per_gpu or self.ppo_max_token_len_per_gpu


@dataclass(kw_only=True, slots=True)
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per forward of the reference policy (None: the actor's)."""
    log_prob_max_token_len_per_gpu: int | None = None
    """Token budget of one reference forward with use_dynamic_bsz (None: the actor's)."""
    param_offload: bool = False
    """Keep the reference's sharded parameters in CPU memory (GPU only; verl's spelling
    ``ref.fsdp_config.param_offload`` is the same key)."""

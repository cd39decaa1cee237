"""verl config keys that are not keys of ``ppo_trainer.yaml``, and what each does here.

Every key set by verl's example run scripts is one of:

- **honored**: a key of ``ppo_trainer.yaml`` with verl's meaning (no rule here), or an
  ``alias``: verl's other spelling of one of our keys (the value goes to ``target``);
- **warned**: accepted, with a one-time warning saying why it has no effect here;
- **refused**: a start-up error naming what to use instead.

A rule's ``ok`` values are the ones whose verl behaviour is exactly what happens here anyway
(``trainer.critic_warmup=0``, ``...optimizer_offload=False``): they are accepted silently.
``key`` may end in ``.*`` (the whole subtree) and use ``*`` for one path element.
docs/verl-migration.md holds the table for people; tests/unit/trainer/test_verl_keys.py keeps
the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

__all__ = ["ENGINE_KEYS", "RULES", "KeyRule", "markdown_table", "rule_for"]

Status = Literal["alias", "warn", "refuse"]


@dataclass(frozen=True, slots=True)
class KeyRule:
    key: str
    status: Status
    why: str = ""
    """warn: why it has no effect; refuse: what to use instead."""
    target: str = ""
    """alias: our key (a ``.*`` alias maps the subtree under it)."""
    ok: tuple[str, ...] = ()
    """Values (as written, case-insensitive) accepted silently: verl's behaviour is ours."""

    def matches(self, key: str) -> bool:
        """``key`` is this rule's key, or (for a ``.*`` rule) its subtree or the subtree's
        root (a config file may write the whole mapping)."""
        if self.key.endswith(".*"):
            root = self.key[:-2]
            return (
                key.startswith(f"{root}.") or fnmatchcase(key, self.key) or fnmatchcase(key, root)
            )
        return fnmatchcase(key, self.key)

    def alias_of(self, key: str) -> str:
        if self.key.endswith(".*"):
            return self.target + key[len(self.key) - 2 :]
        return self.target


NO_MEGATRON = "Megatron is not a backend here: the actor and reference are FSDP2 (strategy=fsdp2)"
MEGATRON_LORA = (
    "verl's Megatron LoRA block (Megatron module names); the FSDP2 actor here reads "
    "actor_rollout_ref.model.lora_rank, lora_alpha, target_modules (transformers names, "
    "e.g. all-linear), exclude_modules and lora_adapter_path"
)
NO_PROFILER = "no profiler is wired to the trainer here; run it under torch.profiler or nsys"
JUDGE = (
    "a model-based reward here is the judge: reward_model.judge.enable=True and "
    "reward_model.judge.model_path=<model>"
)
OFF = ("false", "0", "null", "none")


def _a(key: str, target: str) -> KeyRule:
    return KeyRule(key, "alias", target=target)


def _w(key: str, why: str, *ok: str) -> KeyRule:
    return KeyRule(key, "warn", why, ok=ok)


def _r(key: str, why: str, *ok: str) -> KeyRule:
    return KeyRule(key, "refuse", why, ok=ok)


ARR = "actor_rollout_ref"

ENGINE_KEYS = {
    "name": "backend",
    "tensor_model_parallel_size": "tensor_parallel_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_model_len": "max_model_len",
    "enforce_eager": "enforce_eager",
    "cpu_cores": "cpu_cores",
    "scheduling_policy": "scheduling_policy",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "weight_transfer": "weight_transfer",
}
"""verl's flat rollout keys of the servers' engine (``actor_rollout_ref.rollout.<key>``, as
its scripts write them; ``cpu_cores``, ``scheduling_policy`` and ``weight_transfer`` are ours,
as written before the engine node) and the ``servers.EngineConfig`` field each sets
(``actor_rollout_ref.rollout.engine.<field>``). verl's per-backend
``engine_kwargs.<name>`` tables are placed by ``trainer.config.verl.compat.place_engine_kwargs``
(only the running backend's is used)."""

_ENGINE = tuple(ENGINE_KEYS.items())
_VERL_ENGINE = set(ENGINE_KEYS) - {"cpu_cores", "scheduling_policy", "weight_transfer"}

RULES: tuple[KeyRule, ...] = (
    # ---- aliases: verl's other spelling of one of our keys ----------------------------------
    _a("data.max_response_length", f"{ARR}.rollout.response_length"),
    _a("data.trust_remote_code", f"{ARR}.model.trust_remote_code"),
    _a("data.apply_chat_template_kwargs.*", f"{ARR}.rollout.chat_template_kwargs"),
    _a(
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
        f"{ARR}.actor.log_prob_micro_batch_size_per_gpu",
    ),
    _a(
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
        f"{ARR}.actor.log_prob_max_token_len_per_gpu",
    ),
    _a(f"{ARR}.rollout.log_prob_use_dynamic_bsz", f"{ARR}.actor.use_dynamic_bsz"),
    _a(f"{ARR}.ref.log_prob_use_dynamic_bsz", f"{ARR}.actor.use_dynamic_bsz"),
    _a(f"{ARR}.ref.fsdp_config.param_offload", f"{ARR}.ref.param_offload"),
    _a(f"{ARR}.actor.optim.clip_grad", f"{ARR}.actor.grad_clip"),
    *(
        KeyRule(
            f"{ARR}.rollout.{key}",
            "alias",
            "" if key in _VERL_ENGINE else "this project's own key before the engine node",
            target=f"{ARR}.rollout.engine.{field}",
        )
        for key, field in _ENGINE
    ),
    *(
        KeyRule(
            f"{ARR}.rollout.engine_kwargs.{backend}.*",
            "alias",
            f"the table of the running backend (rollout.name) becomes {ARR}.rollout.engine."
            "engine_kwargs after composition; the other table is unused, as in verl",
            target=f"{ARR}.rollout.engine_kwargs.{backend}",
        )
        for backend in ("vllm", "sglang")
    ),
    _a(
        f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "trainer.weight_sync_bucket_mb",
    ),
    _r(
        f"{ARR}.rollout.checkpoint_engine.backend",
        "each server's weight route is picked by its node and engine here (shared-memory files "
        "on the trainer's node, else buckets; rollout.weight_transfer=nccl|ipc for vLLM's); "
        "for delta_sharded set trainer.weight_sync_delta.enable=True",
        "naive",
    ),
    _a(
        f"{ARR}.rollout.checkpoint_engine.engine_kwargs.delta_sharded.encoding",
        "trainer.weight_sync_delta.encoding",
    ),
    # ---- data ---------------------------------------------------------------------------------
    _w(
        "data.truncation",
        "prompts are never cut: data.filter_overlong_prompts=True drops those over "
        "data.max_prompt_length, otherwise one stops the rollout with an error",
        "error",
    ),
    _w("data.val_batch_size", "validation runs the whole val set as one batch", *OFF),
    _w("data.filter_overlong_prompts_workers", "prompts are filtered in the driver process"),
    _w("data.dataloader_num_workers", "rows are read once, in the driver process", "0"),
    _w("data.return_multi_modal_inputs", "rows are text-only here", *OFF),
    _r("data.image_key", "images are not supported here (text-only rows)", "images"),
    _r(
        "data.gen_batch_size",
        "dynamic sampling refills dropped groups from the stream: async_training.enable=True "
        "with algorithm.filter_groups.enable=True",
    ),
    # ---- actor / ref / model --------------------------------------------------------------------
    _w(
        f"{ARR}.actor.fsdp_config.optimizer_offload",
        f"optimizer state is offloaded together with the parameters by {ARR}.actor.fsdp_config."
        "param_offload=True (FSDP2 CPUOffloadPolicy), not on its own",
        *OFF,
    ),
    _w(f"{ARR}.*.fsdp_config.forward_prefetch", "FSDP2 prefetches on its own here", *OFF),
    _w(f"{ARR}.*.fsdp_config.use_orig_params", "an FSDP1 option; FSDP2 keeps the original params"),
    _w(
        f"{ARR}.*.fsdp_config.model_dtype",
        f"master weights are fp32; the compute dtype is {ARR}.actor.fsdp_config.mixed_precision",
    ),
    _w(
        f"{ARR}.model.torch_dtype",
        f"master weights are fp32; the compute dtype is {ARR}.actor.fsdp_config.mixed_precision",
    ),
    _r(
        f"{ARR}.*.fsdp_config.mixed_precision.*",
        f"set {ARR}.actor.fsdp_config.mixed_precision=bf16|fp16|fp32 (the compute dtype; "
        "gradients reduce in fp32)",
    ),
    _r(
        f"{ARR}.*.fsdp_config.fsdp_size",
        "ranks always shard over the whole world (no hybrid sharding)",
        "-1",
    ),
    _r(f"{ARR}.*.fsdp_config.strategy", NO_MEGATRON, "fsdp", "fsdp2"),
    _r(f"{ARR}.ref.strategy", NO_MEGATRON, "fsdp", "fsdp2"),
    _r(f"{ARR}.*.megatron.*", NO_MEGATRON),
    _w(f"{ARR}.*.use_torch_compile", "the actor runs eagerly (no torch.compile)", *OFF),
    _w(
        f"{ARR}.model.use_fused_kernels",
        f"log-probs come from the chunked LM head ({ARR}.actor.log_prob_chunk_size), which "
        "never holds full-vocabulary logits",
        *OFF,
    ),
    _w(f"{ARR}.model.fused_kernel_options.*", f"see {ARR}.model.use_fused_kernels"),
    _w(
        f"{ARR}.*.entropy_from_logits_with_chunking",
        f"log-probs and entropy are always computed in chunks ({ARR}.actor.log_prob_chunk_size;"
        " 0 turns chunking off)",
        "true",
    ),
    _w(
        f"{ARR}.*.entropy_checkpointing",
        "the chunked LM head always recomputes its logits in backward",
        "true",
    ),
    _r(
        f"{ARR}.*.ulysses_sequence_parallel_size",
        "sequence parallelism is not implemented: each rank holds whole samples (lower "
        f"{ARR}.actor.ppo_max_token_len_per_gpu or enable gradient checkpointing instead)",
        "1",
    ),
    _r(
        f"{ARR}.actor.ppo_micro_batch_size",
        f"the global micro-batch size is deprecated in verl too: set {ARR}.actor."
        "ppo_micro_batch_size_per_gpu",
    ),
    _r(
        f"{ARR}.*.log_prob_micro_batch_size",
        f"the global micro-batch size is deprecated in verl too: set {ARR}.actor."
        "log_prob_micro_batch_size_per_gpu",
    ),
    _r(
        f"{ARR}.actor.optim.lr_decay_style",
        "the learning rate is constant after warm-up",
        "constant",
    ),
    _r(f"{ARR}.actor.optim.override_optimizer_config.*", NO_MEGATRON),
    _r(f"{ARR}.actor.router_replay.*", "MoE router replay is not implemented"),
    _r(f"{ARR}.actor.use_prefix_grouper", "shared-prefix grouping is not implemented", *OFF),
    _r(f"{ARR}.actor.calculate_sum_pi_squared", "not implemented", *OFF),
    _r(f"{ARR}.actor.freeze_vision_tower", "vision models are not supported here", *OFF),
    _w(f"{ARR}.*.profiler.*", NO_PROFILER),
    _r(f"{ARR}.model.lora.*", MEGATRON_LORA),
    _w(f"{ARR}.model.use_shm", "models load from their folder (no shared-memory copy)", *OFF),
    _r(f"{ARR}.model.override_config.*", "edit the model folder's config.json instead"),
    _r(f"{ARR}.model.mtp.*", "multi-token prediction is not supported"),
    _w(f"{ARR}.nccl_timeout", "process groups use PyTorch's default timeout"),
    # ---- rollout --------------------------------------------------------------------------------
    _w(
        f"{ARR}.rollout.free_cache_engine",
        f"servers free their KV cache during the update whenever {ARR}.hybrid_engine=True on "
        "GPU, and never on CPU",
        "true",
    ),
    _w(f"{ARR}.rollout.multi_stage_wake_up", "servers wake weights and KV cache in one step", *OFF),
    _w(
        f"{ARR}.rollout.over_sample_rate",
        "a synchronous step waits for every sample; async_training.enable=True stops waiting "
        "on stragglers instead",
        "0",
        "0.0",
    ),
    _w(
        f"{ARR}.rollout.multi_turn.enable",
        "the row's agent_name (or rollout.agent.default_agent_loop) picks the loop; tool_agent "
        "is multi-turn",
        "true",
    ),
    _w(f"{ARR}.rollout.sglang_rollout_mode", "the rollout is always server-based here"),
    _w(f"{ARR}.rollout.server.*", "server timeouts are the recovery settings (rollout.recovery)"),
    _w(
        f"{ARR}.rollout.load_format",
        "servers load the model folder's weights at start and then receive the actor's",
    ),
    _w(
        f"{ARR}.rollout.layered_summon",
        "with LoRA only the adapter is gathered for weight sync (megabytes), one tensor at a "
        "time; there are no layers of full weights to summon",
        *OFF,
    ),
    _w(
        f"{ARR}.rollout.calculate_log_probs",
        "the engine's log-probs are always kept (algorithm.rollout_correction uses them)",
        "true",
    ),
    _w(f"{ARR}.rollout.disable_log_stats", "engine stats are not logged here", "true"),
    _w(f"{ARR}.rollout.skip_tokenizer_init", "servers take token ids; their tokenizer is unused"),
    _w(f"{ARR}.rollout.prometheus.*", "the servers export no Prometheus metrics here"),
    _r(
        f"{ARR}.rollout.data_parallel_size",
        f"rollout servers are data-parallel replicas: set {ARR}.rollout.num_servers",
        "1",
    ),
    _r(
        f"{ARR}.rollout.expert_parallel_size",
        f"pass engine settings through {ARR}.rollout.engine_kwargs.vllm.<name>",
        "1",
    ),
    _r(
        f"{ARR}.rollout.cudagraph_capture_sizes",
        f"set {ARR}.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes",
    ),
    _r(f"{ARR}.rollout.engine_kwargs.trtllm.*", "rollout engines here: rollout.name=vllm|sglang"),
    _r(
        f"{ARR}.rollout.enable_rollout_routing_replay",
        "MoE router replay is not implemented",
        *OFF,
    ),
    # ---- algorithm ------------------------------------------------------------------------------
    _r("algorithm.use_pf_ppo", "PF-PPO reweighting is not implemented", *OFF),
    _r("algorithm.pf_ppo.*", "PF-PPO reweighting is not implemented"),
    _a(
        "algorithm.rollout_correction.bypass_old_logprob_for_rollout",
        "algorithm.rollout_correction.bypass_mode",
    ),
    _r(
        "algorithm.rollout_correction.use_pure_rollout_correction",
        "set algorithm.rollout_correction.loss_type=reinforce (with bypass_mode=true)",
        *OFF,
    ),
    _r(
        "algorithm.rollout_correction.use_policy_gradient",
        "set algorithm.rollout_correction.loss_type=reinforce (with bypass_mode=true)",
        *OFF,
    ),
    # ---- critic, reward model, trainer ----------------------------------------------------------
    _r("critic.megatron.*", NO_MEGATRON),
    _w("critic.profiler.*", NO_PROFILER),
    _r(
        "critic.ulysses_sequence_parallel_size",
        "sequence parallelism is not implemented: each rank holds whole samples (lower "
        "critic.ppo_max_token_len_per_gpu or set critic.model.enable_gradient_checkpointing)",
        "1",
    ),
    _w(
        "critic.model.fsdp_config.optimizer_offload",
        "optimizer state is offloaded together with the parameters by critic.model.fsdp_config."
        "param_offload=True (FSDP2 CPUOffloadPolicy), not on its own",
        *OFF,
    ),
    _w("critic.rollout_n", "the critic's batches are rollout.n samples per prompt already"),
    _r(
        "critic.ppo_micro_batch_size",
        "the global micro-batch size is deprecated in verl too: set "
        "critic.ppo_micro_batch_size_per_gpu",
        *OFF,
    ),
    _r(
        "critic.forward_micro_batch_size",
        "the global micro-batch size is deprecated in verl too: set "
        "critic.forward_micro_batch_size_per_gpu",
        *OFF,
    ),
    _r("reward_model.model.*", JUDGE),
    _r("reward_model.rollout.*", JUDGE),
    _r("reward_model.micro_batch_size_per_gpu", JUDGE),
    _r("reward_model.num_workers", f"{JUDGE} (reward_model.judge.num_servers)"),
    _w("reward_model.use_reward_loop", "rewards are always computed as samples finish", "true"),
    _r(
        "reward_model.reward_kwargs.*",
        "keyword arguments of a reward function go in custom_reward_function.reward_kwargs",
    ),
    _r(
        "reward_model.sandbox_fusion.*",
        "run code with the python_exec tool, or score it in a verify hook (reward_model.verify)",
    ),
    _w(
        "trainer.log_val_generations",
        "validation samples are traced in MLflow with actor_rollout_ref.rollout.trace."
        "backend=mlflow, and written to files with trainer.validation_data_dir",
        "0",
    ),
    _w("trainer.use_legacy_worker_impl", "there is one worker implementation here"),
    _w("global_profiler.*", NO_PROFILER),
)


def rule_for(key: str) -> KeyRule | None:
    """The rule of a dotted key (the first that matches), or None for our own keys and
    unknown ones."""
    for rule in RULES:
        if rule.matches(key):
            return rule
    return None


def markdown_table() -> str:
    """The rules as docs/verl-migration.md shows them (``python -m trainer.config.verl.keys``
    prints it)."""
    lines = ["| verl key | here | why, or what to use instead |", "| --- | --- | --- |"]
    for rule in RULES:
        if rule.status == "alias":
            here = f"honored as `{rule.target}{'.*' if rule.key.endswith('.*') else ''}`"
        else:
            here = "warned" if rule.status == "warn" else "refused"
            if rule.ok:
                quiet = ", ".join(f"`{v}`" for v in rule.ok)
                here += f" (silent for {quiet})" if rule.status == "warn" else f" (ok: {quiet})"
        lines.append(f"| `{rule.key}` | {here} | {rule.why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown_table())

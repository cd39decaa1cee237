"""verl's training-step metric names beside ours, so a verl dashboard carries over: the one
place that maps our names to theirs.

- Already under verl's name (nothing to do): ``actor/pg_loss``, ``actor/pg_clipfrac``,
  ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``, ``actor/kl_loss``, ``actor/entropy``,
  ``actor/grad_norm``, ``actor/lr``, ``critic/advantages/{mean,max,min}`` and the phase
  timings ``timing_s/{gen,reward,old_log_prob,ref,adv,update_actor,step}`` (``SAME_NAMES``).
- Copied under verl's name (``VERL_NAMES``, identical meaning): ``training/step`` ->
  ``training/global_step``, ``perf/total_tokens`` -> ``perf/total_num_tokens``,
  ``timing_s/step`` -> ``perf/time_per_step``, ``agent_loop/num_turns/*`` -> ``num_turns/*``
  (verl counts messages, as we do).
- Computed from the batch tensors (``data_metrics``, ``step_metrics``):
  ``critic/score/*`` (the sum of a sample's token-level reward before the KL penalty: the
  score plus process rewards), ``critic/rewards/*`` (after it), both over samples with a
  non-empty response; ``critic/returns/*`` for ``grpo``/``rloo``, whose returns are the
  advantages (not logged for ``reinforce_plus_plus``, whose returns we do not keep);
  ``response_length/{mean,max,min,clip_ratio}`` (model and tool tokens; clipped = the whole
  ``response_length``), ``prompt_length/*`` likewise, ``response/aborted_ratio`` (empty
  responses); ``timing_per_token_ms/gen`` (per response token) and ``/{ref,adv,update_actor}``
  (per prompt and response token); ``perf/throughput`` (tokens / step seconds / trainer
  ranks); ``training/epoch``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = [
    "SAME_NAMES",
    "VERL_NAMES",
    "data_metrics",
    "memory_metrics",
    "step_metrics",
    "verl_names",
]

VERL_NAMES: dict[str, str] = {
    "training/step": "training/global_step",
    "perf/total_tokens": "perf/total_num_tokens",
    "timing_s/step": "perf/time_per_step",
    "agent_loop/num_turns/mean": "num_turns/mean",
    "agent_loop/num_turns/max": "num_turns/max",
    "agent_loop/num_turns/min": "num_turns/min",
}
"""Our name -> verl's, for metrics whose meaning is the same."""

SAME_NAMES: tuple[str, ...] = (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
)
"""Metrics we log under verl's own name (``actor/kl_loss`` with ``use_kl_loss``,
``timing_s/ref`` with a reference policy, ``timing_s/old_log_prob`` and ``actor/entropy``
unless the engine's log-probs are used)."""

_RETURNS_ARE_ADVANTAGES = (
    "grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
    "opo",
    "grpo_passk",
    "gpg",
)
_PER_TOKEN = ("ref", "adv", "update_actor")  # timed phases verl divides by all tokens


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def _lengths(attention_mask: torch.Tensor, prompt_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch] prompt and response tokens of each sample."""
    return attention_mask[:, :prompt_width].sum(-1), attention_mask[:, prompt_width:].sum(-1)


def verl_names(metrics: Mapping[str, float]) -> dict[str, float]:
    """Our metrics of ``VERL_NAMES`` under verl's names."""
    return {verl: metrics[ours] for ours, verl in VERL_NAMES.items() if ours in metrics}


def data_metrics(
    *,
    attention_mask: torch.Tensor,
    prompt_width: int,
    scores: torch.Tensor,
    token_scores: torch.Tensor | None,
    token_rewards: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    estimator: str,
) -> dict[str, float]:
    """verl's ``critic/*``, ``response_length/*``, ``prompt_length/*`` of a scored, updated
    batch. ``attention_mask``: [batch, prompt_width + response_length]; ``scores``: [batch];
    ``token_scores``/``token_rewards``: [batch, response_length] token-level reward before
    and after the KL penalty (None: the score alone); ``advantages``: [batch,
    response_length]."""
    prompt_len, response_len = _lengths(attention_mask, prompt_width)
    kept = response_len > 0  # verl leaves aborted (empty) responses out of score and reward
    score = token_scores.sum(-1) if token_scores is not None else scores
    reward = token_rewards.sum(-1) if token_rewards is not None else score
    out = _stats("critic/score", score[kept]) | _stats("critic/rewards", reward[kept])
    if estimator in _RETURNS_ARE_ADVANTAGES:
        out |= _stats("critic/returns", advantages[response_mask.bool()])
    for name, lengths, width in (
        ("response_length", response_len, attention_mask.shape[1] - prompt_width),
        ("prompt_length", prompt_len, prompt_width),
    ):
        out |= _stats(name, lengths)
        out[f"{name}/clip_ratio"] = float((lengths == width).float().mean())
    out["response/aborted_ratio"] = float((~kept).float().mean())
    return out


def step_metrics(
    metrics: Mapping[str, float],
    *,
    attention_mask: torch.Tensor,
    prompt_width: int,
    epoch: int,
    n_gpus: int,
) -> dict[str, float]:
    """verl's names of a finished step's metrics (``timing_s/step`` set): the copies of
    ``VERL_NAMES``, per-token timings, ``perf/throughput`` and ``training/epoch``."""
    prompt_len, response_len = _lengths(attention_mask, prompt_width)
    response_tokens = float(response_len.sum())
    all_tokens = response_tokens + float(prompt_len.sum())
    out = verl_names(metrics)
    if "timing_s/gen" in metrics and response_tokens:
        out["timing_per_token_ms/gen"] = metrics["timing_s/gen"] * 1000 / response_tokens
    for phase in _PER_TOKEN:
        if f"timing_s/{phase}" in metrics and all_tokens:
            out[f"timing_per_token_ms/{phase}"] = metrics[f"timing_s/{phase}"] * 1000 / all_tokens
    out["perf/throughput"] = all_tokens / max(metrics["timing_s/step"] * n_gpus, 1e-9)
    out["training/epoch"] = float(epoch)
    return out


def memory_metrics(ranks: list[dict[str, float]]) -> dict[str, float]:
    """The trainer ranks' memory after the update (``FSDPWorker.memory_stats``), the largest
    rank's: ``perf/cpu_memory_used_gb`` (peak RSS, verl's name), ``perf/actor_state_mb`` and,
    with a critic, ``perf/critic_state_mb`` (each model's shard of its trainable parameters,
    their gradients and the optimizer state)."""
    if not ranks:
        return {}
    out = {
        "perf/cpu_memory_used_gb": max(r["peak_rss_mb"] for r in ranks) / 1024,
        "perf/actor_state_mb": max(
            r["trainable_mb"] + r["grad_mb"] + r["optimizer_mb"] for r in ranks
        ),
    }
    if "critic_trainable_mb" in ranks[0]:
        out["perf/critic_state_mb"] = max(
            2 * r["critic_trainable_mb"] + r["critic_optimizer_mb"] for r in ranks
        )
    return out

"""RL algorithms on padded response tensors: advantage estimators (``estimators``), policy
losses (``policy_losses``), the math they share (``core``: aggregation, KL, entropy; ``groups``:
group statistics under sample weights) and rollout correction's importance weights
(``correction``)."""

from trainer.algos.core import (
    KL_TYPES,
    LOSS_AGG_MODES,
    agg_denominator,
    agg_loss,
    agg_numerator,
    apply_kl_in_reward,
    entropy_from_logits,
    gae_advantages,
    grpo_advantages,
    import_callable,
    kl_penalty,
    masked_whiten,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    scores_to_token_rewards,
)
from trainer.algos.correction import CorrectionSpec, correct, mismatch_metrics, weight_metrics
from trainer.algos.estimators import (
    ADV_ESTIMATORS,
    GROUPED,
    AdvantageInputs,
    compute_advantages,
    estimator_for,
)
from trainer.algos.groups import ONE_SAMPLE, group_index, group_stats, sample_weights
from trainer.algos.policy_losses import (
    FIXED_AGG,
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossOut,
    fixed_agg,
    loss_for,
    policy_loss,
    policy_loss_tokens,
)

__all__ = [
    "ADV_ESTIMATORS",
    "FIXED_AGG",
    "GROUPED",
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "ONE_SAMPLE",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "PolicyLossConfig",
    "PolicyLossOut",
    "agg_denominator",
    "agg_loss",
    "agg_numerator",
    "apply_kl_in_reward",
    "compute_advantages",
    "CorrectionSpec",
    "correct",
    "mismatch_metrics",
    "weight_metrics",
    "entropy_from_logits",
    "estimator_for",
    "fixed_agg",
    "gae_advantages",
    "grpo_advantages",
    "group_index",
    "group_stats",
    "import_callable",
    "kl_penalty",
    "loss_for",
    "masked_whiten",
    "policy_loss",
    "policy_loss_tokens",
    "reinforce_plus_plus_advantages",
    "rloo_advantages",
    "sample_weights",
    "scores_to_token_rewards",
]

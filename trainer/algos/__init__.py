"""RL algorithms on padded response tensors: advantage estimators (``estimators``), policy
losses (``policy_losses``) and the math they share (``core``: aggregation, KL, entropy)."""

from trainer.algos.core import (
    KL_TYPES,
    LOSS_AGG_MODES,
    agg_denominator,
    agg_loss,
    agg_numerator,
    apply_kl_in_reward,
    entropy_from_logits,
    grpo_advantages,
    import_callable,
    kl_penalty,
    masked_whiten,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    scores_to_token_rewards,
)
from trainer.algos.estimators import (
    ADV_ESTIMATORS,
    GROUPED,
    AdvantageInputs,
    compute_advantages,
    estimator_for,
)
from trainer.algos.policy_losses import (
    FIXED_AGG,
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossOut,
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
    "POLICY_LOSSES",
    "AdvantageInputs",
    "PolicyLossConfig",
    "PolicyLossOut",
    "agg_denominator",
    "agg_loss",
    "agg_numerator",
    "apply_kl_in_reward",
    "compute_advantages",
    "entropy_from_logits",
    "estimator_for",
    "grpo_advantages",
    "import_callable",
    "kl_penalty",
    "loss_for",
    "masked_whiten",
    "policy_loss",
    "policy_loss_tokens",
    "reinforce_plus_plus_advantages",
    "rloo_advantages",
    "scores_to_token_rewards",
]

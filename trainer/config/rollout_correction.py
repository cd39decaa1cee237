"""``algorithm.rollout_correction``: verl's rollout-correction keys (importance weights,
rejection criteria, the veto, bypass mode and its loss), with ``mode`` for the named presets
(the old ``tis`` / ``decoupled`` and OpenRLHF's ``icepop`` / ``seq_mask_tis``). The math is
``trainer.algos.correction``; ``spec`` resolves the keys into it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainer.algos.correction import (
    IS_LEVELS,
    RS_LEGACY,
    RS_OPTIONS,
    CorrectionSpec,
    Rejection,
)
from trainer.config import warn_no_effect

__all__ = ["CORRECTION_MODES", "LOSS_TYPES", "RolloutCorrectionConfig"]

CORRECTION_MODES = ("none", "tis", "decoupled", "icepop", "seq_mask_tis")
LOSS_TYPES = ("ppo_clip", "reinforce")
KEY = "algorithm.rollout_correction"

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class RolloutCorrectionConfig:
    rollout_is: str | None = None
    """Importance weights: ``token`` (min(r_t, threshold) per token), ``sequence`` (the
    sample's product of ratios, truncated, on all its tokens) or null (none)."""
    rollout_is_threshold: float | str = 2.0
    """The weights' truncation; ``"lower_upper"`` (e.g. ``"0.5_2.0"``, IcePop): weights
    outside [lower, upper] are 0 instead."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (mean 1)."""
    rollout_rs: str | None = None
    """Rejection criteria, comma-joined, all must hold: ``token_k1`` / ``seq_sum_k1`` /
    ``seq_mean_k1`` (the ratio per token, of the sample, its geometric mean within
    [lower, upper]), ``token_k2|k3``, ``seq_sum_k2|k3``, ``seq_mean_k2|k3``, ``seq_max_k2|k3``
    (0.5 (log r)^2, or r - 1 - log r, at most the bound); verl's older ``token``,
    ``sequence``, ``geometric`` too. A token or sample that fails leaves the loss."""
    rollout_rs_threshold: float | str | None = None
    """Each criterion's bound, comma-joined in the same order (one value serves all): k1
    ``"lower_upper"`` or an upper ratio bound; k2/k3 an upper bound. null: the upper bound of
    ``rollout_is_threshold``."""
    rollout_rs_threshold_lower: float | None = None
    """The k1 criteria's lower bound where their threshold gives only the upper (null: 1 /
    upper; 0: none)."""
    rollout_token_veto_threshold: float | None = None
    """A sample with a token whose ratio is below this leaves the loss (null: no veto)."""
    bypass_mode: bool = False
    """The engine's log-probs are the old policy's (no recompute; the PPO ratio is
    pi_theta / pi_rollout); ratios for rejection are the current policy's."""
    loss_type: str = "ppo_clip"
    """Bypass mode's loss: ``ppo_clip`` (PPO's) or ``reinforce`` (-w x A x log pi with the
    importance weights w, no clipping)."""
    mode: str = "none"
    """A named preset instead of the keys above: ``tis`` (token weights truncated at
    ``clip``), ``decoupled`` (AReaL's: token weights, tokens above ``clip`` rejected),
    ``icepop`` (token weights, 0 outside [1 / clip, clip]), ``seq_mask_tis`` (token weights
    truncated at ``clip``, samples whose geometric mean ratio is outside [1 / clip, clip]
    rejected); ``none``: the keys above."""
    clip: float = 2.0
    """The presets' threshold."""

    def __post_init__(self) -> None:
        if self.mode not in CORRECTION_MODES:
            raise ValueError(
                f"{KEY}.mode={self.mode!r} is not supported; use one of "
                f"{', '.join(CORRECTION_MODES)}"
            )
        if self.clip <= 1.0:
            raise ValueError(
                f"{KEY}.clip={self.clip} must be > 1 (a weight cap at or below 1 removes "
                "every token the engine found likelier than the trainer)"
            )
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ValueError(
                f"{KEY}.rollout_is={self.rollout_is!r} is not supported; use one of "
                f"{', '.join(IS_LEVELS)} or null"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"{KEY}.loss_type={self.loss_type!r} is not supported; use one of "
                f"{', '.join(LOSS_TYPES)}"
            )
        veto = self.rollout_token_veto_threshold
        if veto is not None and not 0 < veto < 1:
            raise ValueError(
                f"{KEY}.rollout_token_veto_threshold={veto} must be in (0, 1) (a token that "
                "many times less likely under the trainer than under the engine vetoes its "
                "sample; e.g. 1e-4)"
            )
        if self.mode != "none" and (self.rollout_is is not None or self.rollout_rs is not None):
            raise ValueError(
                f"{KEY}.mode={self.mode} is a preset of rollout_is / rollout_rs: set either "
                f"{KEY}.mode or {KEY}.rollout_is / rollout_rs, not both"
            )
        if self.loss_type == "reinforce" and not self.bypass_mode:
            raise ValueError(
                f"{KEY}.loss_type=reinforce is bypass mode's loss: set {KEY}.bypass_mode=true"
            )
        spec = self.spec  # parses the thresholds and criteria (their errors name the key)
        if self.bypass_mode and spec.rollout_is and not spec.applies_weights:
            warn_no_effect(
                logger,
                f"{KEY}.rollout_is",
                spec.rollout_is,
                "on the loss with bypass_mode=true and loss_type=ppo_clip (the PPO ratio is "
                "already pi_theta / pi_rollout): the weights are only measured "
                "(rollout_corr/rollout_is_*), as in verl",
            )

    @property
    def spec(self) -> CorrectionSpec:
        """The keys (or the preset) resolved for ``trainer.algos.correction``."""
        clip = self.clip
        if self.mode == "tis":
            rollout_is, (is_lower, is_upper), rejections = "token", (None, clip), ()
        elif self.mode == "decoupled":
            rollout_is, (is_lower, is_upper) = "token", (None, clip)
            rejections = (Rejection("token_k1", clip, 0.0),)
        elif self.mode == "icepop":
            rollout_is, (is_lower, is_upper), rejections = "token", (1.0 / clip, clip), ()
        elif self.mode == "seq_mask_tis":
            rollout_is, (is_lower, is_upper) = "token", (None, clip)
            rejections = (Rejection("seq_mean_k1", clip, 1.0 / clip),)
        else:
            rollout_is = self.rollout_is
            is_lower, is_upper = _bounds(self.rollout_is_threshold, "rollout_is_threshold")
            rejections = self._rejections(is_upper)
        return CorrectionSpec(
            rollout_is=rollout_is,
            is_threshold=is_upper,
            is_lower=is_lower,
            batch_normalize=self.rollout_is_batch_normalize,
            rejections=rejections,
            veto=self.rollout_token_veto_threshold,
            bypass=self.bypass_mode,
            loss_type=self.loss_type,
        )

    def _rejections(self, is_upper: float) -> tuple[Rejection, ...]:
        if self.rollout_rs is None or str(self.rollout_rs).strip().lower() in ("", "none", "null"):
            return ()
        options = [o.strip() for o in str(self.rollout_rs).split(",")]
        for option in options:
            if RS_LEGACY.get(option, option) not in RS_OPTIONS:
                raise ValueError(
                    f"{KEY}.rollout_rs={self.rollout_rs!r}: {option!r} is not a criterion; use "
                    f"{', '.join(RS_OPTIONS)} (or token, sequence, geometric), comma-joined"
                )
        given = self.rollout_rs_threshold
        texts = [is_upper] if given is None else [t.strip() for t in str(given).split(",")]
        if len(texts) not in (1, len(options)):
            raise ValueError(
                f"{KEY}.rollout_rs_threshold={given!r} gives {len(texts)} bounds for "
                f"{len(options)} criteria ({self.rollout_rs}): give one, or one per criterion"
            )
        if len(texts) == 1:
            texts = texts * len(options)
        out = []
        for option, text in zip(options, texts, strict=True):
            name = RS_LEGACY.get(option, option)
            lower, upper = _bounds(text, "rollout_rs_threshold")
            if name.endswith("_k1"):
                if lower is None:
                    lower = self.rollout_rs_threshold_lower
                if lower is not None and lower >= upper:
                    raise ValueError(
                        f"{KEY}.rollout_rs_threshold_lower={lower} must be below the upper "
                        f"bound {upper} of {name}"
                    )
            elif lower is not None:
                raise ValueError(
                    f"{KEY}.rollout_rs_threshold={given!r}: {name} bounds a divergence from "
                    "above only; give it one number"
                )
            out.append(Rejection(name, upper, lower))
        return tuple(out)


def _bounds(value: float | str, name: str) -> tuple[float | None, float]:
    """``2.0`` -> (None, 2.0); ``"0.5_2.0"`` -> (0.5, 2.0); refuses anything else."""
    text = str(value).strip()
    parts = text.split("_") if "_" in text else [text]
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    ordered = len(numbers) == 1 or (len(numbers) == 2 and 0 <= numbers[0] < numbers[1])
    if not numbers or not ordered or numbers[-1] <= 0:
        raise ValueError(
            f"{KEY}.{name}={value!r} must be a positive number or 'lower_upper' with "
            "0 <= lower < upper (e.g. 2.0 or '0.5_2.0')"
        )
    return (numbers[0] if len(numbers) == 2 else None), numbers[-1]

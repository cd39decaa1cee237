"""The policy's math on one rank: log-probs/entropy of given tokens and the PPO update over
micro-batches. Plain functions of a ``torch.nn.Module``, so the same code runs on an FSDP2
shard (inside ``FSDPWorker``) and on a whole model in one process (tests compare the two).

Loss normalisation across micro-batches and ranks: each micro-batch contributes
``agg_numerator / agg_denominator(whole mini-batch)``, so the sum over micro-batches and ranks
is exactly the mini-batch ``agg_loss``. FSDP averages gradients over ranks, hence the factor
``world_size`` on each rank's loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import torch

from trainer.algos import (
    PolicyLossConfig,
    agg_denominator,
    agg_numerator,
    fixed_agg,
    kl_penalty,
    loss_for,
)
from trainer.algos.correction import CorrectionSpec, correct, token_mismatch
from trainer.config.actor import ActorConfig
from trainer.workers.batch import TrainBatch
from trainer.workers.dist import (
    all_reduce_floats,
    clip_and_step,
    keeps_gathered,
    micro_batch_groups,
    without_idle_groups,
    world_size,
)
from trainer.workers.log_prob_head import (
    LogProbRequest,
    install_log_prob_head,
    scaled_logits,
    token_log_probs,
)
from trainer.workers.packing import ModelInput, model_input, scatter_rows
from trainer.workers.prefix_tree import MIN_SHARED, real_rows, tree_tokens
from trainer.workers.varlen_attention import enable_packed_attention, guard_padded_attention

__all__ = [
    "LossSpec",
    "OwnLogProbs",
    "accumulate_gradients",
    "epoch_mini_batches",
    "forward_log_probs",
    "global_denominator",
    "log_probs_in_micro_batches",
    "model_kwargs",
    "update_policy",
]


def model_kwargs(model: torch.nn.Module, inputs: ModelInput, device: torch.device) -> dict:
    """The forward's keyword arguments for a packed or padded ``inputs``; a packed input
    switches ``model`` to per-sample attention (sdpa/eager -> packed attention; flash and
    flex kernels read the restarting positions themselves), a padded one an sdpa model to the
    same attention for its guarded mask (``guard_padded_attention``)."""
    kwargs: dict = {
        "input_ids": inputs.input_ids.to(device),
        "position_ids": inputs.position_ids.to(device),
        "use_cache": False,
    }
    if inputs.attention_mask is not None:
        guard_padded_attention(model)
        kwargs["attention_mask"] = inputs.attention_mask.to(device)
    elif enable_packed_attention(model):
        kwargs["agentloop_tree"] = inputs.tree
    elif inputs.tree is not None and inputs.tree.shares:
        raise ValueError(
            "shared_prefix (actor_rollout_ref.actor / critic) needs the project's packed "
            f"attention, but the model runs {model.config._attn_implementation!r}: set "
            "actor_rollout_ref.model.attn_implementation=sdpa, or shared_prefix=false"
        )
    return kwargs


def forward_log_probs(
    model: torch.nn.Module,
    mb: TrainBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    remove_padding: bool = True,
    chunk_size: int = 2048,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [mb, r] (and entropy) of the sampled response tokens of a trimmed
    micro-batch; 0 where ``response_mask`` is 0.

    ``remove_padding``: the rows packed into one sequence (``trainer.workers.packing``);
    ``shared_prefix``: as a prefix tree (``trainer.workers.prefix_tree``).
    ``chunk_size`` > 0: log-probs from the LM head ``chunk_size`` positions at a time
    (``trainer.workers.log_prob_head``); 0: full-vocabulary logits."""
    device = next(model.parameters()).device
    inputs = model_input(mb, packed=remove_padding, shared_prefix=shared_prefix)
    targets = inputs.targets
    positions, tokens = targets.positions.to(device), targets.tokens.to(device)
    kwargs = model_kwargs(model, inputs, device)
    kwargs["logits_to_keep"] = inputs.logits_to_keep
    head = install_log_prob_head(model) if chunk_size > 0 else None
    if head is not None:
        head.request = LogProbRequest(positions, tokens, temperature, chunk_size, with_entropy)
        try:
            out = model(**kwargs).logits  # [k, 2]
        finally:
            head.request = None
        log_probs, entropy = out[:, 0], (out[:, 1] if with_entropy else None)
    else:
        logits = model(**kwargs).logits
        logits = logits.reshape(-1, logits.shape[-1]).index_select(0, positions)
        z = scaled_logits(logits, temperature)
        log_probs, entropy, _ = token_log_probs(z, tokens, with_entropy)
    shape = (len(mb), mb.response_length)
    return (
        scatter_rows(log_probs, targets, shape),
        None if entropy is None else scatter_rows(entropy, targets, shape),
    )


@torch.no_grad()
def log_probs_in_micro_batches(
    model: torch.nn.Module,
    batch: TrainBatch,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    use_dynamic_bsz: bool = False,
    max_token_len: int = 16384,
    remove_padding: bool = True,
    chunk_size: int = 2048,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [batch, R] (0 where ``response_mask`` is 0) and entropy of the whole
    (rank-local) batch. ``remove_padding``/``chunk_size``/``shared_prefix``: see
    ``forward_log_probs``."""
    r = batch.response_length
    log_probs = torch.zeros(len(batch), r, dtype=torch.float32)
    entropy = torch.zeros(len(batch), r, dtype=torch.float32) if with_entropy else None
    groups = micro_batch_groups(
        batch,
        micro_batch_size,
        use_dynamic_bsz,
        max_token_len,
        packed=remove_padding,
        shared=remove_padding and shared_prefix,
    )
    for idx in groups:
        mb = batch.select(idx).trimmed()
        lp, ent = forward_log_probs(
            model,
            mb,
            temperature=temperature,
            with_entropy=with_entropy,
            remove_padding=remove_padding,
            chunk_size=chunk_size,
            shared_prefix=shared_prefix,
        )
        width = lp.shape[1]
        log_probs[idx, :width] = lp.float().cpu()
        if entropy is not None and ent is not None:
            entropy[idx, :width] = ent.float().cpu()
    return log_probs, entropy


def global_denominator(
    mask: torch.Tensor,
    mode: str,
    response_length: int,
    weights: torch.Tensor | None = None,
    stand_in: torch.Tensor | None = None,
) -> float:
    """``agg_denominator`` of a mini-batch whose rows are spread over all ranks (``weights``:
    the rows' sample weights, which the ``seq-mean-*`` modes count; ``stand_in``: the tokens
    of skipped rows, ``TrainBatch.stand_in_tokens``, which ``token-mean`` counts)."""
    value = agg_denominator(mask, mode, response_length, weights)
    if stand_in is not None and bool(stand_in.any()):
        if mode != "token-mean":
            raise ValueError(
                f"rows were skipped (stand_in_tokens), which only loss_agg_mode=token-mean "
                f"counts; this update normalises with {mode!r}"
            )
        value += float(stand_in.sum())
    if mode != "seq-mean-token-sum-norm":  # that one is a constant, not a count
        value = all_reduce_floats([value])[0]
    return value


def accumulate_gradients(
    model: torch.nn.Module,
    batch: TrainBatch,
    groups: list[torch.Tensor],
    loss_fn: Callable[[TrainBatch], tuple[torch.Tensor, dict[str, float]]],
    rows: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, float]:
    """Backward of ``loss_fn`` on every (trimmed) micro-batch ``groups`` of ``batch``;
    gradients are reduced across ranks only after the last one. Returns the micro-batches'
    statistics summed (this rank's). ``rows``: told each micro-batch's row indices before
    its loss is built (``OwnLogProbs.at``). An FSDP2 model that keeps its parameters gathered
    after the forward (``keeps_gathered``) keeps them until the last backward, so the
    micro-batches after the first gather nothing."""
    sums: dict[str, float] = {}
    keep = keeps_gathered(model)
    for k, idx in enumerate(groups):
        last = k == len(groups) - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        if keep:
            model.set_reshard_after_backward(last)
        if rows is not None:
            rows(idx)
        loss, stats = loss_fn(batch.select(idx).trimmed())
        loss.backward()
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value
    return sums


@dataclass(slots=True)
class OwnLogProbs:
    """The old log-probs and entropy [rows, R] an on-policy update takes from its own
    forward (one optimizer step: every row's forward runs at the weights the rollout's old
    policy has), detached; filled by ``update_policy``, 0 where ``response_mask`` is 0."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    rows: torch.Tensor | None = None
    """The micro-batch being computed (its row indices)."""

    @classmethod
    def zeros(cls, rows: int, response_length: int) -> OwnLogProbs:
        return cls(
            torch.zeros(rows, response_length, dtype=torch.float32),
            torch.zeros(rows, response_length, dtype=torch.float32),
        )

    def at(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def keep(self, log_probs: torch.Tensor, entropy: torch.Tensor) -> None:
        """One trimmed micro-batch's values, into its rows."""
        assert self.rows is not None
        width = log_probs.shape[1]
        self.log_probs[self.rows, :width] = log_probs.detach().float().cpu()
        self.entropy[self.rows, :width] = entropy.detach().float().cpu()


@dataclass(frozen=True, slots=True)
class LossSpec:
    """What the update minimises (from ``ActorConfig`` and the rollout temperature)."""

    clip_low: float
    clip_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    temperature: float = 1.0
    remove_padding: bool = True
    shared_prefix: bool = False
    """Packed micro-batches as prefix trees (``ActorConfig.shared_prefix``)."""
    chunk_size: int = 2048
    correction: CorrectionSpec = CorrectionSpec()
    """Rollout correction (``algorithm.rollout_correction`` resolved)."""
    loss_mode: str = "vanilla"
    """``actor.policy_loss.loss_mode`` (``trainer.algos.policy_losses``)."""
    constants: PolicyLossConfig = PolicyLossConfig()
    fixed_agg_mode: str | None = None
    """The aggregation the loss fixes for itself (gspo, sapo, geo_mean; ``fixed_agg``)."""

    @property
    def pg_agg_mode(self) -> str:
        """The policy term's aggregation: the loss's own, else ``loss_agg_mode``."""
        return self.fixed_agg_mode or self.loss_agg_mode

    @classmethod
    def from_config(
        cls,
        cfg: ActorConfig,
        temperature: float = 1.0,
        correction: CorrectionSpec | None = None,
        remove_padding: bool = True,
    ) -> LossSpec:
        return cls(
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            clip_ratio_c=cfg.clip_ratio_c,
            loss_agg_mode=cfg.loss_agg_mode,
            entropy_coeff=cfg.entropy_coeff,
            use_kl_loss=cfg.use_kl_loss,
            kl_loss_coef=cfg.kl_loss_coef,
            kl_loss_type=cfg.kl_loss_type,
            temperature=temperature,
            remove_padding=remove_padding,
            shared_prefix=remove_padding and bool(cfg.shared_prefix),
            chunk_size=cfg.log_prob_chunk_size,
            correction=correction or CorrectionSpec(),
            loss_mode=cfg.policy_loss.loss_mode,
            constants=cfg.loss_constants,
            fixed_agg_mode=fixed_agg(cfg.policy_loss.loss_mode),
        )


def _micro_loss(
    model: torch.nn.Module,
    mb: TrainBatch,
    spec: LossSpec,
    denominator: float,
    scale: float,
    pg_denominator: float | None = None,
    own: OwnLogProbs | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Backward-ready loss of one trimmed micro-batch and its summed statistics.
    ``denominator``: the mini-batch's normaliser under ``loss_agg_mode`` (entropy and KL
    terms); ``pg_denominator``: under ``spec.pg_agg_mode`` (None: the same). ``own``: the
    old log-probs are this forward's, detached, and are kept there with the entropy (the
    batch has none)."""
    pg_denominator = denominator if pg_denominator is None else pg_denominator
    assert mb.advantages is not None
    assert (mb.old_log_probs is None) == (own is not None), "old log-probs: the batch's or own"
    log_probs, entropy = forward_log_probs(
        model,
        mb,
        temperature=spec.temperature,
        with_entropy=spec.entropy_coeff != 0 or own is not None,
        remove_padding=spec.remove_padding,
        chunk_size=spec.chunk_size,
        shared_prefix=spec.shared_prefix,
    )
    device = log_probs.device
    if own is None:
        assert mb.old_log_probs is not None
        old = mb.old_log_probs.to(device)
    else:
        assert entropy is not None
        old = log_probs.detach()
        own.keep(old, entropy)
    mask = mb.response_mask.to(device)
    mode = spec.loss_agg_mode
    constants = replace(  # the spec's clip fields are the ones in force
        spec.constants,
        clip_ratio_low=spec.clip_low,
        clip_ratio_high=spec.clip_high,
        clip_ratio_c=spec.clip_ratio_c,
    )
    out = loss_for(spec.loss_mode)(log_probs, old, mb.advantages.to(device), mask, constants)
    token_losses = out.losses
    counts = {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0, **out.counts}
    if (out.agg_mode or mode) != spec.pg_agg_mode:
        raise ValueError(
            f"policy loss {spec.loss_mode!r} returned agg_mode={out.agg_mode!r} but the update "
            f"normalised for {spec.pg_agg_mode!r}: a loss that fixes its aggregation says so "
            "in its function's agg_mode attribute"
        )
    token_losses, correction_stats = _corrected(token_losses, log_probs, old, mb, mask, spec)
    counts |= correction_stats
    pg = agg_numerator(token_losses, mask, spec.pg_agg_mode)
    loss = pg * (denominator / pg_denominator)  # the policy term over its own normaliser
    stats = {"pg_loss": float(pg.detach()), **counts, "tokens": float(mask.sum())}
    if entropy is not None and spec.entropy_coeff != 0:
        ent = agg_numerator(entropy, mask, mode)
        loss = loss - spec.entropy_coeff * ent
        stats["entropy"] = float(ent.detach())
    if spec.use_kl_loss:
        assert mb.ref_log_probs is not None, "use_kl_loss needs ref_log_probs"
        kl = agg_numerator(
            kl_penalty(log_probs, mb.ref_log_probs.to(device), spec.kl_loss_type), mask, mode
        )
        loss = loss + spec.kl_loss_coef * kl
        stats["kl_loss"] = float(kl.detach())
    return loss * (scale / denominator), stats


def _corrected(
    token_losses: torch.Tensor,
    log_probs: torch.Tensor,
    old: torch.Tensor,
    mb: TrainBatch,
    mask: torch.Tensor,
    spec: LossSpec,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The token losses under the rollout correction, and its per-token sums for the step's
    metrics (bypass mode: the only place pi_theta meets pi_rollout).

    - bypass mode with ``loss_type=reinforce``: -A x log pi (then the weights), no clipping;
    - weights the driver computed (``mb.is_weights``: rejection or batch normalisation, whose
      mask is already the batch's) multiply the losses;
    - otherwise the weights and rejection come from this micro-batch's whole rows: the
      proximal policy is ``old`` (decoupled; an update taking its own old log-probs runs at
      them), or this forward's log-probs, detached (bypass, where ``old`` is the engine's).
      Rejected tokens leave the numerator only, and batch normalisation is over the
      micro-batch: the driver's ``is_weights`` avoid both where the old policy is known."""
    corr = spec.correction
    stats: dict[str, float] = {}
    if corr.bypass and corr.loss_type == "reinforce":
        assert mb.advantages is not None
        token_losses = -mb.advantages.to(log_probs.device) * log_probs
    if mb.is_weights is not None:
        return token_losses * mb.is_weights.to(log_probs.device), stats
    if not (corr.active or corr.bypass):
        return token_losses, stats
    behaviour = old if corr.bypass else mb.rollout_log_probs
    assert behaviour is not None, "rollout correction needs the batch's rollout_log_probs"
    behaviour = behaviour.to(log_probs.device)
    proximal = log_probs.detach() if corr.bypass else old
    done = correct(proximal, behaviour, mask, corr)
    if done.weights is not None and corr.applies_weights:
        token_losses = token_losses * done.weights
    if corr.rejects:
        token_losses = token_losses * done.accepted
    if corr.bypass:
        m = mask.bool()
        for key, terms in token_mismatch((proximal - behaviour).float()[m]).items():
            stats[key] = float(terms.sum())
        if done.weights is not None:
            stats["rollout_corr/rollout_is_mean"] = float(done.weights.float()[m].sum())
        if corr.rejects:
            stats["rollout_corr/rollout_rs_masked_fraction"] = float(
                (~done.accepted.bool() & m).sum()
            )
    return token_losses, stats


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    batch: TrainBatch,
    cfg: ActorConfig,
    *,
    samples_per_mini_batch: int,
    temperature: float = 1.0,
    seed: int = 0,
    correction: CorrectionSpec | None = None,
    remove_padding: bool = True,
    own: OwnLogProbs | None = None,
) -> dict[str, float]:
    """PPO epochs over mini-batches of this rank's ``batch`` (``samples_per_mini_batch`` rows
    each, per rank); one optimizer step per mini-batch. Returns mean metrics over steps.
    ``correction``: the rollout correction (``_corrected``; needs the batch's
    ``rollout_log_probs``). ``remove_padding``: micro-batches packed without padding (and
    their token budget counts real tokens); ``cfg.log_prob_chunk_size``: see
    ``forward_log_probs``. ``own`` (a batch without old log-probs; one mini-batch, one
    epoch): the old log-probs are the forward's own, detached, kept in ``own``."""
    spec = LossSpec.from_config(cfg, temperature, correction, remove_padding)
    world = world_size()
    totals: dict[str, float] = {}
    steps = 0
    if own is None:
        minis = epoch_mini_batches(batch, samples_per_mini_batch, cfg.ppo_epochs, cfg.shuffle, seed)
    elif cfg.ppo_epochs != 1 or samples_per_mini_batch < len(batch):
        raise ValueError(
            "an update takes its old log-probs from its own forward only when it makes one "
            f"optimizer step (ppo_epochs={cfg.ppo_epochs}, {samples_per_mini_batch} of "
            f"{len(batch)} rows per mini-batch); compute them first (compute_log_prob)"
        )
    else:
        minis = iter([batch])  # one step: the order of the rows changes nothing
    for mini in minis:
        denominator = global_denominator(
            mini.response_mask,
            spec.loss_agg_mode,
            batch.response_length,
            mini.weights,
            mini.stand_in_tokens,
        )
        pg_denominator = denominator
        if spec.pg_agg_mode != spec.loss_agg_mode:
            pg_denominator = global_denominator(
                mini.response_mask,
                spec.pg_agg_mode,
                batch.response_length,
                mini.weights,
                mini.stand_in_tokens,
            )
        groups = micro_batch_groups(
            mini,
            cfg.ppo_micro_batch_size_per_gpu,
            cfg.use_dynamic_bsz,
            cfg.ppo_max_token_len_per_gpu,
            packed=remove_padding,
            shared=spec.shared_prefix,
        )
        groups = without_idle_groups(mini, groups)
        norm = max(denominator, 1.0)
        sums = accumulate_gradients(
            model,
            mini,
            groups,
            partial(
                _micro_loss,
                model,
                spec=spec,
                denominator=norm,
                scale=world,
                pg_denominator=max(pg_denominator, 1.0),
                own=own,
            ),
            rows=None if own is None else own.at,
        )
        if spec.shared_prefix:  # tokens the packed trees computed, of the rows' tokens
            seqs, positions = real_rows(mini)
            sums["row_tokens"] = float(sum(len(s) for s in seqs))
            sums["tree_tokens"] = float(
                sum(
                    tree_tokens([seqs[i] for i in g], [positions[i] for i in g], MIN_SHARED)
                    for g in groups
                )
            )
        grad_norm = clip_and_step(model, optimizer, scheduler, cfg.grad_clip)
        reduced = dict(zip(sums, all_reduce_floats(list(sums.values())), strict=True))
        tokens = max(reduced.pop("tokens"), 1.0)
        metrics = {
            "actor/pg_loss": reduced["pg_loss"] / max(pg_denominator, 1.0),
            "actor/pg_clipfrac": reduced["pg_clipfrac"] / tokens,
            "actor/pg_clipfrac_lower": reduced["pg_clipfrac_lower"] / tokens,
            "actor/ppo_kl": reduced["ppo_kl"] / tokens,
            "actor/grad_norm": grad_norm,
            "actor/lr": optimizer.param_groups[0]["lr"],
        }
        if "row_tokens" in reduced:
            saved = 1.0 - reduced["tree_tokens"] / max(reduced["row_tokens"], 1.0)
            metrics["actor/shared_prefix_saved_frac"] = saved
        if "entropy" in reduced:
            metrics["actor/entropy_loss"] = reduced["entropy"] / max(denominator, 1.0)
        if "kl_loss" in reduced:
            metrics["actor/kl_loss"] = reduced["kl_loss"] / max(denominator, 1.0)
        for key in [k for k in reduced if k.startswith("rollout_corr/")]:
            metrics[key] = reduced[key] / tokens  # per-token sums of the loss's correction
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + value
        steps += 1
    out = {key: value / max(steps, 1) for key, value in totals.items()}
    out["actor/optimizer_steps"] = float(steps)
    return out


def epoch_mini_batches(
    batch: TrainBatch, samples_per_mini_batch: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[TrainBatch]:
    """Each epoch's mini-batches of ``samples_per_mini_batch`` rows of ``batch`` in turn (the
    last may be short); with ``shuffle`` the rows in a new order each epoch (seeded by
    ``seed + epoch``, so every rank draws the same order of its own share)."""
    order = torch.arange(len(batch))
    for epoch in range(epochs):
        if shuffle:
            order = torch.randperm(
                len(batch), generator=torch.Generator().manual_seed(seed + epoch)
            )
        for start in range(0, len(batch), samples_per_mini_batch):
            yield batch.select(order[start : start + samples_per_mini_batch])

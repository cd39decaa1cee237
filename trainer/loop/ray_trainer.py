"""The RL loop. One step, top to bottom:

    rows ─> rollout, from the run's rollout source (``trainer.loop.rollout_source``):
             the step's prompts generated now (``SyncRollout``: AgentLoopManager, async
             agent loops on the servers), or finished groups taken from a stream that never
             waits for the trainer (``AsyncRollout``, ``async_training.enable``)
         ─> rewards (rule | judge servers | tool-verified, weighted; trainer.rewards)
         ─> old log-probs (+ reference log-probs when a KL term is used, + the critic's
             values with GAE)
         ─> advantages (grpo | rloo | reinforce_plus_plus | ... | gae; optional KL-in-reward)
         ─> critic update (GAE: clipped value loss against the returns)
         ─> PPO mini-batch updates on the FSDP2 ranks (not in the first
             ``trainer.critic_warmup`` steps: the critic learns alone there)
         ─> weight sync to every server (the source's hook: after every step, or every
             ``trigger_parameter_sync_step`` steps with the stream held meanwhile)
         ─> metrics; validation every ``test_freq``; checkpoint every ``save_freq``

Metrics are logged under our names and, where verl has one, under verl's too
(``trainer.metrics.verl_names``), so a verl dashboard carries over. Validation samples
``rollout.val_kwargs.n`` responses per prompt with ``val_kwargs`` (greedy by default) and logs
verl's ``val-core``/``val-aux`` metrics (``trainer.metrics.validation``) beside ours (``val/*``).

Old log-probs are recomputed by the trainer (not taken from the engine), so the PPO ratio
is exact; the gap between the two is logged (``rollout/logprob_gap_*``) as a health check.

A rollout batch has one row per training sample: a session (one sample of one prompt) is
one row, or several when a gateway agent's session split into segments. Each row carries
its record's weight into the advantages (``trainer.algos``: a session's segments weigh one
session), and the update runs as many optimizer steps as it would without segments: the
batch is cut into ``sessions / (ppo_mini_batch_size x rollout.n)`` equal mini-batches.

The trainer builds nothing: ``trainer.loop.assembly.build_run`` starts the servers, ranks, rewards
and weight sync once and hands them over as ``RunParts``; the trainer drives them and stops
them in ``close``. One trainer serves sync and async runs: what differs (where a batch comes
from, when weights are pushed, the prompts in flight at a checkpoint, the weights validation
sees) is the rollout source's.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Any

import torch
from tqdm import tqdm

from agentloop import RolloutBatch
from servers import ServerRestartError
from trainer.algos.correction import correct, mismatch_metrics, weight_metrics
from trainer.algos.value import explained_variance
from trainer.config.schema import Config
from trainer.data.sampler import PromptSampler
from trainer.loop.advantages import step_advantages
from trainer.loop.assembly import RunParts, needs_ref_policy
from trainer.loop.async_rollout import AsyncRollout
from trainer.loop.checkpoint import CheckpointManager, CheckpointSaveError
from trainer.loop.rollout_source import RolloutSource
from trainer.loop.sync_rollout import SyncRollout
from trainer.loop.validate import validate
from trainer.metrics.verl_names import data_metrics, memory_metrics, step_metrics
from trainer.rewards.manager import RewardOutput
from trainer.workers import TrainBatch, TrainerWorkerDiedError
from trainer.workers.inert import skip_inert_rows

__all__ = ["RayPPOTrainer", "RunStoppedError", "stopped_message"]

logger = logging.getLogger("agentloop.train")


@contextmanager
def _timer(metrics: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - start


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    picked = values[mask.bool()]
    if picked.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(picked.mean()),
        f"{prefix}/max": float(picked.max()),
        f"{prefix}/min": float(picked.min()),
    }


class RunStoppedError(RuntimeError):
    """A fault the run cannot go on from (a trainer rank died, a server past its restart
    budget); the message says which, where the run stopped and how to resume."""


def stopped_message(exc: BaseException, step: int, checkpoints: CheckpointManager) -> str:
    """What stopped the run (with the config key that bounds it), where, and how to resume."""
    cause = str(exc)
    if isinstance(exc, ServerRestartError):
        cause += " (the budget is actor_rollout_ref.rollout.recovery.max_server_restarts)"
    latest = checkpoints.latest()
    if latest is None:
        saved = "no checkpoint was saved yet (trainer.save_freq), so a new run starts over"
    else:
        done = CheckpointManager.load_state(latest)["step"]
        saved = f"the last checkpoint is {latest} (step {done})"
    where = f"in step {step}" if step else "before its first step"
    return (
        f"{cause}; the run stopped {where}: {saved}. Run the same command again "
        "(trainer.resume_mode=auto) to go on from the last checkpoint."
    )


def rollout_source(config: Config, parts: RunParts, sampler: PromptSampler) -> RolloutSource:
    """The source the config asks for: the async stream, or a batch per step."""
    if config.async_training.enable:
        return AsyncRollout(config, parts, sampler)
    return SyncRollout(config, parts, sampler)


class RayPPOTrainer:
    """Owns the loop (``fit``, ``train_step``, validation, checkpoints) over parts built by
    ``trainer.loop.assembly.build_run`` and batches from ``rollout`` (by default the source
    the config asks for); ``close`` (also at the end of ``fit``) stops them."""

    def __init__(
        self,
        config: Config,
        parts: RunParts,
        sampler: PromptSampler,
        val_rows: list[dict[str, Any]] | None = None,
        *,
        rollout: RolloutSource | None = None,
    ) -> None:
        self.config, self.parts, self.sampler = config, parts, sampler
        self.val_rows = val_rows or []
        self.rollout = rollout if rollout is not None else rollout_source(config, parts, sampler)
        self.total_steps = self.rollout.total_steps
        self.need_ref = needs_ref_policy(config)
        self.use_critic = config.use_critic
        # The parts the loop drives, by their short names.
        self.manager = parts.manager
        self.workers = parts.workers
        self.rewards = parts.rewards
        self.sync = parts.sync
        self.tracking = parts.tracking
        self.checkpoints = parts.checkpoints
        self.tagger = parts.tagger
        self._warned_no_calls = False
        self._stop_requested = False
        self.stopped_at: int | None = None
        """The step after which a requested stop ended the run (None: it ran to the end)."""

    def request_stop(self) -> None:
        """End the run after the step in progress, with a checkpoint of it (``agentloop-train``
        calls this on SIGTERM / SIGINT: a preempted node, Ctrl-C, the studio's stop button).
        Safe from a signal handler: it only sets a flag the loop reads between steps."""
        self._stop_requested = True

    def _resume(self) -> int:
        """Load the checkpoint to continue from (per ``trainer.resume_mode``); returns its step."""
        run = self.config.trainer
        path = None
        if run.resume_mode != "disable":
            path = self.checkpoints.latest() if run.resume_mode == "auto" else run.resume_from_path
        if path is None:
            self.sync.push_start()
            return 0
        state = CheckpointManager.load_state(path)
        self.workers.load_checkpoint(os.path.join(path, "actor"))
        if self.use_critic:
            critic = os.path.join(path, "critic")
            if not os.path.isdir(os.path.join(critic, "dcp")):
                raise ValueError(
                    f"{path} holds no critic checkpoint ({critic}/dcp): it was saved without a "
                    "critic, or trainer.max_critic_ckpt_to_keep removed it; resume from a "
                    "checkpoint that has one (trainer.resume_from_path), or start over "
                    "(trainer.resume_mode=disable)"
                )
            self.workers.load_critic(critic)
        self.rollout.load_state_dict(state)
        self.sync.push()  # the servers started from the base model
        logger.info("resumed from %s at step %d", path, state["step"])
        return int(state["step"])

    # ---- the loop -------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Resume (per ``trainer.resume_mode``), then train up to ``total_steps``; the parts
        are closed at the end, also on failure. Returns the last step's metrics."""
        metrics: dict[str, float] = {}
        step = 0
        try:
            step = self._resume()
            if self.config.trainer.val_only:
                metrics = self._validate(step)
                self.tracking.log(metrics, step=step)
                return metrics
            if step == 0 and self.config.trainer.val_before_train and self.val_rows:
                self.tracking.log(self._validate(0), step=0)
            bar = tqdm(total=self.total_steps, initial=step, desc="train", unit="step")
            while step < self.total_steps:
                step += 1
                metrics = self.train_step(step)
                self._check_tools_used(step, metrics)
                if self._due(self.config.trainer.test_freq, step) and self.val_rows:
                    metrics |= self._validate(step)
                stopping = self._stop_requested and step < self.total_steps
                if self._due(self.config.trainer.save_freq, step) or stopping:
                    with _timer(metrics, "save_checkpoint"):
                        self._save(step)
                self.tracking.log(metrics, step=step)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
                if stopping:
                    self.stopped_at = step
                    logger.warning(
                        "stopped on request after step %d of %d: checkpoint %s",
                        step,
                        self.total_steps,
                        self.checkpoints.latest(),
                    )
                    break
            bar.close()
        except (TrainerWorkerDiedError, ServerRestartError, CheckpointSaveError) as exc:
            raise RunStoppedError(self._stopped_message(exc, step)) from exc
        finally:
            self.close()
        return metrics

    def _check_tools_used(self, step: int, metrics: dict[str, float]) -> None:
        """Warn (once a run) after a step in which tools were configured but no sample so much
        as attempted a call: the tool path went unexercised."""
        path = self.config.actor_rollout_ref.rollout.multi_turn.tool_config_path
        if self._warned_no_calls or not path or metrics.get("agent_loop/samples_with_calls", 1):
            return
        self._warned_no_calls = True
        logger.warning(
            "step %d: no sample attempted a tool call although tools are configured "
            "(actor_rollout_ref.rollout.multi_turn.tool_config_path=%s): check that the rows run "
            "a loop that offers them (agent_name: tool_agent) and that the model writes tool "
            "calls (agent_loop/calls_attempted/mean); said once per run",
            step,
            path,
        )

    def _stopped_message(self, exc: BaseException, step: int) -> str:
        return stopped_message(exc, step, self.checkpoints)

    def _due(self, freq: int, step: int) -> bool:
        return freq > 0 and (step % freq == 0 or step == self.total_steps)

    def train_step(self, step: int) -> dict[str, float]:
        """One step of the loop in the module docstring; returns its metrics."""
        metrics: dict[str, float] = {"training/step": float(step)}
        start = time.perf_counter()
        batch = self.rollout.next_batch(step, metrics)  # scored; timing_s/gen, /reward inside
        rollout, reward = batch.rollout, batch.reward
        if self.tagger is not None:
            self.tagger.submit(rollout.records, reward.scores.tolist(), reward.components)
        if self.parts.dump is not None:
            self.parts.dump.write(step, rollout, reward)
        metrics |= self.update(step, rollout, reward, baselines=batch.baselines)
        self.rollout.after_update(step, batch)  # a curriculum's update(batch)
        metrics |= memory_metrics(self.workers.memory_stats())
        metrics |= self.rollout.sync_weights(step)
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics |= self._verl_step_metrics(metrics, rollout, batch.epoch)
        return metrics

    def _verl_step_metrics(
        self, metrics: dict[str, float], rollout: RolloutBatch, epoch: int
    ) -> dict[str, float]:
        return step_metrics(
            metrics,
            attention_mask=rollout.attention_mask,
            prompt_width=rollout.prompts.shape[1],
            epoch=epoch,
            n_gpus=self.config.trainer.world_size,
        )

    def update(
        self,
        step: int,
        rollout: RolloutBatch,
        reward: RewardOutput,
        baselines: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Old (and reference) log-probs, advantages and the PPO update of a scored rollout
        batch (``baselines``: remax's greedy scores); returns their metrics. The weights are
        not pushed."""
        cfg = self.config
        metrics: dict[str, float] = {}
        scores = reward.scores
        batch = TrainBatch(
            input_ids=rollout.input_ids,
            attention_mask=rollout.attention_mask,
            position_ids=rollout.position_ids,
            response_mask=rollout.response_mask,
        )
        mask = batch.response_mask
        weights = torch.tensor(rollout.weights, dtype=torch.float32)  # [batch]
        batch.weights = weights
        correction = cfg.correction
        mini_batches = self.mini_batches(rollout.num_sessions)
        own = self.update_takes_own_log_probs(step, mini_batches)
        if correction.active and not correction.bypass:
            batch.rollout_log_probs = rollout.rollout_log_probs
        if correction.bypass:  # the engine's log-probs are the old policy's
            batch.old_log_probs = rollout.rollout_log_probs
        elif not own:  # else the update's own forward gives them
            with _timer(metrics, "old_log_prob"):
                batch.old_log_probs, entropy = self.workers.compute_log_prob(batch)
            metrics |= self._old_policy_metrics(batch, rollout, entropy)
        if self.need_ref:
            with _timer(metrics, "ref"):
                batch.ref_log_probs = self.workers.compute_ref_log_prob(batch)
        if self.use_critic:
            with _timer(metrics, "values"):
                batch.values = self.workers.compute_values(batch)
        with _timer(metrics, "adv"):
            rewards = step_advantages(
                cfg.algorithm,
                batch,
                rollout,
                reward,
                metrics,
                use_critic=self.use_critic,
                baselines=baselines,
            )
        metrics |= _masked_stats("critic/advantages", batch.advantages, mask)
        metrics |= data_metrics(
            attention_mask=rollout.attention_mask,
            prompt_width=rollout.prompts.shape[1],
            scores=scores,
            token_scores=rewards.token_scores,
            token_rewards=rewards.token_rewards,
            advantages=batch.advantages,
            response_mask=mask,
            estimator=cfg.algorithm.adv_estimator,
        )
        if self.use_critic:
            metrics |= self._update_critic(step, batch, rollout.num_sessions)
        if own or step > cfg.trainer.critic_warmup:
            computed, skipped = skip_inert_rows(batch, cfg.actor_rollout_ref.actor, correction)
            metrics["actor/skipped_rows"] = float(skipped.sum())
        if own:
            with _timer(metrics, "update_actor"):
                actor, batch.old_log_probs, entropy = self.workers.update_actor_on_policy(
                    computed, seed=cfg.trainer.seed + step
                )
            seen = batch.select(slice(None))  # the old policy's metrics: the rows computed
            seen.response_mask = computed.response_mask
            metrics |= actor | self._old_policy_metrics(seen, rollout, entropy)
        elif step > cfg.trainer.critic_warmup:
            if correction.needs_whole_batch:  # weights and mask from the whole batch
                metrics |= self._correct_batch(batch, rollout)
            with _timer(metrics, "update_actor"):
                metrics |= self.workers.update_actor(
                    computed, seed=cfg.trainer.seed + step, mini_batches=mini_batches
                )
        tokens = float(batch.attention_mask.sum())
        metrics["perf/total_tokens"] = tokens
        metrics["perf/trainer_tokens_per_s"] = tokens / max(
            metrics.get("timing_s/old_log_prob", 0.0) + metrics.get("timing_s/update_actor", 0.0),
            1e-9,
        )
        return metrics

    def _update_critic(self, step: int, batch: TrainBatch, sessions: int) -> dict[str, float]:
        """The critic's statistics on this batch (values before its update, GAE returns) and
        its update: ``critic.ppo_mini_batch_size x rollout.n`` sessions per optimizer step."""
        assert batch.values is not None and batch.returns is not None
        cfg = self.config
        mask = batch.response_mask
        metrics = _masked_stats("critic/values", batch.values, mask)
        metrics |= _masked_stats("critic/returns", batch.returns, mask)
        metrics["critic/vf_explained_var"] = explained_variance(batch.values, batch.returns, mask)
        per_mini = cfg.critic.mini_batch_size(cfg.actor_rollout_ref.actor)
        per_mini *= cfg.actor_rollout_ref.rollout.n
        with _timer(metrics, "update_critic"):
            metrics |= self.workers.update_critic(
                batch, mini_batches=max(1, -(-sessions // per_mini)), seed=cfg.trainer.seed + step
            )
        return metrics

    def mini_batches(self, sessions: int) -> int:
        """Optimizer steps per PPO epoch for a batch of ``sessions`` sessions: mini-batches
        of ``ppo_mini_batch_size`` prompts x ``rollout.n`` sessions (the last may be short),
        whatever number of samples (segments) the sessions brought."""
        cfg = self.config.actor_rollout_ref
        per_mini = cfg.actor.ppo_mini_batch_size * cfg.rollout.n
        return max(1, -(-sessions // per_mini))

    def update_takes_own_log_probs(self, step: int, mini_batches: int) -> bool:
        """Whether this step's update takes its old log-probs from its own forward
        (``actor.recompute_old_log_prob=False``): it makes one optimizer step (one
        mini-batch, one PPO epoch) at the weights the old policy has, and nothing needs them
        before it (no KL in the reward, the trainer's own log-probs, the actor updated)."""
        cfg = self.config
        return (
            not cfg.actor_rollout_ref.actor.recompute_old_log_prob
            and mini_batches == 1
            and cfg.actor_rollout_ref.actor.ppo_epochs == 1
            and not cfg.algorithm.use_kl_in_reward
            and not cfg.correction.bypass
            and not cfg.correction.needs_whole_batch
            and step > cfg.trainer.critic_warmup
        )

    def _old_policy_metrics(
        self, batch: TrainBatch, rollout: RolloutBatch, entropy: torch.Tensor | None
    ) -> dict[str, float]:
        """The old policy's entropy (where the trainer computed it), how far the engine's
        log-probs are from the trainer's on the sampled tokens, and the off-policy
        correction's weights."""
        assert batch.old_log_probs is not None
        mask, metrics = batch.response_mask, {}
        spec = self.config.correction
        old, behaviour = batch.old_log_probs, rollout.rollout_log_probs
        if entropy is not None and bool(mask.any()):  # none: the update skipped every row
            metrics["actor/entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
            gap = (old - behaviour).abs()[mask.bool()]
            if gap.numel():
                metrics["rollout/logprob_gap_mean"] = float(gap.mean())
                metrics["rollout/logprob_gap_max"] = float(gap.max())
        metrics |= mismatch_metrics(old, behaviour, mask)
        if spec.active and not spec.needs_whole_batch:  # (else _correct_batch says)
            metrics |= weight_metrics(
                old, behaviour, mask, spec, correct(old, behaviour, mask, spec)
            )
        return metrics

    def _correct_batch(self, batch: TrainBatch, rollout: RolloutBatch) -> dict[str, float]:
        """The rollout correction over the whole batch (rejection or batch-normalised
        weights): the actor trains on the accepted tokens only (its loss normaliser counts
        them alone) with the weights in ``batch.is_weights``; returns what it did."""
        assert batch.old_log_probs is not None
        spec, mask = self.config.correction, batch.response_mask
        done = correct(batch.old_log_probs, rollout.rollout_log_probs, mask, spec)
        metrics = weight_metrics(batch.old_log_probs, rollout.rollout_log_probs, mask, spec, done)
        batch.is_weights = done.weights if done.weights is not None else done.accepted
        batch.response_mask = done.accepted.to(mask.dtype)
        return metrics

    def _validate(self, step: int) -> dict[str, float]:
        """``rollout.val_kwargs.n`` responses per validation prompt, sampled with
        ``val_kwargs`` (greedy by default), on the step's weights (``trainer.loop.validate``:
        our ``val/*`` and verl's ``val-core``/``val-aux`` metrics, one value per session)."""
        out = self.rollout.before_validate()  # the servers hold the step's weights
        n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        rows, dump = self.val_rows, self.parts.dump
        out |= validate(self.manager, self.rewards, self.tagger, rows, n=n, step=step, dump=dump)
        return out

    def _save(self, step: int) -> None:
        """The actor's (and critic's) checkpoint of ``step`` with the rollout source's state."""
        state = self.rollout.state_dict()
        contents = self.config.actor_rollout_ref.actor.checkpoint.save_contents
        critic = self.config.critic.checkpoint.save_contents if self.use_critic else None
        self.checkpoints.save(step, self.workers, contents, state, critic_contents=critic)

    def close(self) -> None:
        """Stop the rollout source's own threads, then every part (loggers, rewards, judge,
        ranks, rollout); later calls do nothing."""
        self.rollout.close()
        self.parts.close()

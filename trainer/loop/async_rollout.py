"""Async training (``async_training.enable``): rollout is a stream that never waits for the
trainer, and the trainer consumes finished GRPO groups.

    producer thread:  admit prompts -> RolloutStream (agent loops on the servers) ->
                      finished groups scored at once (rule | judge | verify) -> ready list
    main thread:      take a step's groups from the ready list -> old log-probs ->
                      advantages -> PPO update -> pause the stream (abort running turns with
                      partial_rollout, else let them finish) -> push weights -> resume

Staleness. Versions count updates: the trainer at step k holds version k-1, and every token
carries the version of the weights that sampled it. A group admitted at version ``v`` is
trained by step ``v + s + 1`` at the latest, and a step takes the scored groups earliest
deadline first without taking a slot an older group needs (``trainer.loop.async_schedule``:
the rule, and why it always makes progress). So no group is trained more than ``s`` versions
after its admission and finished work is never thrown away. At ``s = 0`` the groups of step k
are exactly the prompts the sync source would draw, in the same order: the two sources give
the same update. Scoring runs on its own threads (``async_training.score_concurrency`` at
once), so a slow judge delays only its group; a step that waits longer than
``async_training.wait_log_s`` logs what it waits for.

Every step appends the prompts it trained (sampler keys) to ``trained_prompts.jsonl`` in
the run folder.

Resume. A checkpoint stores the sampler state with the keys of every admitted prompt not yet
trained (``PromptSampler.state_dict(in_flight)``); a resumed run rolls them out again first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from agentloop import FinishedGroup, RolloutBatch, RolloutStream, TraceContext, rollout_metrics
from trainer.config.schema import Config
from trainer.data.sampler import PromptSampler
from trainer.loop.assembly import RunParts
from trainer.loop.async_schedule import Admitted, GroupSchedule
from trainer.loop.rollout_source import StepBatch
from trainer.rewards.manager import RewardOutput

__all__ = [
    "AsyncRollout",
    "FilterGroupsError",
    "StalledError",
    "correction_notice",
    "no_signal",
    "staleness_metrics",
]

logger = logging.getLogger("agentloop.train")


class FilterGroupsError(RuntimeError):
    """Too many groups were filtered out for one step (``max_num_gen_batches``)."""


class StalledError(RuntimeError):
    """The run can make no more progress (a state the schedule should never reach)."""


@dataclass(slots=True)
class _Scored:
    group: FinishedGroup
    reward: RewardOutput
    reward_s: float
    """Time its scoring took (while the rollout went on)."""


class AsyncRollout:
    """The rollout stream as a ``RolloutSource``. Only the trainer's thread drives the trainer
    ranks and restarts servers (``heal_if_due``); the producer thread only admits and polls,
    and scoring runs on its own threads."""

    def __init__(
        self,
        config: Config,
        parts: RunParts,
        sampler: PromptSampler,
        *,
        stream: RolloutStream | None = None,
    ) -> None:
        run = config.async_training
        self.sampler, self.rewards, self.sync = sampler, parts.rewards, parts.sync
        self.run_dir = parts.checkpoints.root
        self.stream = stream if stream is not None else RolloutStream(parts.manager)
        self.groups_per_step = config.async_groups_per_step
        self.total_steps = config.trainer.total_steps(len(sampler))
        if config.trainer.total_training_steps is None:  # epochs of this step's group count
            per_epoch = len(sampler.rows) // self.groups_per_step
            if per_epoch < 1:
                raise ValueError(
                    f"an async step trains {self.groups_per_step} prompts but the dataset has "
                    f"{len(sampler.rows)}: lower async_training.require_batches (or "
                    "data.train_batch_size), or set trainer.total_training_steps"
                )
            self.total_steps = config.trainer.total_steps(per_epoch)
        self.staleness = run.staleness_threshold
        self.partial = run.partial_rollout
        self.sync_every = run.trigger_parameter_sync_step
        self.wait_log_s = run.wait_log_s
        self.filter = config.algorithm.filter_groups
        self.version = 0
        """Updates done: the version of the trainer's weights."""
        self.schedule: GroupSchedule[_Scored] = GroupSchedule(
            self.groups_per_step, self.staleness, self.total_steps * self.groups_per_step
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._scoring = ThreadPoolExecutor(run.score_concurrency, thread_name_prefix="score")
        self._dropped_this_step = 0
        self._rollout_idle_s = 0.0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._producer: threading.Thread | None = None
        self._counters: dict[str, int] | None = None
        # The step in progress: when it started, the stream's idle time then, what it took.
        self._step_start = 0.0
        self._idle_before = 0.0
        self._waited = 0.0
        self._taken: list[Admitted] = []
        logger.info(correction_notice(config))

    @property
    def served(self) -> int:
        """The version the servers hold (the last pushed); admission counts from it."""
        return self.schedule.served

    # ---- the producer ---------------------------------------------------------------------
    def _produce(self) -> None:
        """Admit and poll until stopped; each finished group is scored on the scoring threads.
        An error is kept for the main thread."""
        try:
            last = time.perf_counter()
            while not self._stop.is_set():
                with self._lock:
                    while self.schedule.room() > 0:
                        key, row = self.sampler.next_row()
                        self.schedule.admit(key)
                        trace = TraceContext(step=self.served + 1)
                        self.stream.submit(key, row, trace=trace)
                idle = self.stream.in_flight == 0
                finished = self.stream.poll(timeout=0.05)
                now = time.perf_counter()
                if idle:
                    time.sleep(0.02)
                    now = time.perf_counter()
                    with self._lock:
                        self._rollout_idle_s += now - last
                last = now
                for group in finished:
                    self._scoring.submit(self._score, group)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            logger.exception("the rollout stream failed")
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
            self._wake.notify_all()

    def _score(self, group: FinishedGroup) -> None:
        """On a scoring thread: score one group, then hand it to the schedule (or drop it
        when ``filter_groups`` finds no signal in it)."""
        try:
            start = time.perf_counter()
            reward = self.rewards.score(group.batch)
            seconds = time.perf_counter() - start
            keep = not (self.filter.enable and no_signal(group.batch, reward.scores))
            with self._lock:
                self.schedule.finish(group.key, _Scored(group, reward, seconds), keep=keep)
                if not keep:
                    self._dropped_this_step += 1
                self._wake.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            logger.exception("scoring a finished group failed")
            self._fail(exc)

    def _start_producer(self) -> None:
        if self._producer is None:
            self._counters = self.stream.counters()
            self.schedule.pushed(self.version)
            self.stream.resume(self.version)
            self._producer = threading.Thread(target=self._produce, name="rollout", daemon=True)
            self._producer.start()

    # ---- a step: take its groups ----------------------------------------------------------
    def _check_filter_cap(self) -> None:
        cap = self.filter.max_num_gen_batches
        if cap and self._dropped_this_step >= cap * self.groups_per_step:
            raise FilterGroupsError(
                f"{self._dropped_this_step} groups in a row scored alike and were dropped "
                f"(algorithm.filter_groups.max_num_gen_batches={cap}): the task is too easy "
                "or too hard for the model; raise the cap (0: no cap) or change the data. The "
                "last checkpoint resumes the run (trainer.resume_mode=auto)"
            )

    def _take_groups(self, step: int) -> list[tuple[Admitted, _Scored]]:
        """Step ``step``'s groups (``GroupSchedule.take``); waits for them, checking the
        servers meanwhile (a restart pushes the trainer's weights: this thread's work), and
        logs what it waits for every ``async_training.wait_log_s``."""
        start = logged = time.perf_counter()
        while True:
            with self._lock:
                if self._error is not None:
                    raise self._error
                self._check_filter_cap()
                chosen = self.schedule.take(step)
                if chosen is not None:
                    self._dropped_this_step = 0
                    return chosen
                if not self.schedule.pending and self.schedule.room() == 0:
                    raise StalledError(
                        f"async training cannot go on: {self.schedule.describe(step)}. "
                        f"Settings: async_training.staleness_threshold={self.staleness}, "
                        f"trigger_parameter_sync_step={self.sync_every}, "
                        f"{self.groups_per_step} groups per step (require_batches or "
                        "data.train_batch_size); please report this with the run's config"
                    )
                self._wake.wait(timeout=1.0)
                if time.perf_counter() - logged >= self.wait_log_s:
                    logged = time.perf_counter()
                    dropped = ""
                    if self.filter.enable:
                        dropped = (
                            f"; algorithm.filter_groups dropped {self._dropped_this_step} "
                            "group(s) scored alike meanwhile"
                        )
                    logger.warning(
                        "waited %.0f s: %s%s", logged - start, self.schedule.describe(step), dropped
                    )
            self.stream.heal_if_due(self.version)

    def next_batch(self, step: int, metrics: dict[str, float]) -> StepBatch:
        """The next ``groups_per_step`` finished groups, scored while the stream went on."""
        self._start_producer()
        self.stream.heal_if_due(self.version)
        self._step_start = time.perf_counter()
        with self._lock:
            self._idle_before = self._rollout_idle_s
        taken = self._take_groups(step)
        groups = [scored for _, scored in taken]
        self._waited = time.perf_counter() - self._step_start
        self._taken = [admitted for admitted, _ in taken]
        rollout = RolloutBatch.cat([s.group.batch for s in groups])
        reward = RewardOutput.cat([s.reward for s in groups])
        outputs = [o for s in groups for o in s.group.outputs]
        metrics |= rollout_metrics(outputs, self._waited)
        metrics["timing_s/tools"] = metrics.get("agent_loop/tool_s/mean", 0.0)
        metrics |= reward.metrics
        metrics["timing_s/reward"] = sum(s.reward_s for s in groups)  # overlapped with rollout
        metrics |= staleness_metrics(rollout, self.version)
        epoch = max(a.key[0] for a in self._taken)  # the sampler's epoch of the prompts
        return StepBatch(rollout, reward, epoch)

    def after_update(self, step: int, batch: StepBatch) -> None:
        with self._lock:  # the producer draws rows under this lock
            self.sampler.after_step(step, batch.rollout, batch.reward.scores)
        self._log_prompts(step, self._taken)

    def _log_prompts(self, step: int, groups: list[Admitted]) -> None:
        """``trained_prompts.jsonl`` in the run folder: the sampler keys (epoch, position)
        each step trained on, with the version each group was admitted at. After a resume
        the last line of a step is the one in the checkpoint lineage."""
        entry = {
            "step": step,
            "prompts": [list(a.key) for a in groups],
            "admitted_versions": [a.version for a in groups],
        }
        path = self.run_dir / "trained_prompts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    # ---- a step: the new version ----------------------------------------------------------
    def sync_weights(self, step: int) -> dict[str, float]:
        """Count the update; push the weights every ``trigger_parameter_sync_step`` steps
        (and after the last) while the stream goes on. Returns the step's stream metrics."""
        metrics: dict[str, float] = {}
        self.version += 1
        if self.version % self.sync_every == 0 or step == self.total_steps:
            metrics |= self._push()
        start = self._step_start
        with self._lock:
            metrics["async/rollout_idle_frac"] = (self._rollout_idle_s - self._idle_before) / max(
                time.perf_counter() - start, 1e-9
            )
            metrics["async/groups_ready"] = float(len(self.schedule.ready))
            metrics["async/groups_in_flight"] = float(len(self.schedule.pending))
            metrics["async/groups_dropped"] = float(self.schedule.dropped)
        metrics |= self._counter_metrics()
        metrics["timing_s/wait_rollout"] = self._waited
        metrics["async/trainer_idle_frac"] = self._waited / max(time.perf_counter() - start, 1e-9)
        return metrics

    def _counter_metrics(self) -> dict[str, float]:
        """Server restarts, retried requests and resumed turns since the last step."""
        now = self.stream.counters()
        before = self._counters or {k: 0 for k in now}
        self._counters = now
        return {f"rollout/{k}": float(v - before.get(k, 0)) for k, v in now.items()}

    def _push(self) -> dict[str, float]:
        """Hold the stream's turns, push the weights, go on under the new version."""
        start = time.perf_counter()
        inflight = self.partial == "inflight"
        aborted = self.stream.pause(abort=self.partial is True, keep=inflight)
        try:
            out = self.sync.push()
        finally:
            self.stream.resume(self.version)
        paused = time.perf_counter() - start
        with self._lock:
            self.schedule.pushed(self.version)  # admission opens for the new version's groups
            if self.stream.in_flight:  # the turns could not sample meanwhile
                self._rollout_idle_s += paused
            self._wake.notify_all()
        out["async/turns_kept" if inflight else "async/turns_aborted"] = float(aborted)
        out["timing_s/pause_rollout"] = paused
        return out

    # ---- checkpoints, validation, stop ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The sampler's position with every admitted, untrained prompt to roll out again."""
        with self._lock:
            schedule = self.schedule
            in_flight = sorted(
                [*schedule.pending.values(), *(a for a, _ in schedule.ready)],
                key=lambda a: a.seq,
            )
            return {"sampler": self.sampler.state_dict([a.key for a in in_flight])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.restore_position(int(state["step"]))

    def restore_position(self, step: int) -> None:
        """After loading the checkpoint of ``step``: its version, and its groups counted as
        admitted (the sampler hands out the untrained ones again first)."""
        with self._lock:
            self.version = step
            self.schedule.restore(step)

    def before_validate(self) -> dict[str, float]:
        """Validation sees the weights of its step, while the stream goes on generating
        beside it; with a push every N steps the servers may hold older weights, pushed
        first. ``val/weights_version`` says which version was validated."""
        out = self._push() if self.served < self.version else {}
        out["val/weights_version"] = float(self.served)
        return out

    def close(self) -> None:
        """Stop the producer and the scoring threads (the trainer stops the servers)."""
        self._stop.set()
        if self._producer is not None:
            self._producer.join(timeout=60)
        self._scoring.shutdown(wait=False, cancel_futures=True)


def correction_notice(config: Config) -> str:
    """The start-up line that says how samples sampled by older weights are trained."""
    run, spec = config.async_training, config.correction
    head = (
        f"async training: staleness <= {run.staleness_threshold}, weights pushed every "
        f"{run.trigger_parameter_sync_step} step(s), old log-probs "
        + ("from the engine" if spec.bypass else "recomputed by the trainer")
    )
    if run.staleness_threshold == 0:
        return f"{head}; on-policy, no correction needed"
    if not spec.active:
        return (
            f"{head}; rollout_correction=none: samples up to {run.staleness_threshold} "
            "version(s) old train as if on-policy (algorithm.rollout_correction.rollout_is / "
            "rollout_rs, or mode=tis, corrects them)"
        )
    parts = []
    if spec.rollout_is is not None:
        parts.append(f"{spec.rollout_is} weights <= {spec.is_threshold:g}")
    for rejection in spec.rejections:
        parts.append(f"{rejection.option} rejection (bound {rejection.upper:g})")
    if spec.veto is not None:
        parts.append(f"veto below {spec.veto:g}")
    return f"{head}; rollout_correction: {', '.join(parts)}"


def staleness_metrics(rollout: RolloutBatch, version: int) -> dict[str, float]:
    """How many versions behind the trainer (``version``) each sample's oldest token is."""
    versions = rollout.rollout_versions
    sampled = versions >= 0
    if not bool(sampled.any()):
        return {}
    oldest = torch.where(sampled, versions, torch.full_like(versions, version)).min(dim=1).values
    lag = (version - oldest).float()
    return {
        "rollout/staleness_mean": float(lag.mean()),
        "rollout/staleness_max": float(lag.max()),
        "rollout/mixed_version_frac": float(
            (torch.where(sampled, versions, oldest[:, None]).max(dim=1).values > oldest)
            .float()
            .mean()
        ),
    }


def no_signal(batch: RolloutBatch, scores: torch.Tensor) -> bool:
    """A group to filter out (``algorithm.filter_groups``): of two sessions or more, every
    sample of weight > 0 scored alike (a session's segments are one session; samples of
    weight 0 are no part of the group's statistics)."""
    if batch.num_sessions < 2:
        return False
    kept = scores[torch.tensor(batch.weights) > 0]
    return bool((kept == kept[0]).all()) if len(kept) else True

"""``RolloutStream``: rollout as a stream of GRPO groups, for async training.

A group (one prompt x ``rollout.n`` samples) is handed to the agent-loop worker with the
fewest samples in flight when it is submitted, so no batch is split statically over the
workers; ``poll`` returns the groups that have finished, in the order they finish, each
padded into its own ``RolloutBatch`` (same prompt/response lengths, so any of them
concatenate). ``heal_if_due`` checks the servers (``AgentLoopManager.heal``); call it from the
thread that also drives the trainer ranks, since a restarted server gets the trainer's weights.

``pause``/``resume`` bracket a weight update: every worker's new turns are held, and the
running ones are aborted and later continued from their sampled tokens (``abort=True``), let
finish (the default), or kept running in their engines, which load the weights between two
decode steps (``keep=True``, in-flight updates); then they go on under the new version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentloop.base import AgentLoopOutput
from agentloop.batch import RolloutBatch, collate, rollout_metrics
from agentloop.manager import AgentLoopManager, expand_rows
from agentloop.trace import TraceContext
from agentloop.worker import validate_rows

__all__ = ["FinishedGroup", "RolloutStream"]


@dataclass(slots=True)
class FinishedGroup:
    key: Any
    """What the caller submitted the group with (e.g. the prompt's sampler position)."""
    batch: RolloutBatch
    """The group's samples, padded (a session's ``segments`` each a row after it);
    ``metrics`` are the group's rollout metrics."""
    outputs: list[AgentLoopOutput]


@dataclass(slots=True)
class _Running:
    key: Any
    samples: list[dict[str, Any]]
    worker: int
    submitted_s: float


class RolloutStream:
    def __init__(self, manager: AgentLoopManager) -> None:
        self.manager = manager
        self.config = manager.config
        self._running: dict[Any, _Running] = {}  # ObjectRef -> group
        self._load = [0] * len(manager.workers)  # samples in flight per worker
        self._next_index = 0  # sample_index of the traces
        self._last_heal = time.perf_counter()

    @property
    def in_flight(self) -> int:
        """Groups submitted and not yet returned by ``poll``."""
        return len(self._running)

    def submit(
        self,
        key: Any,
        row: dict[str, Any],
        *,
        n: int | None = None,
        trace: TraceContext | None = None,
    ) -> None:
        """Start ``n`` (default ``rollout.n``) samples of ``row`` on the least loaded worker."""
        default = self.config.default_agent_loop
        samples = expand_rows([row], n or self.config.n, default)
        validate_rows(samples, self.manager.tool_names, default, self.manager.interaction_names)
        worker = min(range(len(self._load)), key=self._load.__getitem__)
        ref = self.manager.workers[worker].generate_sequences.remote(
            samples, None, trace or TraceContext(), self._next_index
        )
        self._next_index += len(samples)
        self._load[worker] += len(samples)
        self._running[ref] = _Running(key, samples, worker, time.perf_counter())

    def poll(self, timeout: float) -> list[FinishedGroup]:
        """The groups that finished within ``timeout`` seconds (at least one unless the
        time ran out or none runs). A worker's failure is raised here."""
        import ray

        if not self._running:
            return []
        done, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        if done:  # everything else that is ready too
            done, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=0)
        now = time.perf_counter()
        finished = []
        for ref in done:
            group = self._running.pop(ref)
            self._load[group.worker] -= len(group.samples)
            outputs = ray.get(ref)
            batch = collate(
                outputs,
                group.samples,
                prompt_length=self.config.prompt_length,
                response_length=self.config.response_length,
                pad_token_id=self.manager.pad_token_id,
            )
            batch.metrics = rollout_metrics(outputs, now - group.submitted_s)
            finished.append(FinishedGroup(group.key, batch, outputs))
        return finished

    def heal_if_due(self, version: int | None = None) -> int:
        """Restart dead servers (with the current weights, policy ``version``) at most every
        ``recovery.health_check_interval_s``; returns how many were restarted."""
        now = time.perf_counter()
        if now - self._last_heal < self.config.recovery.health_check_interval_s:
            return 0
        self._last_heal = now
        return self.manager.heal(version)

    def pause(self, *, abort: bool, keep: bool = False) -> int:
        """Hold every worker's turns (see the module docstring); returns turns aborted (or,
        with ``keep``, kept running through the update)."""
        import ray

        return sum(ray.get([w.pause.remote(abort, keep) for w in self.manager.workers]))

    def resume(self, version: int) -> None:
        import ray

        ray.get([w.resume.remote(version) for w in self.manager.workers])

    def counters(self) -> dict[str, int]:
        """Over the run: servers restarted, engine requests re-sent because their server
        died, turns continued after an abort for a weight update."""
        import ray

        workers = self.manager.workers
        return {
            "server_restarts": self.manager.server_restarts,
            "requests_retried": self.manager.retried_requests(),
            "resumed_turns": sum(ray.get([w.resumed_turns.remote() for w in workers])),
            "reprefilled_tokens": sum(ray.get([w.reprefilled_tokens.remote() for w in workers])),
            "kept_turns": sum(ray.get([w.kept_turns.remote() for w in workers])),
        }

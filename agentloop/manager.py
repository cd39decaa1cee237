"""``AgentLoopManager``: splits a batch over ``agent.num_workers`` AgentLoopWorker actors,
gathers their outputs and pads them into a ``RolloutBatch`` with rollout metrics.

Given a ``ServerGroup``, it also keeps the servers alive: while a batch runs it checks them
every ``recovery.health_check_interval_s``; a dead one is restarted, handed the current
weights (``on_server_restart``) and given to every worker, whose turns that were on it have
meanwhile been re-sent to the others (or wait for it when it was the only one).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from agentloop.base import load_agent_loop_config
from agentloop.batch import RolloutBatch, collate, rollout_metrics
from agentloop.config import RolloutConfig
from agentloop.tokenizer import TokenizerSource, load_tokenizer
from agentloop.tools.job_limit import JobLimiter
from agentloop.trace import TraceContext
from agentloop.worker import AgentLoopWorker, prepare_row, validate_rows

__all__ = ["AgentLoopManager", "AgentLoopWorker", "expand_rows"]

logger = logging.getLogger(__name__)


def expand_rows(
    rows: list[dict[str, Any]], n: int, default_agent_loop: str
) -> list[dict[str, Any]]:
    """Each row ``n`` times in a row, sharing one ``uid`` (kept if the row has one), with
    ``rollout_n`` = 0..n-1."""
    out = []
    for row in rows:
        fields = prepare_row(row, default_agent_loop)
        uid = str(fields.get("uid") or uuid.uuid4().hex)
        out.extend({**fields, "uid": uid, "rollout_n": k} for k in range(n))
    return out


class AgentLoopManager:
    def __init__(
        self,
        config: RolloutConfig,
        servers: list[Any] | Any,
        tokenizer: TokenizerSource | str,
        *,
        worker_options: dict[str, Any] | None = None,
        user_servers: list[Any] | None = None,
        user_tokenizer: str | None = None,
    ) -> None:
        """``servers``: handles, or a ``ServerGroup`` whose dead servers get restarted.
        ``tokenizer``: where the workers load the policy's tokenizer from (a folder, or a
        ``TokenizerSource`` with the model's loading options and chat template).
        ``user_servers``/``user_tokenizer``: the simulated users' server group and tokenizer
        folder (``multi_turn.user_model``), when one runs."""
        import ray

        self.group = None if isinstance(servers, list) else servers
        if self.group is not None:
            servers = self.group.handles
        self.on_server_restart: Callable[[list[Any]], None] | None = None
        """Called with the new handles after a restart (the trainer pushes its weights)."""
        self.config = config
        # Load user loops here too, so a bad _target_ fails in the driver with its message.
        if config.agent.agent_loop_config_path:
            load_agent_loop_config(config.agent.agent_loop_config_path)
        loaded = load_tokenizer(tokenizer)
        self.pad_token_id = (
            loaded.pad_token_id if loaded.pad_token_id is not None else loaded.eos_token_id
        )
        options = {"num_cpus": 0, "max_concurrency": 1000, **(worker_options or {})}
        actor = ray.remote(AgentLoopWorker).options(**options)
        self.workers = [
            actor.remote(
                asdict(config),
                servers,
                tokenizer,
                user_servers=user_servers,
                user_tokenizer=user_tokenizer,
            )
            for _ in range(config.agent.num_workers)
        ]
        self.tool_names: list[str] = ray.get(self.workers[0].tool_names.remote())
        # One limiter per tool with a job-wide cap, shared by every worker (verl's rate_limit).
        caps: dict[str, int] = ray.get(self.workers[0].tool_job_limits.remote())
        # on the workers' nodes (agent.node_resource), where the calls they guard run
        placed = {k: v for k, v in options.items() if k == "resources"}
        limiter = ray.remote(JobLimiter).options(num_cpus=0, max_concurrency=1000, **placed)
        self.job_limiters = {name: limiter.remote(cap) for name, cap in caps.items()}
        if self.job_limiters:
            ray.get([w.set_job_limiters.remote(self.job_limiters) for w in self.workers])
        self.interaction_names: list[str] = ray.get(self.workers[0].interaction_names.remote())

    def validate(self, rows: list[dict[str, Any]]) -> None:
        """Start-up checks of a whole dataset (see ``validate_rows``)."""
        default = self.config.default_agent_loop
        validate_rows(rows, self.tool_names, default, self.interaction_names)

    def generate_sequences(
        self,
        rows: list[dict[str, Any]],
        *,
        n: int | None = None,
        sampling_params: dict[str, Any] | None = None,
        trace: TraceContext | None = None,
    ) -> RolloutBatch:
        """Roll out every row ``n`` times (default ``rollout.n``) and pad into a batch.
        ``trace``: step and validation flag the traces are tagged with."""
        samples = expand_rows(rows, n or self.config.n, self.config.default_agent_loop)
        validate_rows(
            samples, self.tool_names, self.config.default_agent_loop, self.interaction_names
        )
        restarts = self.server_restarts
        retried = self.retried_requests()
        self.heal()  # a server that died between batches comes back before this one
        chunks = [c.tolist() for c in np.array_split(np.arange(len(samples)), len(self.workers))]
        start = time.perf_counter()
        refs = [
            w.generate_sequences.remote(
                [samples[i] for i in idx], sampling_params, trace or TraceContext(), idx[0]
            )
            for w, idx in zip(self.workers, chunks, strict=True)
            if idx
        ]
        outputs = [o for part in self._gather(refs) for o in part]
        wall = time.perf_counter() - start
        batch = collate(
            outputs,
            samples,
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            pad_token_id=self.pad_token_id,
        )
        batch.metrics = rollout_metrics(outputs, wall)
        batch.metrics["rollout/server_restarts"] = float(self.server_restarts - restarts)
        batch.metrics["rollout/requests_retried"] = float(self.retried_requests() - retried)
        return batch

    @property
    def server_restarts(self) -> int:
        """Servers restarted over the manager's life (its group's count)."""
        return self.group.restarts if self.group is not None else 0

    def _gather(self, refs: list[Any]) -> list[Any]:
        """Results of every worker, checking the servers while waiting; a worker's failure
        is raised as soon as it comes."""
        import ray

        pending = list(refs)
        interval = self.config.recovery.health_check_interval_s
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=interval)
            ray.get(done)
            if pending:
                self.heal()
        return ray.get(refs)

    def heal(self, version: int | None = None) -> int:
        """Restart every dead server of the group, give it the current weights and hand it to
        the workers; returns how many were restarted. ``version``: the policy version those
        weights are (the trainer's, which may be ahead of the last push), stamped on the
        restarted server's tokens until the next push."""
        import ray

        if self.group is None:
            return 0
        dead = self.group.dead(timeout_s=self.config.recovery.health_check_interval_s)
        for index in dead:
            handle = self.group.restart(index)
            if self.on_server_restart is not None:
                self.on_server_restart([handle])
            ray.get([w.replace_server.remote(index, handle, version) for w in self.workers])
            logger.warning(
                "server %d replaced (%d restart(s) so far); rollout goes on",
                index,
                self.server_restarts,
            )
        return len(dead)

    def retried_requests(self) -> int:
        """Engine requests re-sent because their server died (over the workers' lives)."""
        import ray

        return sum(ray.get([w.retried_requests.remote() for w in self.workers]))

    def shutdown(self) -> None:
        import ray

        if self.config.trace.backend is not None:
            try:  # traces still queued in a worker would be lost with it
                ray.get([w.flush_traces.remote() for w in self.workers], timeout=60)
            except Exception:  # noqa: BLE001 - shutting down regardless
                logger.warning("could not flush the rollout traces of every worker")
        try:  # their workspace copies and run folders (else swept at the next start)
            ray.get([w.close_workspaces.remote() for w in self.workers], timeout=60)
        except Exception:  # noqa: BLE001 - shutting down regardless
            logger.warning("could not remove the workspace folders of every worker")
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        for handle in self.job_limiters.values():
            ray.kill(handle)
        self.job_limiters = {}

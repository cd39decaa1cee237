"""``trainer.loop.assembly.build_run`` without Ray: the parts are started in order and wired to each
other (weight sync over the rollout servers, restarted servers get the weights, the ranks'
spec from the config), the engines load while the rewards and the ranks start and are waited
for before the weight sync, and a part that fails to start stops those already started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trainer.loop.assembly
from trainer.config.actor import ActorConfig, ModelConfig
from trainer.config.schema import ActorRolloutRefConfig, Config
from trainer.data.sampler import PromptSampler
from trainer.launch.rollout import RolloutSetup
from trainer.loop.assembly import RunPlan, build_run
from trainer.loop.checkpoint import CheckpointManager
from trainer.metrics.tracking import Tracking


class FakeGroup:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def wait_ready(self) -> None:
        self.events.append("servers ready")


class FakeManager:
    on_server_restart: Any = None

    def __init__(self, events: list[str]) -> None:
        self.group = FakeGroup(events)


class FakeRewards:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def close(self) -> None:
        self.events.append("close rewards")


class FakeWorkers:
    specs: list[Any] = []
    events: list[str] = []

    def __init__(
        self,
        spec: Any,
        world_size: int,
        balance: bool = False,
        nnodes: int = 1,
        node_resource: str | None = None,
    ) -> None:
        self.specs.append((spec, world_size))
        self.events.append("start ranks")
        self.balance = balance
        self.placement = (nnodes, node_resource)

    def shutdown(self) -> None:
        pass


class RecordingTracking(Tracking):
    def __init__(self, run_dir: Path, events: list[str]) -> None:
        super().__init__([], project="p", experiment="e", run_dir=run_dir)
        self.events = events

    def finish(self) -> None:
        self.events.append("finish tracking")
        super().finish()


@pytest.fixture()
def started(monkeypatch) -> list[str]:
    """Stand-ins for the rollout, rewards and ranks; returns the events they record."""
    events: list[str] = []

    def start_rollout(
        rollout: Any,
        model: ModelConfig,
        share: float | None,
        *,
        num_servers: int,
        lora: bool,
        user_servers: list[Any],
        user_tokenizer: str | None,
        wait: bool,
    ):
        assert (user_servers, user_tokenizer) == ([], None)  # no simulated-user model
        events.append(f"start rollout {model.path} share={share} servers={num_servers} {wait=}")
        return ["server-0"], FakeManager(events)

    def stop_rollout(servers: list[Any], manager: Any) -> None:
        assert isinstance(manager, FakeManager)
        events.append(f"stop rollout {servers}")

    def build_rewards(config: Config, tokenizer: Any, device: str):
        events.append(f"start rewards on {device}")
        return FakeRewards(events), []

    monkeypatch.setattr(
        trainer.loop.assembly,
        "init_ray_routed",
        lambda run_dir, level, env, ray_init: events.append(
            f"ray logs at {level}, env {sorted(env)}, ray_init {ray_init}"
        ),
    )
    monkeypatch.setattr(trainer.loop.assembly, "start_rollout", start_rollout)
    monkeypatch.setattr(trainer.loop.assembly, "stop_rollout", stop_rollout)
    monkeypatch.setattr(trainer.loop.assembly, "build_rewards", build_rewards)
    monkeypatch.setattr(trainer.loop.assembly, "WorkerGroup", FakeWorkers)
    FakeWorkers.specs = []
    FakeWorkers.events = events
    return events


def plan_of(tmp_path: Path, events: list[str]) -> RunPlan:
    model = ModelConfig(path="/models/m", tokenizer_path="/models/m")  # as resolved at start-up
    setup = RolloutSetup(
        model=model, tokenizer=None, tool_names=[], tool_schemas=[], interaction_names=[]
    )
    return RunPlan(
        device="cpu",
        setup=setup,
        sampler=PromptSampler([{}] * 4, 4),
        val_rows=[],
        checkpoints=CheckpointManager(tmp_path / "run"),
        tracking=RecordingTracking(tmp_path / "run", events),
    )


def config_with(**actor: Any) -> Config:
    return Config(
        actor_rollout_ref=ActorRolloutRefConfig(
            model=ModelConfig(path="m"), actor=ActorConfig(**actor)
        )
    )


def test_build_run_starts_each_part_once_and_wires_them(tmp_path, started):
    parts = build_run(config_with(use_kl_loss=True), plan_of(tmp_path, started))

    assert started == [
        "ray logs at WARNING, env ['AGENTLOOP_RUN_DIR'], ray_init {'num_cpus': None}",
        # num_servers null on CPU: one; its engine loads while the rewards and ranks start
        "start rollout /models/m share=None servers=1 wait=False",
        "start rewards on cpu",
        "start ranks",
        "servers ready",  # before the weight sync asks the servers for their routes
    ]
    ((spec, world),) = FakeWorkers.specs
    assert (spec.model_path, spec.device, spec.need_ref, spec.gpu_share, world) == (
        "/models/m",
        "cpu",
        True,
        1.0,
        1,
    )
    assert spec.model.path == "/models/m"  # the resolved model config, not the configured one
    assert parts.workers.balance  # trainer.balance_batch, verl's default
    assert parts.workers.placement == (1, None)  # trainer.nnodes, trainer.node_resource
    assert spec.critic is None  # grpo: no critic
    assert parts.sync.workers is parts.workers and parts.sync.servers is parts.servers
    assert parts.servers == ["server-0"] and not parts.sync.colocated
    assert parts.manager.on_server_restart == parts.sync.push_to
    assert parts.tagger is None  # rollout.trace.backend is off

    parts.close()
    parts.close()  # a second close does nothing
    assert started[5:] == ["finish tracking", "close rewards", "stop rollout ['server-0']"]


def test_a_part_that_fails_to_start_stops_those_before_it(tmp_path, started, monkeypatch):
    def no_ranks(spec: Any, world_size: int, balance: bool, **placement: Any) -> None:
        raise RuntimeError("no room for the trainer ranks")

    monkeypatch.setattr(trainer.loop.assembly, "WorkerGroup", no_ranks)
    with pytest.raises(RuntimeError, match="no room for the trainer ranks"):
        build_run(config_with(), plan_of(tmp_path, started))
    assert started[3:] == ["close rewards", "stop rollout ['server-0']", "finish tracking"]


def test_servers_beside_colocated_gpu_ranks_are_ready_before_the_ranks_start(tmp_path, started):
    """vLLM sizes its GPU memory from what is free when it starts: beside colocated ranks
    (``hybrid_engine`` on CUDA) the engines load first, alone."""
    plan = plan_of(tmp_path, started)
    plan.device = "cuda"
    build_run(config_with(), plan).close()
    assert started[1:5] == [
        "start rollout /models/m share=0.5 servers=1 wait=True",
        "start rewards on cuda",
        "start ranks",
        "servers ready",  # returns at once: the group waited when it started
    ]

"""The cluster keys without a cluster: ``ray_kwargs`` reaches ``ray.init`` as verl's does,
node resources are checked by name, and a dead rank's error names its node."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.config import load_config
from trainer.launch import worker_logs
from trainer.workers.group import TrainerWorkerDiedError


def test_ray_init_kwargs_reach_ray_init_with_the_runs_runtime_env_merged(monkeypatch):
    import ray

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}])
    worker_logs.init_ray(
        "INFO",
        {"AGENTLOOP_RUN_DIR": "/runs/a"},
        {
            "address": "10.0.0.1:6379",
            "num_cpus": None,  # verl's default: left out (an existing cluster refuses it)
            "runtime_env": {"env_vars": {"HF_HOME": "/cache"}, "pip": ["x"]},
        },
    )
    (kwargs,) = calls
    assert kwargs["address"] == "10.0.0.1:6379" and "num_cpus" not in kwargs
    assert kwargs["runtime_env"] == {
        "pip": ["x"],
        "env_vars": {
            "AGENTLOOP_WORKER_LOG_LEVEL": "INFO",
            "VLLM_LOGGING_LEVEL": "INFO",
            "AGENTLOOP_RUN_DIR": "/runs/a",
            "HF_HOME": "/cache",
        },
        "worker_process_setup_hook": "trainer.launch.worker_logs.setup_worker_logging",
    }
    assert kwargs["include_dashboard"] is False and kwargs["log_to_driver"] is True


def test_verl_ray_kwargs_load_and_the_node_resources_reach_their_configs():
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=m",
            "ray_kwargs.ray_init.num_cpus=4",
            "+ray_kwargs.ray_init.address=auto",
            "ray_kwargs.timeline_json_file=/tmp/t.json",
            "trainer.nnodes=2",
            "trainer.node_resource=trainer",
            "actor_rollout_ref.rollout.node_resource=rollout",
            "actor_rollout_ref.rollout.agent.node_resource=agents",
            "reward_model.judge.node_resource=rollout",
        ]
    )
    assert config.ray_kwargs.ray_init == {"num_cpus": 4, "address": "auto"}
    assert config.ray_kwargs.timeline_json_file == "/tmp/t.json"
    assert config.trainer.node_resource == "trainer" and config.trainer.world_size == 2
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.node_resource, rollout.agent.node_resource) == ("rollout", "agents")
    assert config.reward_model.judge.node_resource == "rollout"


@pytest.mark.parametrize("name", ["CPU", "GPU", "memory", "node:10.0.0.1", ""])
def test_a_node_resource_must_be_a_custom_resource(name):
    with pytest.raises(ValueError) as err:
        load_config(["actor_rollout_ref.model.path=m", f"trainer.node_resource='{name}'"])
    assert str(err.value).endswith(
        f"trainer.node_resource={name!r}: name a custom Ray resource your nodes declare "
        "(ray start --resources='{\"rollout\": 1}'), not CPU, GPU, memory or node:<ip>"
    )


def test_a_dead_ranks_error_names_its_node_and_whether_the_node_left(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "aa", "Alive": True}])
    cause = RuntimeError("The actor died unexpectedly before finishing this task.\nmore")
    gone = TrainerWorkerDiedError(1, "update_actor", cause, {"node_id": "bb", "ip": "10.0.0.2"})
    assert str(gone) == (
        "trainer rank 1 on node bb (10.0.0.2, which left the cluster) died during update_actor "
        "(RuntimeError: The actor died unexpectedly before finishing this task.)"
    )
    alive = TrainerWorkerDiedError(0, "compute_log_prob", cause, {"node_id": "aa", "ip": "x"})
    assert str(alive).startswith("trainer rank 0 on node aa (x) died during compute_log_prob")
    assert str(TrainerWorkerDiedError(0, "m", cause)).startswith("trainer rank 0 died during m")


def test_colocated_servers_across_trainer_nodes_stop_the_start(tmp_path, monkeypatch):
    """Several trainer nodes on GPU need servers on GPUs of their own: said before anything
    starts."""
    import torch

    from trainer.loop.assembly import plan_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=m",
            "trainer.device=cuda",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    with pytest.raises(ValueError) as info:
        plan_run(config)
    assert str(info.value) == (
        "trainer.nnodes=2 with servers colocated on the trainer's GPUs is not supported yet (a "
        "server and a rank would each take half a GPU outside one placement group): set "
        "actor_rollout_ref.hybrid_engine=False and give the servers GPUs of their own "
        "(actor_rollout_ref.rollout.node_resource, docs/cluster.md)"
    )

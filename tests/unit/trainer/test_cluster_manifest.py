"""docker/rayjob.yaml (a KubeRay RayJob; it cannot run here) agrees with the CLI and the
config: its entrypoint is a console script whose overrides load and pass the start-up checks,
the trainer group is ``trainer.nnodes`` pods of ``trainer.n_gpus_per_node`` GPUs, every
``*.node_resource`` the entrypoint names is declared by a worker group, the rollout servers fit
their group's GPUs, and the checkpoints lie on the volume every pod mounts."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "docker" / "rayjob.yaml"


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


@pytest.fixture(scope="module")
def config(job):
    argv = shlex.split(job["spec"]["entrypoint"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] in scripts and scripts[argv[0]] == "trainer.cli.train:main"
    loaded, extras = load_config(argv[1:])
    assert extras == {}
    loaded.check()
    return loaded


def groups(job) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}


def declared(group: dict[str, Any]) -> dict[str, float]:
    """A worker group's Ray custom resources (KubeRay's quoted JSON in rayStartParams)."""
    raw = group["rayStartParams"].get("resources")
    return json.loads(raw.strip('"').replace('\\"', '"')) if raw else {}


def containers(job) -> list[dict[str, Any]]:
    spec = job["spec"]["rayClusterSpec"]
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in groups(job).values()]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def test_it_is_a_rayjob_whose_driver_has_the_head_to_itself(job):
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    images = {c["image"] for c in containers(job)}
    assert images == {"agentloop-rl:vllm"}  # the tag docker/Dockerfile.vllm's header builds
    assert "-t agentloop-rl:vllm" in (ROOT / "docker" / "Dockerfile.vllm").read_text()


def test_the_trainer_group_is_trainer_nnodes_pods_of_n_gpus_per_node(job, config):
    trainer = groups(job)["trainer"]
    assert trainer["replicas"] == trainer["minReplicas"] == config.trainer.nnodes
    gpus = int(
        trainer["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    )
    assert gpus == config.trainer.n_gpus_per_node
    assert config.trainer.world_size == 16


def test_every_node_resource_the_entrypoint_names_is_declared_by_a_worker_group(job, config):
    rollout = config.actor_rollout_ref.rollout
    named = {
        "trainer.node_resource": config.trainer.node_resource,
        "actor_rollout_ref.rollout.node_resource": rollout.node_resource,
        "actor_rollout_ref.rollout.agent.node_resource": rollout.agent.node_resource,
    }
    assert None not in named.values(), named
    by_group = {name: declared(g) for name, g in groups(job).items()}
    for key, resource in named.items():
        assert any(resource in r for r in by_group.values()), (key, resource, by_group)
    # the trainer's resource is only on the trainer pods: ranks never land on rollout pods
    assert [g for g, r in by_group.items() if config.trainer.node_resource in r] == ["trainer"]


def test_the_rollout_servers_fit_their_groups_gpus(job, config):
    rollout = config.actor_rollout_ref.rollout
    assert not config.actor_rollout_ref.hybrid_engine  # servers on GPUs of their own
    group = groups(job)["rollout"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    servers = config.servers_for("cuda")
    assert (
        servers * rollout.engine.tensor_parallel_size
        <= int(limits["nvidia.com/gpu"]) * group["minReplicas"]
    )


def test_model_data_and_checkpoints_are_on_the_volume_every_pod_mounts(job, config):
    for container in containers(job):
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/shared" in mounts, container["name"]
    files = [config.data.train_files, config.data.val_files]
    for path in (config.trainer.default_local_dir, config.actor_rollout_ref.model.path, *files):
        assert str(path).startswith("/shared/"), path
    for group in groups(job).values():  # staged weights and vLLM need a real /dev/shm
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}

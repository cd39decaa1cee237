"""Multi-node benchmark and proof (``make bench``), on a Ray cluster of several nodes on this
one machine (``tests/ray_cluster.py``), numbers from one run:

1. **GRPO, one node vs the cluster.** The same 2-step GRPO run of tiny-qwen3 (multi-turn rows
   whose every turn calls an MCP tool, a rule reward plus a judge model) on local Ray, then
   through ``RAY_ADDRESS`` on a cluster: trainer ranks on nodes ``a`` and ``b`` (gloo across
   them), the rollout server, the agent-loop workers with their MCP server, and the judge on
   node ``c``. The metric keys of each step must be the same (but for the per-server routes,
   ``staged`` on one node and ``buckets`` on the cluster).
2. **Weight sync by route, smollm2-135m-instruct.** One trainer rank on node ``a``, a server on
   ``a`` (staged: the rank's shard file, loaded in place) and one on ``c`` (buckets: Ray objects
   across nodes); each push timed alone, rounds alternating; seconds and MB/s. Then 2 ranks on
   ``a`` and ``b`` (buckets, all-gathered across nodes by gloo) to the server on ``c``.

The nodes share the machine's 2 cores, RAM and ``/dev/shm``: the cross-node route here pays
the all-gather and the Ray object path (each node's object store 1 GiB, so a 256 MB bucket is
not spilled) but no network. Writes bench_results/cluster.json."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.cluster.helpers import cpu_spec, write_node_tools
from tests.ray_cluster import cluster_env, multinode_cluster, node_id

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 5


def task(d: Path) -> Path:
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Where is item {i}?"}],
            "agent_name": "node_tool_agent",
            "data_source": "where",
            "reward_model": {"ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(8)
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_node_tools(d)
    (d / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return (len(solution_str) % 7) / 6.0\n"
    )
    return d


def grpo(d: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer.cli.train",
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={d / 'train.jsonl'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.response_length=80",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=8",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={d / 'mcp.json'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={d / 'loops.yaml'}",
        "+actor_rollout_ref.rollout.chat_template_kwargs.enable_thinking=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"custom_reward_function.path={d / 'reward.py'}",
        "reward_model.judge.enable=True",
        "reward_model.judge.model_path=tiny-qwen3",
        "reward_model.judge.max_model_len=1024",
        "reward_model.judge.max_tokens=8",
        "trainer.total_training_steps=2",
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={run_dir}",
        *extra,
    ]


CLUSTER_KEYS = (
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.node_resource=trainer",
    "actor_rollout_ref.rollout.node_resource=rollout",
    "actor_rollout_ref.rollout.agent.node_resource=rollout",
    "reward_model.judge.node_resource=rollout",
)


def run(cmd: list[str], env: dict[str, str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=out, timeout=900)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return time.perf_counter() - start


def steps(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {(r := json.loads(line))["step"]: r for line in lines if line.strip()}


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def route_timings(nodes: dict, smollm2: Path) -> dict:
    """Each server's push timed alone, by the route its node gets."""
    import ray

    from servers import ServerConfig, ServerGroup, stop_servers
    from trainer.workers import WorkerGroup

    group = ServerGroup(
        ServerConfig(model=str(smollm2), max_model_len=1024, http=False), 2, node_resource="rollout"
    )
    infos = ray.get([s.weight_sync_info.remote() for s in group.handles])
    on = {i.node_id: s for i, s in zip(infos, group.handles, strict=True)}
    spec = cpu_spec(smollm2)
    times: dict[str, list[float]] = {"staged": [], "buckets": [], "buckets_2_ranks": []}
    sizes: dict[str, float] = {}
    try:
        one = WorkerGroup(spec, 1, node_resource="solo")
        try:
            targets = {"staged": on[nodes["a"]], "buckets": on[nodes["c"]]}
            for route, server in targets.items():  # warm-up, and the route each one gets
                sent = one.push_weights([server], 256 << 20)
                assert sent["routes"] == [route], sent["routes"]
                sizes[route] = sent["bytes"]
            for _ in range(ROUNDS):
                for route, server in targets.items():
                    t = time.perf_counter()
                    one.push_weights([server], 256 << 20)
                    times[route].append(time.perf_counter() - t)
        finally:
            one.shutdown()
        two = WorkerGroup(spec, 2, nnodes=2, node_resource="trainer")
        try:
            sent = two.push_weights([on[nodes["c"]]], 256 << 20)
            assert sent["routes"] == ["buckets"]
            sizes["buckets_2_ranks"] = sent["bytes"]
            for _ in range(ROUNDS):
                t = time.perf_counter()
                two.push_weights([on[nodes["c"]]], 256 << 20)
                times["buckets_2_ranks"].append(time.perf_counter() - t)
        finally:
            two.shutdown()
        loads = {n: ray.get(s.weight_loads.remote()) for n, s in on.items()}
    finally:
        stop_servers(group.handles)
    assert loads[nodes["c"]]["staged"] == 0  # the far server never read a staged file
    return {
        route: {
            **spread(xs),
            "mb": sizes[route] / 1e6,
            "mb_per_s": sizes[route] / 1e6 / statistics.median(xs),
        }
        for route, xs in times.items()
    }


def test_bench_grpo_one_node_vs_cluster_and_weight_routes(tmp_path):
    import ray

    from trainer.models import prepare

    d = task(tmp_path)
    base_env = {**os.environ, **cluster_env()}
    base_env.pop("RAY_ADDRESS", None)
    wall = {"one_node": run(grpo(d, tmp_path / "one"), base_env, tmp_path / "one.log")}
    store = {"object_store_memory": 1 << 30}  # a bucket (256 MB) fits without spilling
    nodes_spec = {
        "a": {"num_cpus": 1, "resources": {"trainer": 1, "solo": 1, "rollout": 1}, **store},
        "b": {"num_cpus": 0, "resources": {"trainer": 1}, **store},
        "c": {"num_cpus": 2, "resources": {"rollout": 1}, **store},
    }
    with multinode_cluster(nodes_spec) as (handle, added):
        nodes = {name: node_id(n) for name, n in added.items()}
        env = {**base_env, "RAY_ADDRESS": handle.address}
        cmd = grpo(d, tmp_path / "cluster", *CLUSTER_KEYS)
        wall["cluster"] = run(cmd, env, tmp_path / "cluster.log")
        ray.init(
            address=handle.address, runtime_env={"env_vars": cluster_env()}, log_to_driver=False
        )
        try:
            routes = route_timings(nodes, prepare("smollm2-135m-instruct"))
        finally:
            ray.shutdown()
    one, many = steps(tmp_path / "one"), steps(tmp_path / "cluster")
    assert sorted(one) == sorted(many) == [1, 2]

    def shape(record: dict) -> set[str]:
        return {k for k in record if not k.startswith("weight_sync/server")}

    for step in (1, 2):
        assert shape(one[step]) == shape(many[step]), shape(one[step]) ^ shape(many[step])
        assert one[step]["weight_sync/server_0/staged"] == 1.0
        assert many[step]["weight_sync/server_0/buckets"] == 1.0
        assert one[step]["reward/judge/requests"] == many[step]["reward/judge/requests"] == 8
    result = {
        "grpo": {
            "wall_s": wall,
            "step_s": {
                name: [run_steps[s]["timing_s/step"] for s in (1, 2)]
                for name, run_steps in (("one_node", one), ("cluster", many))
            },
            "metric_keys": len(shape(one[1])),
        },
        "weight_sync_smollm2": routes,
    }
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n[bench] GRPO 2 steps, tiny-qwen3 (MCP tool, rule + judge reward)")
    for name in ("one_node", "cluster"):
        s = result["grpo"]["step_s"][name]
        print(f"  {name:<10} wall {wall[name]:6.1f} s  steps {s[0]:6.2f} / {s[1]:6.2f} s")
    print(f"  metric keys per step: {len(shape(one[1]))} on both (routes aside)")
    print("[bench] weight sync, smollm2-135m-instruct, one run (s; MB/s at the median)")
    for route, r in routes.items():
        print(
            f"  {route:<16}{r['min']:>7.2f}{r['median']:>8.2f}{r['max']:>7.2f}"
            f"{r['mb']:>8.0f} MB{r['mb_per_s']:>8.0f} MB/s"
        )

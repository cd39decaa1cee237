"""Parts on other nodes of a real 4-node Ray cluster (one machine), the driver being this test
on the head. Weight routes: each rollout server gets the trainer's weights by the route its
node allows, chosen by node id. Agent-loop workers on another node start their MCP servers
there, and a judge on another node scores. Nodes:

- ``a``: 1 CPU, resources ``trainer``, ``solo``, ``rollout``: one trainer rank (the one-rank
  group) and one rollout server;
- ``b``: 0 CPUs, ``trainer``: the second rank of the two-rank group (gloo across nodes);
- ``c``: 1 CPU, ``rollout``, ``agents``: the other rollout server, the agent-loop workers
  (with their MCP server) and the judge's server.

One rank on ``a``: the server on ``a`` loads the staged file, the one on ``c`` gets buckets.
Two ranks on ``a`` and ``b``: no server holds every rank's node, so both get buckets. Each
server's own count of what it loaded shows that the one on ``c`` never read a staged file,
and a staged file written on ``a`` is refused there by name."""

from __future__ import annotations

import pytest
import torch

from servers.updates import StagedUpdate
from tests.generate_requests import req
from tests.integration.cluster.helpers import cpu_spec, write_node_tools
from tests.integration.trainer import test_weight_push
from tests.ray_cluster import cluster_env, multinode_cluster, node_id
from tests.ray_local import tiny_server_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

trainer_model_path = test_weight_push.trainer_model_path  # the fixture: tiny-qwen3, weights moved

PROMPT = [151644, 872, 198, 9707, 11, 3555, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091]
SAMPLE = {"max_tokens": 16, "temperature": 1.0, "seed": 5, "ignore_eos": True, "logprobs": 0}


@pytest.fixture(scope="module")
def cluster(tiny_qwen3_path):
    import ray

    from servers import ServerGroup

    nodes = {
        "a": {"num_cpus": 1, "resources": {"trainer": 1, "solo": 1, "rollout": 1}},
        "b": {"num_cpus": 0, "resources": {"trainer": 1}},
        "c": {"num_cpus": 1, "resources": {"rollout": 1, "agents": 1}},
    }
    with multinode_cluster(nodes) as (handle, added):
        ray.init(
            address=handle.address,
            runtime_env={"env_vars": cluster_env()},
            log_to_driver=False,
        )
        try:
            group = ServerGroup(tiny_server_config(tiny_qwen3_path), 2, node_resource="rollout")
            yield {name: node_id(n) for name, n in added.items()}, group, added
            from servers import stop_servers

            stop_servers(group.handles)
        finally:
            ray.shutdown()


def test_each_server_gets_the_route_of_its_node_and_serves_the_same_weights(
    cluster, trainer_model_path
):
    import ray

    from trainer.workers import WorkerGroup

    nodes, group, _ = cluster
    servers = group.handles
    infos = ray.get([s.weight_sync_info.remote() for s in servers])
    on = {info.node_id: server for info, server in zip(infos, servers, strict=True)}
    assert set(on) == {nodes["a"], nodes["c"]}  # one server per rollout node (1 CPU each)
    before = ray.get(on[nodes["c"]].generate.remote(req(PROMPT, SAMPLE))).log_probs

    one = WorkerGroup(cpu_spec(trainer_model_path), 1, node_resource="solo")
    try:
        assert [n["node_id"] for n in one.nodes] == [nodes["a"]]
        sent = one.push_weights(servers, 1 << 20)
    finally:
        one.shutdown()
    routes = {info.node_id: r for info, r in zip(infos, sent["routes"], strict=True)}
    assert routes == {nodes["a"]: "staged", nodes["c"]: "buckets"}
    loads = {n: ray.get(on[n].weight_loads.remote()) for n in on}
    none = {"staged": 0, "buckets": 0, "adapter": 0, "transfer": 0, "delta": 0}
    assert loads[nodes["a"]] == {**none, "staged": 1}
    assert loads[nodes["c"]] == {**none, "buckets": 1}
    # both routes delivered the same weights: equal log-probs of the same sampled tokens
    out = {n: ray.get(on[n].generate.remote(req(PROMPT, SAMPLE))) for n in on}
    assert out[nodes["a"]].token_ids == out[nodes["c"]].token_ids
    gap = torch.tensor(out[nodes["a"]].log_probs) - torch.tensor(out[nodes["c"]].log_probs)
    assert gap.abs().max().item() < 1e-5
    assert out[nodes["c"]].log_probs != before  # the weights moved

    two = WorkerGroup(cpu_spec(trainer_model_path), 2, nnodes=2, node_resource="trainer")
    try:
        # one rank per node, in node-id order (the same nodes give the same ranks again)
        assert [n["node_id"] for n in two.nodes] == sorted([nodes["a"], nodes["b"]])
        assert two.push_weights(servers, 1 << 20)["routes"] == ["buckets", "buckets"]
    finally:
        two.shutdown()
    loads = {n: ray.get(on[n].weight_loads.remote()) for n in on}
    assert loads[nodes["a"]]["buckets"] == 1 and loads[nodes["c"]] == {
        "staged": 0,
        "buckets": 2,
        "adapter": 0,
        "transfer": 0,
        "delta": 0,
    }


def test_a_staged_file_written_on_another_node_is_refused(cluster):
    import ray

    nodes, group, _ = cluster
    infos = ray.get([s.weight_sync_info.remote() for s in group.handles])
    far = next(s for s, i in zip(group.handles, infos, strict=True) if i.node_id == nodes["c"])
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(far.apply_weights.remote(StagedUpdate([], writer_node=nodes["a"])))
    assert (
        f"staged weights written on node {nodes['a']} cannot be read on node {nodes['c']}: "
        "a server on another node gets its weights in buckets"
    ) in str(err.value)


def test_trainer_nodes_that_are_not_there_stop_the_start_saying_what_to_change(cluster):
    from trainer.workers.placement import place_ranks

    with pytest.raises(RuntimeError) as err:
        place_ranks(3, 3, "cpu", 1.0, "trainer", timeout_s=3)
    assert str(err.value) == (
        "the trainer's 3 node(s) x 1 rank(s) could not be placed in 3 s: each node needs "
        "{'trainer': 0.001} free, and 2 of the cluster's 4 alive node(s) have that much in "
        "all; 2 declare 'trainer'. Add nodes (ray start --address=...), lower trainer.nnodes, "
        "or change trainer.node_resource"
    )


def test_agent_workers_on_another_node_run_their_mcp_tools_there_and_a_judge_there_scores(
    cluster, tiny_qwen3_path, tmp_path
):
    """``agent.node_resource=agents``: the workers run on c, and the MCP server they start
    answers from c (its raylet's pid); the judge's reward, computed here on the head, is
    served by c's engine."""
    import asyncio

    import ray
    from ray import ray_constants
    from transformers import AutoTokenizer

    from agentloop import AgentConfig, AgentLoopManager, MultiTurnConfig, RolloutConfig
    from servers import AsyncLLMServerManager
    from servers.placement import on_nodes_with
    from trainer.config.reward import JudgeConfig
    from trainer.rewards.judge import JudgeReward
    from trainer.rewards.types import RewardSample

    nodes, group, added = cluster
    mcp, loops = write_node_tools(tmp_path)
    config = RolloutConfig(
        n=2,
        prompt_length=256,
        response_length=96,
        multi_turn=MultiTurnConfig(
            tool_config_path=str(mcp),
            max_assistant_turns=2,
            max_tokens_per_turn=8,
        ),
        agent=AgentConfig(
            num_workers=1,
            agent_loop_config_path=str(loops),
            node_resource="agents",
        ),
    )
    manager = AgentLoopManager(
        config, group.handles, str(tiny_qwen3_path), worker_options=on_nodes_with("agents")
    )
    try:
        from ray.util.state import list_actors

        (worker,) = list_actors(
            filters=[("class_name", "=", "AgentLoopWorker"), ("state", "=", "ALIVE")]
        )
        assert worker.node_id == nodes["c"]
        rows = [
            {
                "raw_prompt": [{"role": "user", "content": "Where are you?"}],
                "agent_name": "node_tool_agent",
            }
        ]
        batch = manager.generate_sequences(rows)
    finally:
        manager.shutdown()
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    raylet = added["c"].all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    texts = [tokenizer.decode(r) for r in batch.responses]
    assert all(r.tool_calls >= 1 and r.tool_errors == 0 for r in batch.records), batch.records
    assert all(f"raylet {raylet}" in t for t in texts), texts

    judge_config = JudgeConfig(
        enable=True, model_path=str(tiny_qwen3_path), max_tokens=8, max_model_len=512
    )
    far = next(
        s
        for s, i in zip(
            group.handles,
            ray.get([s.weight_sync_info.remote() for s in group.handles]),
            strict=True,
        )
        if i.node_id == nodes["c"]
    )
    judge = JudgeReward(judge_config, AsyncLLMServerManager([far]), tokenizer)
    sample = RewardSample(
        index=0,
        data_source="where",
        solution_str="On node c.",
        ground_truth="c",
        extra_info={},
        row={"prompt": [{"role": "user", "content": "Where are you?"}]},
    )
    (score,) = asyncio.run(judge.score([sample]))
    assert judge.metrics()["requests"] == 1.0
    assert 0 in judge.outputs and isinstance(score, dict) and "score" in score

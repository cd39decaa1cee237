"""Nodes lost for real in a PPO run (GAE with a critic) on a multi-node Ray cluster: tiny-qwen3
on one vLLM CPU server, 2 FSDP2 gloo ranks on two nodes holding the actor and the critic,
multi-turn tool_agent rows. The cluster (``tests/ray_cluster.py``, Ray's own ``cluster_utils``
on this machine) has a head that runs only the driver, which joins it through ``RAY_ADDRESS``;
trainer nodes ``a`` and ``b`` (``trainer.node_resource=trainer``: one rank on each, gloo
between them; ``a`` also runs the agent-loop workers with their tools,
``agent.node_resource=agents``); rollout node ``c`` (the server); rollout node ``d`` joins
during run 2 (room for the server's restart). The actor
trains a LoRA adapter (verl's keys: rank 8 on every linear layer), so each weight sync sends
only the adapter, which the server loads as its next LoRA version; the critic trains a LoRA
adapter and its value head.

1. Sync run: after the step-2 checkpoint node ``b`` (rank 1's) leaves the cluster; the run
   stops in step 3 with a message naming the rank, its node, the step, the last checkpoint
   and how to resume, and exits 1. A new trainer node joins.
2. Run again in async mode (staleness 1, 4 steps): it resumes from step 2 on nodes ``a`` and
   the new one; rollout node ``d`` joins and the server's node ``c`` leaves the cluster as
   step 3 starts, and the server is restarted on ``d`` with the step-2 weights while the
   stream goes on. Right after the step-3
   checkpoint, with step 4's groups in flight, the driver gets SIGKILL (Ray ends its job).
3. Run again: it resumes from step 3, rolls out the in-flight prompts again first and trains
   step 4. Across the checkpoint lineage every prompt of the epoch is trained exactly once;
   after every weight sync (the restarted server's included) the server's log-probs match
   the trainer's; the checkpoints hold the adapter only and the export is a PEFT folder; the
   critic resumed each time (its optimizer-step count runs on across the three runs)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from tests.ray_cluster import cluster_env, multinode_cluster, node_id
from tests.shm import remove_new_segments, shm_segments

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.heavy(minutes=8)]

REPO = Path(__file__).resolve().parents[2]
GAP_LIMIT = 1e-3  # float32 engine vs float32 trainer
PER_STEP = (
    "reward/mean",
    "reward/rule",
    "reward/errors",
    "agent_loop/num_turns/mean",
    "agent_loop/tool_calls/mean",
    "agent_loop/response_length/mean",
    "timing_s/gen",
    "timing_s/tools",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/update_actor",
    "timing_s/weight_sync",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "rollout/logprob_gap_max",
    "perf/trainer_tokens_per_s",
    "critic/vf_loss",
    "critic/vf_explained_var",
    "critic/values/mean",
    "critic/returns/mean",
    "timing_s/values",
    "timing_s/update_critic",
)


@pytest.fixture(scope="module")
def cluster():
    """Head (driver only), trainer nodes a (also the agent-loop workers) and b, rollout node c
    (the server). Rollout node d joins during run 2, so the server starts on c and only a
    restart can go to d."""
    nodes = {
        "a": {"num_cpus": 0, "resources": {"trainer": 1, "agents": 1}},
        "b": {"num_cpus": 0, "resources": {"trainer": 1}},
        "c": {"num_cpus": 1, "resources": {"rollout": 1}},
    }
    with multinode_cluster(nodes) as (handle, added):
        yield handle, added


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("task")
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Echo the word number {i}."}],
            "agent_name": "forced_tool_agent",
            "data_source": "echo",
            "reward_model": {"ground_truth": str(i)},
            "extra_info": {
                "index": i,
                "tools_kwargs": {"echo": {"create_kwargs": {"prefix": f"#{i} "}}},
            },
        }
        for i in range(8)
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    from tests.integration.agentloop.helpers import ECHO_SCHEMA

    tool = {
        "class_name": "tests.integration.agentloop.helpers.EchoTool",
        "config": {"type": "native", "latency_s": 0.02},
        "tool_schema": ECHO_SCHEMA,
    }
    (d / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    loop = {
        "name": "forced_tool_agent",
        "_target_": "tests.integration.agentloop.helpers.CappedTurnsToolAgentLoop",
    }
    (d / "loops.yaml").write_text(yaml.safe_dump([loop]))
    # A reward with spread (a random model never solves a task): GRPO gets non-zero advantages.
    (d / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return {'score': (len(solution_str) % 7) / 6.0, 'turns': extra_info['num_turns']}\n"
    )
    return d


def command(task: Path, run_dir: Path, *extra: str, steps: int = 3) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer.cli.train",
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={task / 'train.jsonl'}",
        f"data.val_files={task / 'val.jsonl'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "actor_rollout_ref.rollout.n=2",
        # 3 turns of at most 8 tokens and 2 tool results (~30 tokens each) fit in 80: few
        # tokens to decode and train on, every sample still multi-turn with 2 tool calls
        "actor_rollout_ref.rollout.response_length=80",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=8",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        # the killed server is found (and its restart begun) within 0.5 s, not 5 s
        "actor_rollout_ref.rollout.recovery.health_check_interval_s=0.5",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={task / 'tools.yaml'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={task / 'loops.yaml'}",
        "+actor_rollout_ref.rollout.chat_template_kwargs.enable_thinking=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
        "algorithm.adv_estimator=gae",  # PPO: the critic is on (critic.enable: null)
        "algorithm.lam=0.95",
        "critic.model.lora_rank=8",
        "critic.optim.lr=1e-3",
        f"custom_reward_function.path={task / 'reward.py'}",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.node_resource=trainer",
        "actor_rollout_ref.rollout.node_resource=rollout",
        "actor_rollout_ref.rollout.agent.node_resource=agents",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "trainer.logger=[console,jsonl,mlflow]",
        "actor_rollout_ref.rollout.trace.backend=mlflow",
        "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=3",
        f"trainer.default_local_dir={run_dir}",
        *extra,
    ]


ASYNC = ("async_training.enable=True", "async_training.staleness_threshold=1")
"""The resumed run trains async: a sync checkpoint resumes into the stream."""


def env(address: str) -> dict[str, str]:
    """The driver's: it joins the cluster at ``address``."""
    return {**os.environ, **cluster_env(), "RAY_ADDRESS": address}


def steps_logged(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_prompts(run_dir: Path) -> dict[int, list[list[int]]]:
    """The prompts each step trained, from the last line of each step (the lineage's)."""
    prompts: dict[int, list[list[int]]] = {}
    for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines():
        entry = json.loads(line)
        prompts[entry["step"]] = entry["prompts"]
    return prompts


def phase(name: str, start: float) -> None:
    """When a phase of the test ended: shown with ``-s``, and in a failure's captured output."""
    print(f"{name} after {time.monotonic() - start:.0f} s", flush=True)


def test_a_lost_trainer_node_stops_the_run_clearly_and_it_resumes_past_a_lost_server_node(
    cluster, task, tmp_path, tiny_qwen3_path
):
    handle, nodes = cluster
    address = handle.address
    run_dir = tmp_path / "run"
    log1 = (tmp_path / "run1.log").open("w")
    shm_before = shm_segments()
    start = time.monotonic()
    proc = subprocess.Popen(
        command(task, run_dir), cwd=REPO, env=env(address), stdout=log1, stderr=log1
    )
    deadline = time.monotonic() + 600
    try:
        while not (
            (run_dir / "global_step_2").is_dir()
            and any(s["step"] == 2 for s in steps_logged(run_dir))
        ):
            assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "run 1 did not reach step 2 in time"
            time.sleep(0.5)
        phase("run 1 saved step 2", start)
        handle.remove_node(nodes["b"])  # one rank's node: the ranks hold one node each
        code = proc.wait(timeout=300)
        phase("run 1 exited", start)
    finally:
        if proc.poll() is None:
            proc.kill()
        log1.close()
        remove_new_segments(shm_before)  # a killed rank cannot unlink its segments
    text = (tmp_path / "run1.log").read_text()
    assert code == 1, text[-3000:]
    lost = node_id(nodes["b"])
    rank = int(lost > node_id(nodes["a"]))  # ranks follow the trainer nodes' id order
    message = re.search(
        rf"agentloop-train: trainer rank {rank} on node {lost} \(\S+, which left the cluster\) "
        r"died during \w+ .*",
        text,
    )
    assert message, text[-3000:]
    assert message.group(0).endswith(
        f"the run stopped in step 3: the last checkpoint is {run_dir / 'global_step_2'} "
        "(step 2). Run the same command again (trainer.resume_mode=auto) to go on from the "
        "last checkpoint."
    ), message.group(0)
    assert not (run_dir / "global_step_3").exists()
    assert [s["step"] for s in steps_logged(run_dir)] == [1, 2]
    # the route of each sync, per server, in the metrics: the adapter (LoRA) to server 0
    assert all(s["weight_sync/server_0/adapter"] == 1.0 for s in steps_logged(run_dir))
    handle.add_node(num_cpus=0, resources={"trainer": 1})  # a replacement trainer node

    # ---- resume, in async mode: continues at step 3, repeats nothing. Its only rollout
    # server is killed as step 3 starts: it is restarted and given the step-2 weights (the
    # log-prob gap proves it) while the rollout stream goes on. Once step 3 is checkpointed,
    # with step 4's groups in flight, the driver dies with its whole process tree.
    log2_path = tmp_path / "run2.log"
    with log2_path.open("w") as log2:
        proc = subprocess.Popen(
            command(task, run_dir, *ASYNC, steps=4),
            cwd=REPO,
            env=env(address),
            stdout=log2,
            stderr=log2,
        )
        try:
            deadline = time.monotonic() + 600
            while "resumed from" not in log2_path.read_text():
                assert proc.poll() is None, log2_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "run 2 did not resume in time"
                time.sleep(0.2)
            phase("run 2 resumed", start)
            # a second rollout node joins, then the server's node leaves
            nodes["d"] = handle.add_node(num_cpus=1, resources={"rollout": 1})
            handle.remove_node(nodes["c"])
            while not (
                (run_dir / "global_step_3").is_dir()
                and any(s["step"] == 3 for s in steps_logged(run_dir))
            ):
                assert proc.poll() is None, log2_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "run 2 did not reach step 3 in time"
                time.sleep(0.2)
            phase("run 2 saved step 3", start)
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.send_signal(signal.SIGKILL)  # Ray ends the job: its actors on every node
            for child in tree:  # what the driver itself started (the tool limiters' none)
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            remove_new_segments(shm_before)
    text = log2_path.read_text()
    assert "at step 2" in text
    # restarted on the rollout node that remains
    assert f"server 0 restarted (1 of 3) on node {node_id(nodes['d'])}" in text, text[-3000:]
    state3 = json.loads((run_dir / "global_step_3" / "trainer_state.json").read_text())
    # all 8 prompts of epoch 1 were admitted (staleness 1); step 3 trained the 4 oldest that
    # had finished, the other 4 were in flight when step 3 was saved
    requeued = state3["sampler"]["requeued"]
    trained3 = trained_prompts(run_dir)[3]
    assert len(requeued) == 4 and sorted(requeued + trained3) == [[1, i] for i in range(8)]

    # ---- resume again: step 4 from the requeued prompts
    log3_path = tmp_path / "run3.log"
    with log3_path.open("w") as log3:
        proc = subprocess.run(
            command(task, run_dir, *ASYNC, steps=4),
            cwd=REPO,
            env=env(address),
            stdout=log3,
            stderr=log3,
            timeout=600,
        )
    remove_new_segments(shm_before)
    phase("run 3 exited", start)
    text = log3_path.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "at step 3" in text
    logged = {s["step"]: s for s in steps_logged(run_dir)}  # the last record of each step
    assert sorted(logged) == [1, 2, 3, 4]
    assert logged[3]["rollout/server_restarts"] == 1
    assert logged[3]["rollout/staleness_max"] == 0  # admitted and trained at version 2
    assert logged[4]["rollout/staleness_max"] == 0  # requeued, admitted again at version 3
    assert "async/trainer_idle_frac" in logged[3] and "rollout/staleness_mean" not in logged[2]
    for record in logged.values():
        missing = [k for k in PER_STEP if k not in record]
        assert not missing, f"step {record['step']} lacks {missing}"
        # engine (after the previous step's weight sync) vs trainer, on every sampled token
        assert record["rollout/logprob_gap_max"] < GAP_LIMIT, record["rollout/logprob_gap_max"]
        assert record["reward/errors"] == 0
    assert max(r["agent_loop/tool_calls/mean"] for r in logged.values()) > 0  # tools ran
    assert any(r["actor/grad_norm"] > 0 for r in logged.values())
    assert "val/reward/mean" in logged[4]
    assert any(r["critic/grad_norm"] > 0 for r in logged.values())
    # ---- the critic resumed both times: 2 critic mini-batches (8 samples / (2 prompts x n=2))
    # a step, so its step count is 8 after step 4 only if steps 1-3's were loaded
    extra = torch.load(run_dir / "global_step_4" / "critic" / "optim_extra.pt", weights_only=True)
    assert extra["updates"] == 8, extra["updates"]
    # ---- every prompt of epoch 1 (steps 3 and 4) trained exactly once in the lineage
    prompts = trained_prompts(run_dir)
    assert prompts[3] == trained3 and sorted(prompts[4]) == sorted(requeued)
    lineage = sorted(p for step in (3, 4) for p in prompts[step])
    assert lineage == [[1, i] for i in range(8)], prompts
    # ---- checkpoints: the data position continues (8 rows / batch 4 = 2 batches an epoch)
    state = json.loads((run_dir / "global_step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4
    assert state["sampler"] == {"epoch": 1, "position": 2, "offset": 8, "requeued": []}
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "4"
    # ---- LoRA: adapter-sized syncs, adapter-only checkpoints, a PEFT export that moved
    full_mb = sum(p.stat().st_size for p in tiny_qwen3_path.glob("*.safetensors")) / 1e6
    assert all(0 < r["weight_sync/mb"] < full_mb / 10 for r in logged.values()), full_mb
    dcp_mb = sum(p.stat().st_size for p in (run_dir / "global_step_4/actor/dcp").iterdir()) / 1e6
    assert dcp_mb < full_mb / 10, (dcp_mb, full_mb)  # adapter and its optimizer state only
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    export = run_dir / "global_step_4" / "actor" / "huggingface"
    assert (export / "adapter_config.json").is_file()
    trained = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_qwen3_path), export
    )
    lora_b = [v for k, v in trained.state_dict().items() if "lora_B" in k]
    change = max(v.abs().max().item() for v in lora_b)  # B starts at zero
    assert change > 1e-4
    assert torch.isfinite(torch.tensor(change))
    check_traces(run_dir)


def check_traces(run_dir: Path) -> None:
    """Rollout traces in the run's MLflow store, linked to its run, tagged with step and
    reward: 3 traced samples per training step and worker (the cap), both validation rows.
    Async groups carry the step they were admitted in."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlruns.db'}")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    experiment = client.get_run(run_id).info.experiment_id
    traces = client.search_traces(locations=[experiment], max_results=500)
    by_step: dict[tuple[str, str], int] = {}
    untagged = []
    unfinished = 0
    for trace in traces:
        tags = trace.info.tags
        if "step" not in tags:
            # SIGKILLed before MLflow exported the root span (IN_PROGRESS: only finished child
            # spans reached the store), or after it but before the tag writer (which sets the
            # tags once the trace is in the store) reached this one. Only the killed async
            # driver's (run 2) step-3 samples can be in either state: the count below holds.
            unfinished += 1
            continue
        by_step[(tags["step"], tags["validate"])] = (
            by_step.get((tags["step"], tags["validate"]), 0) + 1
        )
        assert trace.info.trace_metadata.get("mlflow.sourceRun") == run_id
        if "reward" in tags:
            assert "reward/rule" in tags, tags
        else:
            untagged.append(tags)
    # rewards are tagged when a step trains its groups: the killed async driver (run 2)
    # never trained the step-4 groups it had traced (tagged step 3, its admission step)
    assert all((t["step"], t["validate"]) == ("3", "false") for t in untagged), untagged
    assert len(untagged) <= 3, untagged
    # step 3 was rolled out (and traced) twice: in the stopped run and in the resumed one,
    # which also admitted step 4's groups then; run 3 admitted them again at step 4
    assert by_step[("1", "false")] == 3 and by_step[("2", "false")] == 3
    assert unfinished <= 3
    assert by_step[("3", "false")] + unfinished == 6 and by_step[("4", "false")] == 3
    assert by_step[("2", "true")] == 2 and by_step[("4", "true")] >= 2  # both val rows

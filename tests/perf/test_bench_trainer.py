"""Trainer benchmark (``make bench``): where does a GRPO step's time go?

``agentloop-train`` on smollm2-135m-instruct (vLLM CPU server, FSDP2 on 2 gloo ranks, Ray
local): 4 prompts x n=2 per step, multi-turn tool_agent rows whose every turn calls an echo
tool (0.3 s latency), 5 steps; step 1 is the warm-up and is left out. Prints the mean time of
each phase (gen, tools, reward, old_log_prob, update_actor, weight_sync), trainer tokens/s,
and the share of the step spent outside generation and the update (target printed, not
asserted: <= 25%). Writes bench_results/trainer.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.agentloop.helpers import ECHO_SCHEMA

REPO = Path(__file__).resolve().parents[2]
STEPS = 5
PHASES = ("gen", "tools", "reward", "old_log_prob", "update_actor", "weight_sync")


@pytest.mark.slow
def test_bench_trainer_step_breakdown(tmp_path, smollm2_path):
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Use the echo tool on the number {i}."}],
            "agent_name": "forced_tool_agent",
            "data_source": "echo",
            "reward_model": {"ground_truth": str(i)},
        }
        for i in range(4 * STEPS)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tool = {
        "class_name": "tests.integration.agentloop.helpers.EchoTool",
        "config": {"type": "native", "latency_s": 0.3},
        "tool_schema": ECHO_SCHEMA,
    }
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    loop = {
        "name": "forced_tool_agent",
        "_target_": "tests.integration.agentloop.helpers.CappedTurnsToolAgentLoop",
    }
    (tmp_path / "loops.yaml").write_text(yaml.safe_dump([loop]))
    (tmp_path / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return (len(solution_str) % 5) / 4.0\n"
    )
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "trainer.cli.train",
        f"actor_rollout_ref.model.path={smollm2_path}",
        f"data.train_files={tmp_path / 'train.jsonl'}",
        "data.train_batch_size=4",
        "data.shuffle=False",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=48",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path / 'loops.yaml'}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "trainer.n_gpus_per_node=2",
        f"trainer.total_training_steps={STEPS}",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    measured = steps[1:]  # step 1 warms up the engine and the trainer

    def mean(key: str) -> float:
        return sum(s[key] for s in measured) / len(measured)

    step_s = mean("timing_s/step")
    phases = {p: mean(f"timing_s/{p}") for p in PHASES}
    outside = step_s - phases["gen"] - phases["update_actor"]
    result = {
        "model": "smollm2-135m-instruct",
        "samples_per_step": 8,
        "steps_measured": len(measured),
        "step_s": step_s,
        "phases_s": phases,
        "tokens_per_step": mean("perf/total_tokens"),
        "trainer_tokens_per_s": mean("perf/trainer_tokens_per_s"),
        "tool_calls_per_sample": mean("agent_loop/tool_calls/mean"),
        "share_outside_gen_and_update": outside / step_s,
        "logprob_gap_max": max(s["rollout/logprob_gap_max"] for s in measured),
    }
    lines = [
        "",
        f"GRPO step on smollm2-135m-instruct, 8 samples/step, 2 gloo ranks, mean of "
        f"{len(measured)} steps after 1 warm-up",
        f"  {'phase':<14}{'seconds':>9}{'share':>8}",
    ]
    for name, seconds in phases.items():
        lines.append(f"  {name:<14}{seconds:>9.2f}{seconds / step_s:>8.1%}")
    lines += [
        f"  {'step (wall)':<14}{step_s:>9.2f}{1:>8.1%}",
        "  (tools run inside gen: per-sample mean tool seconds, overlapped with generation)",
        f"  tokens/step {result['tokens_per_step']:.0f}, trainer tokens/s "
        f"{result['trainer_tokens_per_s']:.0f}, tool calls/sample "
        f"{result['tool_calls_per_sample']:.2f}, max log-prob gap {result['logprob_gap_max']:.1e}",
        f"  outside generation and update: {outside:.2f} s = "
        f"{result['share_outside_gen_and_update']:.1%} of the step (target <= 25%)",
    ]
    print("\n".join(lines))
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "trainer.json").write_text(json.dumps(result, indent=1))
    assert result["logprob_gap_max"] < 1e-3

"""Environments written in other projects' APIs, trained unchanged (docs/environments.md), as a
user runs them: a verifiers tool environment and a verifiers multi-turn environment (rows from
their own datasets, ``data.env_dataset``'s writer) and an OpenEnv grid server (started per worker
by the loop's command) through one GRPO step of ``agentloop-train`` on tiny-qwen3 (a copy that
ends its turns, so episodes have several steps) on one vLLM CPU server.

The step's scores, read from its ``trainer.rollout_data_dir`` dump, are the environments' own:
each verifiers sample's reward and reward functions equal what the environment's rubric
computes on the same completion (the runner's ``score``, in verifiers' venv), and each grid
sample's score is the sum of the rewards the grid gives the same actions replayed from the same
seed, one per turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentloop.envs.verifiers_env import VerifiersSpec, verifiers_python
from tests.turn_ending_model import ending_anywhere_copy
from trainer.config.schema import EnvDatasetConfig
from trainer.data.env_rows import environment_rows
from trainer.models import prepare

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = str(REPO / "examples" / "verifiers")
ENVS = {"vf-calc": {"num_examples": 8}, "vf-guess": {"num_examples": 8, "max_turns": 4}}
GRID = f"{sys.executable} -m examples.openenv.grid_env.server --port {{port}}"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.heavy(minutes=3),  # a training run: make test-heavy
    pytest.mark.skipif(
        not Path(verifiers_python()).is_relative_to(REPO / ".venv-verifiers")
        and "AGENTLOOP_VERIFIERS_PYTHON" not in os.environ,
        reason="verifiers is not installed: `make verifiers` makes .venv-verifiers",
    ),
]


def _run(command: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("environments")
    model = ending_anywhere_copy(prepare("tiny-qwen3"), d / "model", end_prob=0.3)
    rows = []
    for env_id, args in ENVS.items():
        config = EnvDatasetConfig(verifiers=env_id, env_args=args, paths=[EXAMPLES], train_size=2)
        (path,) = environment_rows(config, "train", d / env_id)
        rows += [json.loads(line) for line in Path(path).read_text().splitlines()]
    system = "Walk the agent A to the goal G. Answer with one move: up, down, left or right."
    rows += [
        {
            "prompt": [{"role": "system", "content": system}],
            "agent_name": "grid",
            "data_source": "openenv/grid",
            "extra_info": {"index": seed},
        }
        for seed in (3, 8)
    ]
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    grid = {"command": GRID, "action": "tests.e2e.env_helpers:move_of", "max_steps": 4}
    loops = [{"name": "grid", "_target_": "agentloop.envs.OpenEnvAgentLoop", "openenv": grid}]
    (d / "loops.yaml").write_text(yaml.safe_dump(loops))
    common = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={d / 'rows.jsonl'}",
        "data.max_prompt_length=1024",
        "actor_rollout_ref.rollout.response_length=384",
        "actor_rollout_ref.rollout.n=2",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={d / 'loops.yaml'}",
        f"actor_rollout_ref.rollout.gateway.log_dir={d / 'gateway'}",
    ]
    train_dir = d / "train"
    train = _run(
        [
            sys.executable,
            "-m",
            "trainer.cli.train",
            *common,
            f"data.train_batch_size={len(rows)}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={len(rows)}",
            "trainer.total_training_steps=1",
            "trainer.n_gpus_per_node=1",
            "trainer.logger=[console,jsonl]",
            f"trainer.default_local_dir={train_dir}",
            f"trainer.rollout_data_dir={d / 'rollouts'}",  # the step's samples, as verl's key
        ]
    )
    lines = (d / "rollouts" / "1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {"dir": d, "records": records, "train": train, "rows": rows}


def own_score(d: Path, record: dict, row: dict) -> dict:
    """The verifiers environment's rubric on the completion the sample's session produced."""
    env = row["verifiers"]
    result = json.loads(
        (d / "gateway" / record["session_id"] / "verifiers_result.json").read_text()
    )
    given = d / f"score_{record['session_id']}.json"
    given.write_text(json.dumps({"row": row, "completion": result["completion"]}))
    spec = VerifiersSpec(env_id=env["env_id"], env_args=env["env_args"], paths=(EXAMPLES,))
    return json.loads(spec.run("score", "--in", str(given)))


def replay(seed: int, calls: list[dict]) -> list[float]:
    """The grid's own rewards for the sample's accepted moves, from ``reset(seed)``."""
    from examples.openenv.grid_env.models import GridAction
    from examples.openenv.grid_env.server import GridEnvironment

    env = GridEnvironment()
    env.reset(seed=seed)
    return [float(env.step(GridAction(**c["arguments"])).reward) for c in calls if c["ok"]]


def test_verifiers_samples_score_as_the_environments_own_evaluation(run):
    records = [r for r in run["records"] if r["agent_name"] == "verifiers"]
    assert len(records) == 2 * 2 * 2  # 2 environments x 2 rows x n=2, one segment each
    for record in records:
        row = run["rows"][record["index"]]  # rows without extra_info.index: their position
        assert row["data_source"] == record["data_source"]
        own = own_score(run["dir"], record, row)
        assert record["score"] == pytest.approx(own["reward"])
        parts = {k.removeprefix("env/"): v for k, v in record["scores"].items() if "/" in k}
        assert parts == pytest.approx(own["scores"])
        assert record["stop_reason"] != "agent_error"
    guess = [r for r in records if r["data_source"] == "verifiers/vf-guess"]
    assert max(r["num_turns"] for r in guess) > 2  # the environment answered model turns


def test_grid_samples_score_the_rewards_the_grid_gives_their_moves(run):
    records = [r for r in run["records"] if r["agent_name"] == "grid"]
    assert len(records) == 2 * 2
    for record in records:
        rewards = replay(record["index"], record["calls"])
        assert [c["reward"] for c in record["calls"] if c["ok"]] == pytest.approx(rewards)
        assert record["score"] == pytest.approx(sum(rewards))
        assert record["tool_errors"] == sum(not c["ok"] for c in record["calls"])
    assert sum(len(r["calls"]) for r in records) > len(records)  # episodes of several steps


def test_one_grpo_step_trains_on_every_environment(run):
    lines = (run["dir"] / "train" / "metrics.jsonl").read_text().splitlines()
    (step,) = [m for m in map(json.loads, lines) if m["step"] == 1]
    assert step["training/global_step"] == 1
    assert "actor/pg_loss" in step
    assert {"reward/env/correct_answer", "reward/env/solved"} <= set(step)
    # the environments' state: verifiers' turns and tool calls, the grid's steps and return
    state = {"turns", "tool_calls", "steps", "return"}
    assert {f"agent_loop/env/{k}/mean" for k in state} <= set(step)
    assert step["agent_loop/env/steps/mean"] >= 1

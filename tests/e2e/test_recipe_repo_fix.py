"""The repo_fix recipe end to end, with the coding CLIs as shipped beside the native agent.

One GRPO step of the run script trains a batch that mixes the three ways of working a task:
``tool_agent`` with the workspace tools, Claude Code and Codex (``harness_loops.yaml``), each
sample in a fresh sandboxed copy of its package and rewarded by the package's pytest check.
The samples carry roles (the tool_agent's from its row, the CLIs' from the gateway's
``role_from_model``), and the step reports each role's samples and reward.
The CLIs' first prompts (~12k and ~8.5k tokens) pass tiny-qwen3's 8,192-token window, so the
model is ``tiny-qwen3-long`` (the same weights, Qwen3's 40,960), made to end its turns
(tests/turn_ending_model.py): Claude Code retries a reply cut at its token limit and then
fails, so a model whose turns never end would fail every CLI sample. ``agentloop-rollout``
scoring the CLIs on held-out tasks, token by token, is in
tests/integration/trainer/test_rollout_cli.py.

The SFT warm start is left out (``SFT_STEPS=0``, one whole command start less): the script's
SFT call is checked in tests/unit/recipes/test_run_scripts.py, its rows encode in
tests/unit/recipes/test_repo_fix.py, and a run script's SFT export feeding GRPO runs for real
in test_recipe_langgraph.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentloop.gateway.harness import HarnessNotInstalled, HarnessSpec, resolve_binary
from recipes.paired import by_row, read_dump
from recipes.repo_fix.compare import buggy_module, habits
from tests.e2e.run_script import make_data, run_script
from tests.turn_ending_model import ending_anywhere_copy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OLD_WINDOW = 8192  # tiny-qwen3's
LOOPS = "recipes/repo_fix/harness_loops.yaml"
PROMPT_LEN = 16384
CLIS = {"claude_code": "claude-code", "codex": "codex"}


@pytest.fixture(scope="module")
def clis() -> None:
    for name in CLIS.values():
        try:
            resolve_binary(HarnessSpec.of(name))
        except HarnessNotInstalled as e:
            pytest.skip(f"the harness CLIs are not installed (make harnesses needs npm): {e}")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """16 train and 2 val tasks; ``mixed.jsonl``: a train task for each way of working it."""
    data = tmp_path_factory.mktemp("repo_fix") / "data"
    make_data("recipes.repo_fix.make_tasks", "--out", str(data), "--train", "16", "--val", "2")
    train = [json.loads(line) for line in (data / "train.jsonl").open()]
    agents = ["tool_agent", *CLIS]
    mixed = [{**r, "agent_name": a} for r, a in zip(train, agents, strict=False)]
    mixed[0]["role"] = "native"  # a row's role (the CLIs' come from the gateway: below)
    write_rows(data / "mixed.jsonl", mixed)
    return data


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from trainer.models import prepare

    return ending_anywhere_copy(prepare("tiny-qwen3-long"), tmp_path_factory.mktemp("m") / "m")


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_one_grpo_step_trains_tool_agent_claude_code_and_codex_samples_together(
    clis, data, model, tmp_path
):
    run = tmp_path / "run"
    proc = run_script(
        "recipes/repo_fix/run_cpu.sh",
        data,
        run,
        f"data.train_files={data / 'mixed.jsonl'}",
        "data.train_batch_size=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        # every sample scores 0 here, so the update would skip them all (advantage 0): computed,
        # their log-probs are checked against the engine's below
        "actor_rollout_ref.actor.skip_zero_advantage_rows=false",
        "trainer.test_freq=-1",  # the script's validation before training only (suite time)
        f"trainer.validation_data_dir={tmp_path / 'val'}",
        "actor_rollout_ref.rollout.gateway.role_from_model=true",
        MODEL=str(model),
        SFT_STEPS="0",
        LOOPS=LOOPS,
        PROMPT_LEN=str(PROMPT_LEN),
    )
    assert "SFT warm start" not in proc.stdout and not (run / "sft").exists()
    records = [
        json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if "workspace/check_s/mean" in r and "reward/rule" in r]
    assert [r["step"] for r in train] == [1]
    step = train[0]
    # 3 tasks x 2 samples: the tool_agent's 2 in the worker's workspace hook, the CLIs' 4 as
    # gateway sessions (a Claude Code session has a second segment when the model's first
    # reply is empty: tests/integration/trainer/test_rollout_cli.py)
    assert step["workspace/samples"] == 2
    assert step["agent_loop/sessions"] == 6
    assert step["agent_loop/samples"] == 6 * step["agent_loop/segments_per_session/mean"]
    assert step["prompt_length/max"] > OLD_WINDOW  # Claude Code's prompt
    # an untrained tiny model fixes nothing: every check ran and failed, no sample erred
    assert step["reward/rule"] == 0.0 and step["reward/errors"] == 0
    assert step["agent_loop/zero_weight_samples"] == 0
    # the trainer's recomputed log-probs of the sampled tokens are the engine's
    assert step["rollout/logprob_gap_max"] < 1e-3
    # per-role groups in a real run: the tool_agent's role from its row, each CLI segment's
    # from the `model` its first request named (the gateway's served name, "agentloop")
    roles = {k: v for k, v in step.items() if k.startswith("role/")}
    cli_samples = step["agent_loop/samples"] - 2
    assert roles == {
        "role/native/samples": 2,
        "role/native/reward/mean": 0.0,
        "role/agentloop/samples": cli_samples,
        "role/agentloop/reward/mean": 0.0,
    }
    vals = [r for r in records if "val/repo_fix/reward/mean" in r]
    assert [r["step"] for r in vals] == [0]
    # the validation dump, read as recipes.repo_fix.compare reads it: the held-out tasks once each
    dumped = read_dump(tmp_path / "val" / "0.jsonl")
    assert sorted(by_row(dumped)) == [0, 1]
    seen = habits(dumped)
    assert seen.samples == 2 and seen.pass_rate == vals[0]["val/repo_fix/reward/mean"]
    assert seen.tool_calls == sum(len(r["calls"]) for r in dumped) / 2
    # the dumped prompt holds the problem's lines, so the first read can be judged
    assert all(buggy_module(r["prompt_text"]) for r in dumped)
    transcripts = sorted((run / "grpo" / "gateway").glob("*/transcript.txt"))
    assert len(transcripts) == 4

"""The async options that were only tested for their config errors, in one real run: tiny-qwen3
on one vLLM CPU server, Ray local, one trainer rank, ``agentloop-train`` as a user runs it.

Staleness 2 with a push every 3 steps (the setting that used to wait forever at step 4, once
the push made every untrained group newer than the old cap), ``filter_groups`` (the reward
scores every sample of an even prompt alike, so its group is dropped and refilled),
``use_rollout_log_probs`` (no recompute; the loss reports the engine/trainer mismatch),
``partial_rollout=inflight`` (running turns stay in the engine through a push: none aborted,
none prefilled again; ``partial_rollout=False`` is unit-tested), delta weight sync (the
weights whole at the first push and every third, only what changed between, the server's
checksum equal to the trainer's at each), and ``require_batches=1``
with ``total_epochs=2`` (the step count follows the step's group count: 2 epochs x 8
prompts / 2 per step = 8 steps, where it used to be 4).

Validation every 4 steps runs while the stream generates: step 4 falls between pushes, so the
step's weights are pushed first, and its greedy answers equal ``agentloop-rollout +split=val``
(a sync validation) on the step-4 checkpoint's export, and ``agentloop-train trainer.val_only=True``
resuming the step-4 checkpoint (which trains nothing and saves nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROWS, EPOCHS, PER_STEP, STALENESS, PUSH_EVERY = 8, 2, 2, 2, 3
STEPS = EPOCHS * ROWS // PER_STEP
VAL_ROWS, TEST_FREQ = 4, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("async_options")
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Say the number {i}."}],
            "data_source": "numbers",
            "reward_model": {"ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(ROWS)
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = [
        {
            "prompt": [{"role": "user", "content": f"Count to {i + 3}."}],
            "data_source": "val",
            "reward_model": {"ground_truth": "0"},
            "extra_info": {"index": 100 + i},
        }
        for i in range(VAL_ROWS)
    ]
    (d / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    (d / "reward.py").write_text(
        "import json, os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    if data_source == 'val':  # what validation answered, in the order scored\n"
        "        with open(os.environ['VAL_ANSWERS'], 'a') as f:\n"
        "            f.write(json.dumps([extra_info['index'], solution_str]) + '\\n')\n"
        "        return 0.0\n"
        "    if int(ground_truth) % 2 == 0:\n"
        "        return 1.0  # every sample alike: filter_groups drops the group\n"
        "    return (len(solution_str) % 7) / 6.0\n"
    )
    run_dir = d / "run"
    command = [
        sys.executable,
        "-m",
        "trainer.cli.train",
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={d / 'train.jsonl'}",
        "data.train_batch_size=4",
        "data.shuffle=False",
        f"custom_reward_function.path={d / 'reward.py'}",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.response_length=16",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PER_STEP}",
        "actor_rollout_ref.actor.optim.lr=5e-3",  # each step changes the greedy answers
        "trainer.n_gpus_per_node=1",
        f"trainer.total_epochs={EPOCHS}",
        f"data.val_files={d / 'val.jsonl'}",
        f"trainer.test_freq={TEST_FREQ}",
        "trainer.val_before_train=True",  # the base weights' answers: the control
        f"trainer.save_freq={TEST_FREQ}",
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={run_dir}",
        "async_training.enable=True",
        f"async_training.staleness_threshold={STALENESS}",
        f"async_training.trigger_parameter_sync_step={PUSH_EVERY}",
        "async_training.require_batches=1",
        "async_training.use_rollout_log_probs=True",
        "async_training.partial_rollout=inflight",
        "algorithm.filter_groups.enable=True",
        "trainer.weight_sync_delta.enable=True",
        "trainer.weight_sync_delta.full_every=3",
    ]
    output = _run(command, run_dir / "val_answers.jsonl")
    # The sync side: the step-4 export validated alone, by agentloop-rollout +split=val.
    export = run_dir / f"global_step_{TEST_FREQ}" / "actor" / "huggingface"
    sync = [
        sys.executable,
        "-m",
        "trainer.cli.rollout",
        f"actor_rollout_ref.model.path={export}",
        f"data.val_files={d / 'val.jsonl'}",
        f"custom_reward_function.path={d / 'reward.py'}",
        "actor_rollout_ref.rollout.response_length=16",
        f"+output={d / 'sync_val.jsonl'}",
        "+split=val",
    ]
    _run(sync, d / "sync_val_answers.jsonl")
    # verl's spelling: the run's own command with trainer.val_only=True, resuming step 4.
    val_only = [
        *(a for a in command if not a.startswith("trainer.default_local_dir=")),
        f"trainer.default_local_dir={d / 'val_only'}",
        "trainer.val_only=True",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={run_dir / f'global_step_{TEST_FREQ}'}",
        f"trainer.validation_data_dir={d / 'val_only' / 'samples'}",
    ]
    printed = _run(val_only, d / "val_only_answers.jsonl")
    assert "validated (trainer.val_only): val/reward/mean 0.0000" in printed, printed[-2000:]
    return run_dir, output


def _run(command: list[str], answers: Path) -> str:
    """Run a CLI command of the project; the reward writes validation answers to ``answers``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VAL_ANSWERS": str(answers),
    }
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_every_step_runs_with_pushes_every_3_steps_within_the_bound(run):
    run_dir, output = run
    steps = [m for m in metrics(run_dir) if m["step"] > 0]  # step 0: validation before training
    assert [m["training/global_step"] for m in steps] == list(range(1, STEPS + 1))
    pushed = [int(m["training/global_step"]) for m in steps if "timing_s/weight_sync" in m]
    assert pushed == [3, 4, 6, 8]  # every 3 steps, before step 4's validation, after the last
    pushes = [m for m in steps if "timing_s/weight_sync" in m]
    assert all(m["weight_sync/servers_delta"] == 1 for m in pushes)
    assert [m["weight_sync/whole_servers"] for m in pushes] == [1, 0, 0, 1]  # full_every=3
    assert max(m["rollout/staleness_max"] for m in steps) <= STALENESS
    assert any("async/turns_kept" in m for m in steps)  # in-flight pushes
    assert not any("async/turns_aborted" in m for m in steps)
    assert all(m["rollout/reprefilled_tokens"] == 0 for m in steps)
    assert all(m["rollout/resumed_turns"] == 0 for m in steps)
    assert all("rollout_corr/kl" in m for m in steps)  # from the loss, in bypass mode
    assert not any("timing_s/old_log_prob" in m for m in steps)  # the engine's log-probs
    for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines():
        entry = json.loads(line)
        assert all(entry["step"] - 1 - v <= STALENESS for v in entry["admitted_versions"])
    assert (
        f"async training: staleness <= {STALENESS}, weights pushed every {PUSH_EVERY} step(s), "
        "old log-probs from the engine; rollout_correction=none"
    ) in output


def test_filtered_groups_are_dropped_and_refilled_and_no_prompt_trains_twice(run):
    run_dir, _ = run
    entries = [json.loads(x) for x in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]
    keys = [tuple(k) for e in entries for k in e["prompts"]]
    assert len(keys) == STEPS * PER_STEP and len(set(keys)) == len(keys)
    assert all(position % 2 == 1 for _, position in keys)  # even prompts scored alike
    assert metrics(run_dir)[-1]["async/groups_dropped"] > 0


def _answers(path: Path) -> list[dict[int, str]]:
    """Validation answers per validation pass (each pass scores every row once, in turn)."""
    passes: list[dict[int, str]] = []
    for line in path.read_text().splitlines():
        index, text = json.loads(line)
        if not passes or index in passes[-1]:
            passes.append({})
        passes[-1][index] = text
    return passes


def test_validation_during_the_stream_equals_a_sync_validation_at_the_same_weights(run):
    run_dir, _ = run
    validated = [m for m in metrics(run_dir) if "val/reward/mean" in m]
    assert [m["step"] for m in validated] == [0, 4, 8]
    assert [m["val/weights_version"] for m in validated] == [0.0, 4.0, 8.0]
    before, at_4, _ = _answers(run_dir / "val_answers.jsonl")
    (sync,) = _answers(run_dir.parent / "sync_val_answers.jsonl")
    assert sorted(sync) == [100 + i for i in range(VAL_ROWS)]
    assert at_4 == sync  # step 4's weights, greedy: the same answers, token for token
    # trainer.val_only on the resumed step-4 checkpoint: the same answers, and nothing trained
    (val_only,) = _answers(run_dir.parent / "val_only_answers.jsonl")
    assert val_only == sync
    samples = run_dir.parent / "val_only" / "samples"
    assert [p.name for p in samples.iterdir()] == [f"{TEST_FREQ}.jsonl"]
    logged = metrics(run_dir.parent / "val_only")
    assert [m["step"] for m in logged] == [TEST_FREQ] and "val/reward/mean" in logged[0]
    assert not list((run_dir.parent / "val_only").glob("global_step_*"))
    # the control: the base weights answer otherwise, so the equality is not vacuous (step 8's
    # answers were the control before; a collapsing tiny model can repeat step 4's)
    assert before != sync

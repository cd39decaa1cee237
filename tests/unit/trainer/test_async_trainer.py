"""``RayPPOTrainer`` on an ``AsyncRollout`` in one process against the stand-ins of
``test_train_step`` (the real policy math on a tiny Qwen3, a real ``RewardManager``) and a
scripted rollout stream whose samples depend only on the prompt and ``rollout_n``, so the sync
and async sources give the same samples. Proves: staleness 0 equals the sync trainer (weights
after 3 GRPO steps within 1e-6); staleness 1 trains every prompt once within the bound; a
checkpoint taken while groups are in flight resumes with exactly the untrained prompts; the
start-up errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from agentloop import AgentLoopOutput, FinishedGroup, RolloutBatch, collate, rollout_metrics
from agentloop.manager import expand_rows
from agentloop.records import SampleRecord
from tests.unit.trainer.test_train_step import (
    OneProcessPolicy,
    RecordingWeightSync,
    make_config,
)
from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.config.async_training import AsyncTrainingConfig
from trainer.config.schema import Config
from trainer.data.sampler import PromptSampler
from trainer.loop.assembly import RunParts
from trainer.loop.async_rollout import AsyncRollout, no_signal, staleness_metrics
from trainer.loop.checkpoint import CheckpointManager
from trainer.loop.ray_trainer import RayPPOTrainer
from trainer.metrics.tracking import Tracking
from trainer.rewards import RewardManager

PROMPTS, N, STEPS = 4, 2, 3


def scripted_output(index: int, k: int, version: int = 0) -> AgentLoopOutput:
    """A model turn, a tool response (mask 0), a second model turn; lengths differ per k."""
    g = torch.Generator().manual_seed(100 * index + k)
    first, tool, second = 2 + (index + k) % 4, 2, 1 + k % 3
    plen = 3 + index % 3
    ids = torch.randint(33, 120, (plen + first + tool + second,), generator=g).tolist()
    mask = [1] * first + [0] * tool + [1] * second
    return AgentLoopOutput(
        prompt_ids=ids[:plen],
        response_ids=ids[plen:],
        response_mask=mask,
        response_log_probs=[-0.5 - 0.1 * j if m else 0.0 for j, m in enumerate(mask)],
        num_turns=3,
        metrics={"generate_s": 0.1, "tool_s": 0.05, "total_s": 0.15},
        response_versions=[version if m else -1 for m in mask],
    )


class ScriptedManager:
    """Sync rollout (``generate_sequences``) of the scripted samples."""

    def __init__(self, config: Config) -> None:
        self.config = config.actor_rollout_ref.rollout
        self.shut_down = False

    def _collate(self, samples: list[dict[str, Any]], version: int = 0) -> RolloutBatch:
        outputs = [
            scripted_output(s["extra_info"]["index"], s["rollout_n"], version) for s in samples
        ]
        batch = collate(
            outputs,
            samples,
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            pad_token_id=0,
        )
        batch.metrics = rollout_metrics(outputs, 0.1)
        return batch

    def generate_sequences(self, rows, *, n=None, sampling_params=None, trace=None):
        samples = expand_rows(rows, n or self.config.n, "single_turn_agent")
        return self._collate(samples)

    def shutdown(self) -> None:
        self.shut_down = True


class ScriptedStream:
    """``RolloutStream`` stand-in: a group finishes at the poll after the one that saw it
    submitted, its tokens stamped with the version the stream held at submission."""

    def __init__(self, manager: ScriptedManager) -> None:
        self.manager = manager
        self.version = 0
        self.submitted: list[tuple[Any, list[dict[str, Any]], int]] = []
        self._seen: list[tuple[Any, list[dict[str, Any]], int]] = []
        self.pauses: list[bool] = []

    @property
    def in_flight(self) -> int:
        return len(self.submitted) + len(self._seen)

    def submit(self, key, row, *, n=None, trace=None) -> None:
        samples = expand_rows([row], n or self.manager.config.n, "single_turn_agent")
        self.submitted.append((key, samples, self.version))

    def poll(self, timeout: float) -> list[FinishedGroup]:
        done, self._seen, self.submitted = self._seen, self.submitted, []
        out = []
        for key, samples, version in done:
            batch = self.manager._collate(samples, version)
            outputs = [scripted_output(s["extra_info"]["index"], s["rollout_n"]) for s in samples]
            out.append(FinishedGroup(key, batch, outputs))
        return out

    def pause(self, *, abort: bool, keep: bool = False) -> int:
        self.pauses.append(abort)
        return 0

    def heal_if_due(self, version: int | None = None) -> int:
        return 0

    def counters(self) -> dict[str, int]:
        return {"server_restarts": 0, "requests_retried": 0, "resumed_turns": 0}

    def resume(self, version: int) -> None:
        self.version = version


def rows(count: int) -> list[dict[str, Any]]:
    return [
        {
            "raw_prompt": [{"role": "user", "content": f"question {i}"}],
            "data_source": "toy",
            "reward_model": {"ground_truth": "-"},
            "extra_info": {"index": i},
        }
        for i in range(count)
    ]


class Built:
    def __init__(
        self,
        tmp_path: Path,
        tokenizer: Any,
        async_cfg: AsyncTrainingConfig | None,
        *,
        steps: int | None = STEPS,
        epochs: int = 1,
    ):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.config = config = make_config(tmp_path, Path(tokenizer.name_or_path))
        config.trainer.total_training_steps = steps
        config.trainer.total_epochs = epochs
        config.actor_rollout_ref.actor.checkpoint.save_contents = ["extra"]  # no ranks here
        if async_cfg is not None:
            config.async_training = async_cfg
        config.check()
        torch.manual_seed(0)
        self.model = tiny_qwen3()
        events: list[str] = []
        self.manager = ScriptedManager(config)
        self.policy = OneProcessPolicy(self.model, config.actor_rollout_ref.actor, events)
        self.sync = RecordingWeightSync(self.model, events)
        run = config.trainer
        self.checkpoints = CheckpointManager(run.default_local_dir)
        parts = RunParts(
            manager=self.manager,  # type: ignore[arg-type]
            servers=[],
            workers=self.policy,  # type: ignore[arg-type]
            rewards=RewardManager(config.custom_reward_function, config.reward_model, tokenizer),
            judge_servers=[],
            user_servers=[],
            sync=self.sync,  # type: ignore[arg-type]
            tracking=Tracking(
                run.logger,
                project=run.project_name,
                experiment=run.experiment_name,
                run_dir=self.checkpoints.root,
            ),
            checkpoints=self.checkpoints,
        )
        self.sampler = PromptSampler(rows(STEPS * PROMPTS), PROMPTS, shuffle=False)
        self.trained: list[list[int]] = []
        if async_cfg is None:
            self.trainer = RayPPOTrainer(config, parts, self.sampler)
        else:
            self.stream = ScriptedStream(self.manager)
            self.rollout = AsyncRollout(config, parts, self.sampler, stream=self.stream)  # type: ignore[arg-type]
            self.trainer = RayPPOTrainer(config, parts, self.sampler, rollout=self.rollout)
        update = self.trainer.update

        def recorded(step, rollout, reward, **kwargs):
            self.trained.append(sorted({r["extra_info"]["index"] for r in rollout.rows}))
            return update(step, rollout, reward, **kwargs)

        self.trainer.update = recorded  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_qwen3_path)


def test_staleness_0_async_trainer_equals_the_sync_trainer(tmp_path, tokenizer):
    sync = Built(tmp_path / "sync", tokenizer, None)
    sync_metrics = [sync.trainer.train_step(k) for k in range(1, STEPS + 1)]
    sync.trainer.close()
    run = Built(
        tmp_path / "async", tokenizer, AsyncTrainingConfig(enable=True, staleness_threshold=0)
    )
    async_metrics = [run.trainer.train_step(k) for k in range(1, STEPS + 1)]
    run.trainer.close()

    assert run.trained == sync.trained == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(
            run.model.state_dict().values(), sync.model.state_dict().values(), strict=True
        )
    )
    assert diff <= 1e-6, diff
    assert any(
        not torch.equal(a, b)
        for a, b in zip(
            run.model.state_dict().values(), tiny_qwen3().state_dict().values(), strict=True
        )
    )
    for s, a in zip(sync_metrics, async_metrics, strict=True):
        assert a["reward/mean"] == pytest.approx(s["reward/mean"])
        assert a["actor/pg_loss"] == pytest.approx(s["actor/pg_loss"], abs=1e-6)
        assert a["rollout/staleness_max"] == 0.0
        for key in ("critic/score/mean", "response_length/mean", "prompt_length/max"):
            assert a[key] == pytest.approx(s[key]), key  # verl's names, from the same batch
        assert a["training/global_step"] == s["training/global_step"]
        assert a["training/epoch"] == s["training/epoch"] == 0.0
    assert len(run.sync.pushed) == STEPS and run.stream.pauses == [True] * STEPS


def test_staleness_1_trains_every_prompt_once_within_the_bound(tmp_path, tokenizer):
    run = Built(tmp_path, tokenizer, AsyncTrainingConfig(enable=True, staleness_threshold=1))
    metrics = [run.trainer.train_step(k) for k in range(1, STEPS + 1)]
    run.trainer.close()

    assert sorted(i for step in run.trained for i in step) == list(range(STEPS * PROMPTS))
    # step 2 trains the rest of version 0; step 3 the groups admitted at version 1, whose
    # tokens carry 1 or 2 (the producer may submit them after the second push)
    lags = [m["rollout/staleness_max"] for m in metrics]
    assert lags[:2] == [0.0, 1.0] and lags[2] <= 1.0
    # two steps' worth were admitted before the first update: the stream never waited
    assert metrics[0]["async/groups_in_flight"] + metrics[0]["async/groups_ready"] == PROMPTS


def test_a_checkpoint_with_groups_in_flight_resumes_with_exactly_the_untrained_prompts(
    tmp_path, tokenizer
):
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=1)
    first = Built(tmp_path, tokenizer, cfg)
    first.trainer.train_step(1)
    first.trainer._save(1)
    first.trainer.close()  # as if the driver died here, with step 2's groups in flight
    saved = first.checkpoints.latest()
    assert saved is not None
    state = CheckpointManager.load_state(saved)["sampler"]
    # two steps' worth admitted, step 1 trained the four scored first (scoring runs beside)
    untrained = sorted(set(range(2 * PROMPTS)) - set(first.trained[0]))
    assert len(untrained) == PROMPTS and state["requeued"] == [[0, i] for i in untrained]

    second = Built(tmp_path, tokenizer, cfg)
    second.sampler.load_state_dict(state)
    second.rollout.restore_position(1)  # what _resume does after loading the checkpoint
    for k in (2, 3):
        second.trainer.train_step(k)
    second.trainer.close()
    lineage = first.trained + second.trained
    assert sorted(i for step in lineage for i in step) == list(range(STEPS * PROMPTS))
    assert second.sampler.offset == STEPS * PROMPTS  # nothing drawn past the last step


def test_staleness_metrics_measure_the_oldest_token_of_each_sample():
    versions = torch.tensor([[2, 2, -1, 3], [3, 3, -1, -1], [-1, 1, 3, -1]])
    batch = type("B", (), {"rollout_versions": versions})()
    m = staleness_metrics(batch, 3)  # type: ignore[arg-type]
    assert m == {
        "rollout/staleness_mean": pytest.approx((1 + 0 + 2) / 3),
        "rollout/staleness_max": 2.0,
        "rollout/mixed_version_frac": pytest.approx(2 / 3),
    }


def _group(scores: list[float], segment: list[int], weights: list[float]):
    """A collated group whose samples are sessions (segment 0) and their segments."""
    sessions: list[AgentLoopOutput] = []
    for j, w in zip(segment, weights, strict=True):
        sample = AgentLoopOutput([1], [2], [1], [0.0], 2, record=SampleRecord(weight=w))
        if j == 0:
            sessions.append(sample)
        else:
            sessions[-1].segments.append(sample)
    rows = [{"uid": "g", "agent_name": "gw"} for _ in sessions]
    batch = collate(sessions, rows, prompt_length=1, response_length=1, pad_token_id=0)
    return batch, torch.tensor(scores)


@pytest.mark.parametrize(
    "scores,segment,weights,dropped",
    [
        ([1.0, 1.0], [0, 0], [1.0, 1.0], True),  # two sessions scored alike
        ([1.0, 0.0], [0, 0], [1.0, 1.0], False),
        ([1.0], [0], [1.0], False),  # one session: nothing to filter
        ([1.0, 1.0, 1.0], [0, 1, 2], [1 / 3] * 3, False),  # one session in three segments
        ([1.0, 1.0, 1.0], [0, 1, 0], [0.5, 0.5, 1.0], True),
        ([1.0, 0.0, 1.0], [0, 0, 0], [1.0, 0.0, 1.0], True),  # the odd one was dropped
    ],
)
def test_filter_groups_counts_sessions_and_leaves_out_weight_zero(
    scores, segment, weights, dropped
):
    assert no_signal(*_group(scores, segment, weights)) is dropped


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"staleness_threshold": -1},
            "async_training.staleness_threshold must be >= 0 (0: on-policy, 1: a sample may "
            "come from the weights one update behind)",
        ),
        (
            {"staleness_threshold": 0, "trigger_parameter_sync_step": 2},
            "async_training.trigger_parameter_sync_step=2 leaves the servers up to 1 update(s) "
            "behind, more than staleness_threshold=0 allows: raise staleness_threshold to >= 1 "
            "or lower trigger_parameter_sync_step",
        ),
        ({"require_batches": 0}, "async_training.require_batches must be >= 1 (or null)"),
        (
            {"partial_rollout": "keep"},
            "async_training.partial_rollout='keep' is not supported; use true (abort and "
            "continue), false (let running turns finish) or inflight",
        ),
        (
            {"recompute_kv_cache_after_weight_updates": True},
            "async_training.recompute_kv_cache_after_weight_updates=True acts on the turns an "
            "in-flight update keeps running: set async_training.partial_rollout=inflight",
        ),
    ],
)
def test_bad_async_keys_are_start_up_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        AsyncTrainingConfig(enable=True, **kwargs)
    assert str(info.value) == message


def _config(tmp_path: Path, tokenizer: Any, **changes: Any) -> Config:
    config = make_config(tmp_path, Path(tokenizer.name_or_path))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target: Any = config
        for name in parents:
            target = getattr(target, name)
        setattr(target, leaf, value)
    return config


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {
                "async_training__use_rollout_log_probs": True,
                "algorithm__rollout_correction__mode": "tis",
            },
            "async_training.use_rollout_log_probs=True makes the old policy the engine's, so "
            "algorithm.rollout_correction.mode=tis's importance weights have nothing to correct "
            "(every weight is 1): set one of them off",
        ),
        (
            {
                "async_training__enable": True,
                "async_training__partial_rollout": "inflight",
                "actor_rollout_ref__rollout__engine__backend": "sglang",
            },
            "async_training.partial_rollout=inflight loads weights under running vLLM requests; "
            "rollout.name=sglang cannot: set actor_rollout_ref.rollout.name=vllm, or "
            "partial_rollout=true",
        ),
        (
            {
                "async_training__enable": True,
                "async_training__partial_rollout": "inflight",
                "actor_rollout_ref__rollout__engine__weight_transfer": "nccl",
            },
            "async_training.partial_rollout=inflight loads the host route's buckets between "
            "decode steps; actor_rollout_ref.rollout.weight_transfer=nccl cannot pause there: "
            "set weight_transfer=host, or partial_rollout=true",
        ),
        (
            {"algorithm__filter_groups__enable": True},
            "algorithm.filter_groups.enable=True refills dropped groups from the rollout stream: "
            "set async_training.enable=True (staleness_threshold=0 keeps it on-policy)",
        ),
        (
            {
                "async_training__enable": True,
                "algorithm__filter_groups__enable": True,
                "algorithm__adv_estimator": "reinforce_plus_plus",
            },
            "algorithm.filter_groups.enable=True drops groups whose samples scored alike, which "
            "only means 'no signal' for group baselines: use algorithm.adv_estimator=grpo or "
            "rloo or reinforce_plus_plus_baseline or opo or grpo_passk or gpg or gigpo, not "
            "reinforce_plus_plus",
        ),
    ],
)
def test_impossible_async_combinations_fail_at_start_up(tmp_path, tokenizer, changes, message):
    config = _config(tmp_path, tokenizer, **changes)
    with pytest.raises(ValueError) as info:
        config.check()
    assert str(info.value) == message


def test_async_training_on_colocated_gpus_fails_at_start_up(tmp_path, tokenizer, monkeypatch):
    """On GPU the servers must own their GPUs to generate while the trainer updates; the
    check runs before any data, checkpoint folder or logger is touched."""
    from trainer.loop.assembly import plan_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    config = _config(tmp_path, tokenizer, async_training__enable=True, trainer__device="cuda")
    assert config.actor_rollout_ref.hybrid_engine
    with pytest.raises(ValueError) as info:
        plan_run(config)
    assert str(info.value) == (
        "async_training.enable=True needs rollout servers on their own GPUs (they generate "
        "while the trainer updates): set actor_rollout_ref.hybrid_engine=False"
    )


def test_a_slow_score_delays_only_its_own_group(tmp_path, tokenizer):
    """Scoring runs beside the producer: while prompt 0's score hangs, step 1 trains four
    other groups (at staleness 2 prompt 0 may wait until step 3)."""
    run = Built(tmp_path, tokenizer, AsyncTrainingConfig(enable=True, staleness_threshold=2))
    release = threading.Event()
    score = run.trainer.rewards.score

    def slow_for_prompt_0(batch):
        if batch.rows[0]["extra_info"]["index"] == 0:
            assert release.wait(timeout=60), "step 1 never ran while prompt 0 was scored"
        return score(batch)

    run.trainer.rewards.score = slow_for_prompt_0  # type: ignore[method-assign]
    run.trainer.train_step(1)
    assert not release.is_set() and 0 not in run.trained[0]
    release.set()
    for k in (2, 3):
        run.trainer.train_step(k)
    run.trainer.close()
    assert sorted(i for step in run.trained for i in step) == list(range(STEPS * PROMPTS))


def test_a_step_that_waits_logs_what_it_waits_for(tmp_path, tokenizer, caplog):
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=0, wait_log_s=0.2)
    run = Built(tmp_path, tokenizer, cfg)
    release = threading.Event()
    score = run.trainer.rewards.score

    def held(batch):
        release.wait(timeout=60)
        return score(batch)

    run.trainer.rewards.score = held  # type: ignore[method-assign]
    threading.Timer(1.5, release.set).start()
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run.trainer.train_step(1)
    run.trainer.close()
    assert "step 1 (trainer version 0, servers at 0, staleness 0) needs 4 groups" in caplog.text
    assert "4 in flight or scoring (v0 x4), 4 of them due now" in caplog.text


def test_a_wait_under_filter_groups_says_how_many_groups_it_dropped(tmp_path, tokenizer, caplog):
    """Prompts 0 and 1 score alike and are dropped (replaced from the stream); the others'
    scores are held: the wait log counts the drops."""
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=0, wait_log_s=0.2)
    run = Built(tmp_path, tokenizer, cfg)
    run.rollout.filter.enable = True
    release = threading.Event()
    score = run.trainer.rewards.score

    def alike_or_held(batch):
        reward = score(batch)
        if batch.rows[0]["extra_info"]["index"] < 2:
            reward.scores = torch.zeros_like(reward.scores)  # no signal: dropped
        else:
            release.wait(timeout=60)
            reward.scores = torch.arange(len(batch), dtype=reward.scores.dtype)
        return reward

    def release_after_the_drops() -> None:  # and a wait log or more after them
        deadline = time.monotonic() + 60
        while run.rollout._dropped_this_step < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        release.set()

    run.trainer.rewards.score = alike_or_held  # type: ignore[method-assign]
    threading.Thread(target=release_after_the_drops, daemon=True).start()
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run.trainer.train_step(1)
    run.trainer.close()
    assert "algorithm.filter_groups dropped 2 group(s) scored alike meanwhile" in caplog.text
    assert 0 not in run.trained[0] and 1 not in run.trained[0]


def test_require_batches_with_total_epochs_trains_the_epochs_asked(tmp_path, tokenizer):
    """12 prompts, 2 epochs, require_batches=1 of ppo_mini_batch_size=2 prompts: 12 steps
    (the step count no longer comes from data.train_batch_size=4, which gave 6)."""
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=1, require_batches=1)
    run = Built(tmp_path, tokenizer, cfg, steps=None, epochs=2)
    assert run.trainer.total_steps == 2 * STEPS * PROMPTS // 2
    run.trainer.close()


def test_the_start_up_notice_says_which_correction_runs(tmp_path, tokenizer, caplog):
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=2, trigger_parameter_sync_step=3)
    with caplog.at_level("INFO", logger="agentloop.train"):
        run = Built(tmp_path, tokenizer, cfg)
    run.trainer.close()
    assert (
        "async training: staleness <= 2, weights pushed every 3 step(s), old log-probs "
        "recomputed by the trainer; rollout_correction=none: samples up to 2 version(s) old "
        "train as if on-policy (algorithm.rollout_correction.rollout_is / rollout_rs, or "
        "mode=tis, corrects them)"
    ) in caplog.text


@pytest.mark.parametrize("killed_after_update_of", [2, 3])
def test_a_kill_between_an_update_and_its_checkpoint_trains_every_prompt_once(
    tmp_path, tokenizer, killed_after_update_of
):
    """The driver dies after step k's update and before its checkpoint (k's groups trained,
    k + 1's in flight): the run resumes from step k - 1's checkpoint and trains step k again
    from the prompts that checkpoint kept."""
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=1)
    first = Built(tmp_path, tokenizer, cfg)
    for k in range(1, killed_after_update_of + 1):
        first.trainer.train_step(k)
        # the producer admits what the push made room for before the next step pushes
        # again, so step k + 1 trains groups one version old (else a race decides)
        deadline = time.monotonic() + 10
        while True:
            with first.rollout._lock:
                if first.rollout.schedule.room() == 0:
                    break
            assert time.monotonic() < deadline, "the producer did not fill the room"
            time.sleep(0.01)
        if k < killed_after_update_of:
            first.trainer._save(k)
    first.trainer.close()
    log = first.checkpoints.root / "trained_prompts.jsonl"
    killed = [json.loads(x) for x in log.read_text().splitlines()][-1]
    assert killed["step"] == killed_after_update_of
    # the killed step trained groups sampled by older weights (staleness >= 1)
    assert min(killed["admitted_versions"]) < killed_after_update_of - 1
    resume_from = killed_after_update_of - 1
    saved = first.checkpoints.latest()
    assert saved is not None and saved.name.endswith(str(resume_from))
    second = Built(tmp_path, tokenizer, cfg)
    second.sampler.load_state_dict(CheckpointManager.load_state(saved)["sampler"])
    second.rollout.restore_position(resume_from)
    for k in range(killed_after_update_of, STEPS + 1):
        second.trainer.train_step(k)
    second.trainer.close()
    lineage = first.trained[:resume_from] + second.trained
    assert sorted(i for step in lineage for i in step) == list(range(STEPS * PROMPTS))


def test_validation_between_pushes_validates_the_steps_weights(tmp_path, tokenizer):
    """A push every 3 steps, validation after step 2: the servers hold version 0, so the
    step's weights are pushed first (and only once); after step 3's own push, none extra."""
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=2, trigger_parameter_sync_step=3)
    run = Built(tmp_path, tokenizer, cfg)
    run.trainer.val_rows = rows(2)
    for k in (1, 2):
        run.trainer.train_step(k)
    assert run.sync.pushed == []
    out = run.trainer._validate(2)
    assert len(run.sync.pushed) == 1 and out["val/weights_version"] == 2.0
    assert "timing_s/weight_sync" in out and "val/reward/mean" in out
    trained = run.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in run.sync.pushed[0].items())
    assert run.trainer._validate(2)["val/weights_version"] == 2.0 and len(run.sync.pushed) == 1
    run.trainer.train_step(3)  # version 3: pushed by the step
    assert run.trainer._validate(3)["val/weights_version"] == 3.0 and len(run.sync.pushed) == 2
    run.trainer.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_requested_stop_ends_the_run_after_its_step_with_a_checkpoint(tmp_path, tokenizer, mode):
    """``request_stop`` (agentloop-train's SIGTERM / SIGINT) during step 2: the run ends after
    step 2 with a checkpoint of it (save_freq never), and the checkpoint resumes from there."""
    cfg = AsyncTrainingConfig(enable=True, staleness_threshold=1) if mode == "async" else None
    run = Built(tmp_path, tokenizer, cfg)
    assert run.config.trainer.save_freq == -1
    update = run.trainer.update

    def stop_in_step_2(step, rollout, reward, **kwargs):
        if step == 2:
            run.trainer.request_stop()
        return update(step, rollout, reward, **kwargs)

    run.trainer.update = stop_in_step_2  # type: ignore[method-assign]
    run.trainer.fit()
    assert run.trainer.stopped_at == 2 and run.trainer.total_steps == STEPS
    assert [p.name for p in sorted(run.checkpoints.root.glob("global_step_*"))] == ["global_step_2"]
    assert CheckpointManager.load_state(run.checkpoints.latest())["step"] == 2
    again = Built(tmp_path, tokenizer, cfg)  # the same command again: resumes at step 2
    again.config.trainer.resume_mode = "auto"
    again.trainer.fit()
    assert again.trainer.stopped_at is None and len(again.trained) == 1  # step 3 only
    trained = sorted(i for step in run.trained + again.trained for i in step)
    assert trained == list(range(STEPS * PROMPTS))  # every prompt once across the two runs

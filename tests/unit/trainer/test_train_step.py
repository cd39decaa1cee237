"""``RayPPOTrainer.train_step`` in one process, on parts that stand in for the Ray ones: a
scripted rollout (hand-made ``AgentLoopOutput``s padded by the real ``collate``), a one-process
policy running the real policy math on a tiny random Qwen3, a real ``RewardManager`` with a
rule reward, and a weight sync that records its pushes. Proves the phase order, the metrics a
step logs, and that the update gets the advantages of the step's scores and groups."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import trainer.loop.advantages
from agentloop import AgentLoopOutput, RolloutBatch, RolloutConfig, TraceContext, collate
from agentloop.batch import rollout_metrics
from agentloop.config import ValKwargsConfig
from agentloop.manager import expand_rows
from agentloop.records import SampleRecord
from servers import ServerRestartError
from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.algos import compute_advantages
from trainer.algos.correction import correct
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig
from trainer.config.reward import RewardFunctionConfig
from trainer.config.rollout_correction import RolloutCorrectionConfig
from trainer.config.run import TrainerConfig
from trainer.config.schema import ActorRolloutRefConfig, Config, DataConfig
from trainer.data.sampler import PromptSampler
from trainer.loop.advantages import credit_groups, gigpo_steps, sample_roles
from trainer.loop.assembly import RunParts, generation_dump
from trainer.loop.checkpoint import CheckpointManager
from trainer.loop.ray_trainer import RayPPOTrainer, stopped_message
from trainer.metrics.tracking import Tracking
from trainer.metrics.validation import validation_metrics
from trainer.rewards import RewardManager
from trainer.workers import TrainBatch
from trainer.workers.batch import pad_for_ranks
from trainer.workers.policy_math import OwnLogProbs, log_probs_in_micro_batches, update_policy

PROMPTS, N, P, R = 4, 2, 8, 12  # prompts per step, samples per prompt, prompt/response budget
STATS = ("mean", "max", "min")
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n" + (
    "    return len(solution_str) / 10\n"
)


# ---- the stand-ins ------------------------------------------------------------------------
class ScriptedRollout:
    """Stands in for ``AgentLoopManager``: sample k answers with a model turn, a tool response
    (mask 0) and a second model turn, of lengths that differ within each group."""

    def __init__(self, config: RolloutConfig, events: list[str]) -> None:
        self.config, self.events = config, events
        self.traces: list[TraceContext | None] = []
        self.params: list[dict[str, Any] | None] = []
        self.batches: list[RolloutBatch] = []
        self.shut_down = False
        self.segments: dict[int, int] = {}
        """Sample index -> further segments its session returns (as a gateway session
        whose agent edited its history), each of weight 1/k of the session's k samples."""
        self.preset: dict[int, float] = {}
        """Sample index -> reward_score its loop set on every one of its samples."""

    def generate_sequences(
        self,
        rows: list[dict[str, Any]],
        *,
        n: int | None = None,
        sampling_params: dict[str, Any] | None = None,
        trace: TraceContext | None = None,
    ) -> RolloutBatch:
        self.events.append("rollout")
        self.traces.append(trace)
        self.params.append(sampling_params)
        samples = expand_rows(rows, n or self.config.n, self.config.default_agent_loop)
        outputs = [self._session(k, len(row["raw_prompt"])) for k, row in enumerate(samples)]
        batch = collate(
            outputs,
            samples,
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            pad_token_id=0,
        )
        batch.metrics = rollout_metrics(outputs, wall_s=0.25)
        batch.metrics |= {"rollout/server_restarts": 0.0, "rollout/requests_retried": 0.0}
        self.batches.append(batch)
        return batch

    def _session(self, k: int, turns: int) -> AgentLoopOutput:
        out = self._output(k, turns)
        out.segments = [
            self._output(k + 100 * j, turns) for j in range(1, 1 + self.segments.get(k, 0))
        ]
        for j, sample in enumerate([out, *out.segments]):
            sample.record.weight = 1 / (1 + len(out.segments))
            sample.record.segment = j
            sample.reward_score = self.preset.get(k)
        return out

    @staticmethod
    def _output(k: int, turns: int) -> AgentLoopOutput:
        g = torch.Generator().manual_seed(k)
        first, tool, second = 2 + k % 4, 2, 1 + k % 3
        ids = torch.randint(33, 120, (3 + k % 3 + first + tool + second,), generator=g).tolist()
        prompt, response = ids[: 3 + k % 3], ids[3 + k % 3 :]
        mask = [1] * first + [0] * tool + [1] * second
        log_probs = [-0.5 - 0.1 * j if m else 0.0 for j, m in enumerate(mask)]
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=response,
            response_mask=mask,
            response_log_probs=log_probs,
            record=SampleRecord(turn_ends=[first - 1, len(mask) - 1], assistant_turns=2),
            num_turns=turns + 3,
            metrics={"generate_s": 0.1 * k, "tool_s": 0.05, "total_s": 0.1 * k + 0.05},
        )

    def shutdown(self) -> None:
        self.shut_down = True


class OneProcessPolicy:
    """Stands in for ``WorkerGroup``: one rank in this process, running the real policy math
    (``trainer.workers.policy_math``) on a whole tiny model, as ``FSDPWorker`` does."""

    def __init__(self, model: torch.nn.Module, actor: ActorConfig, events: list[str]) -> None:
        self.model, self.actor, self.events = model, actor, events
        self.ref_model = copy.deepcopy(model).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=actor.optim.lr)
        self.updates: list[dict[str, Any]] = []
        self.shut_down = False

    def _log_probs(self, model: torch.nn.Module, batch: TrainBatch, entropy: bool):
        model.eval()
        try:
            return log_probs_in_micro_batches(
                model,
                batch,
                micro_batch_size=self.actor.log_prob_micro_batch_size,
                with_entropy=entropy,
            )
        finally:
            model.train()

    def compute_log_prob(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.events.append("old_log_prob")
        return self._log_probs(self.model, batch, entropy=True)

    def compute_ref_log_prob(self, batch: TrainBatch) -> torch.Tensor:
        self.events.append("ref")
        return self._log_probs(self.ref_model, batch, entropy=False)[0]

    def update_actor(self, batch: TrainBatch, seed: int, *, mini_batches: int) -> dict:
        """``WorkerGroup.update_actor`` with one rank: the same layout (``pad_for_ranks``)."""
        self.events.append("update")
        self.updates.append(
            {"batch": batch.select(torch.arange(len(batch))), "mini_batches": mini_batches}
            | {"seed": seed}
        )
        padded, real, per_mini = pad_for_ranks(batch, 1, mini_batches)
        metrics = update_policy(
            self.model,
            self.optimizer,
            None,
            padded,
            self.actor,
            samples_per_mini_batch=per_mini,
            seed=seed,
        )
        return metrics | {"actor/filler_samples": float((~real).sum())}

    def update_actor_on_policy(
        self, batch: TrainBatch, seed: int
    ) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """``WorkerGroup.update_actor_on_policy`` with one rank (one mini-batch: no fillers)."""
        self.events.append("update")
        self.updates.append(
            {"batch": batch.select(torch.arange(len(batch))), "mini_batches": 1, "seed": seed}
        )
        own = OwnLogProbs.zeros(len(batch), batch.response_length)
        metrics = update_policy(
            self.model, self.optimizer, None, batch, self.actor,
            samples_per_mini_batch=len(batch), seed=seed, own=own,
        )  # fmt: skip
        return metrics | {"actor/filler_samples": 0.0}, own.log_probs, own.entropy

    def memory_stats(self) -> list[dict[str, float]]:
        """``WorkerGroup.memory_stats`` of the one rank (``model_state.state_mb``)."""
        from trainer.workers.model_state import state_mb

        trainable, optim = state_mb(self.model, self.optimizer)
        return [
            {
                "rank": 0.0,
                "peak_rss_mb": 1.0,
                "trainable_mb": trainable,
                "grad_mb": trainable,
                "optimizer_mb": optim,
            }
        ]

    def load_checkpoint(self, directory: str) -> dict:
        """A resume: the stand-in's checkpoints hold only the loop's state (save_contents
        ``["extra"]``), so there are no weights to load; the event is recorded."""
        self.events.append("load_checkpoint")
        return {}

    def shutdown(self) -> None:
        self.shut_down = True


class RecordingWeightSync:
    """Stands in for ``WeightSync``: each push keeps a copy of the weights it would send."""

    def __init__(self, model: torch.nn.Module, events: list[str]) -> None:
        self.model, self.events = model, events
        self.pushed: list[dict[str, torch.Tensor]] = []

    def release_servers(self) -> None:
        self.events.append("release_servers")

    def push(self) -> dict[str, float]:
        self.events.append("weight_push")
        self.pushed.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return {
            "timing_s/weight_sync": 0.0,
            "weight_sync/mb": 0.0,
            "weight_sync/version": float(len(self.pushed)),
        }

    def push_to(self, servers: list[Any]) -> None:
        raise AssertionError("no server restarts in these tests")

    def push_start(self) -> None:
        """The servers start with the actor's weights here (no LoRA adapter)."""


# ---- a run of them --------------------------------------------------------------------------


def make_config(
    tmp_path: Path, model_path: Path, reward_source: str = REWARD, **actor: Any
) -> Config:
    reward = tmp_path / "length_reward.py"
    reward.write_text(reward_source)
    return Config(
        data=DataConfig(train_batch_size=PROMPTS, shuffle=False),
        actor_rollout_ref=ActorRolloutRefConfig(
            model=ModelConfig(path=str(model_path)),
            actor=ActorConfig(
                **{"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2}
                | {"optim": OptimConfig(lr=1e-2)}
                | actor
            ),
            rollout=RolloutConfig(n=N, prompt_length=P, response_length=R),
        ),
        custom_reward_function=RewardFunctionConfig(path=str(reward), num_workers=2),
        trainer=TrainerConfig(
            logger=["jsonl"], default_local_dir=str(tmp_path / "run"), resume_mode="disable"
        ),
    )


class Run:
    """A trainer over the stand-ins, with what they record."""

    def __init__(
        self,
        tmp_path: Path,
        tokenizer: Any,
        monkeypatch,
        reward: str = REWARD,
        edit: Any = None,
        policy: type[OneProcessPolicy] = OneProcessPolicy,
        **actor: Any,
    ) -> None:
        """``edit(config)``: changes to the config before the trainer is built; ``policy``: the
        stand-in for the ranks."""
        self.config = config = make_config(tmp_path, Path(tokenizer.name_or_path), reward, **actor)
        if edit is not None:
            edit(config)
        self.events: list[str] = []
        self.model = tiny_qwen3()
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.rollout = ScriptedRollout(config.actor_rollout_ref.rollout, self.events)
        self.policy = policy(self.model, config.actor_rollout_ref.actor, self.events)
        self.sync = RecordingWeightSync(self.model, self.events)
        rewards = RewardManager(config.custom_reward_function, config.reward_model, tokenizer)
        self.scored: list[Any] = []
        score = rewards.score

        def recorded_score(batch: RolloutBatch) -> Any:
            self.events.append("reward")
            self.scored.append(score(batch))
            return self.scored[-1]

        rewards.score = recorded_score  # type: ignore[method-assign]

        def recorded_advantages(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.events.append("advantages")
            return compute_advantages(*args, **kwargs)

        monkeypatch.setattr(trainer.loop.advantages, "compute_advantages", recorded_advantages)
        run = config.trainer
        checkpoints = CheckpointManager(run.default_local_dir)
        parts = RunParts(
            manager=self.rollout,  # type: ignore[arg-type]
            servers=[],
            workers=self.policy,  # type: ignore[arg-type]
            rewards=rewards,
            judge_servers=[],
            user_servers=[],
            sync=self.sync,  # type: ignore[arg-type]
            tracking=Tracking(
                run.logger,
                project=run.project_name,
                experiment=run.experiment_name,
                run_dir=checkpoints.root,
            ),
            checkpoints=checkpoints,
            dump=generation_dump(run, tokenizer),
        )
        rows = [
            {
                "raw_prompt": [{"role": "user", "content": f"question {i}"}],
                "data_source": "toy",
                "reward_model": {"ground_truth": "-"},
                "extra_info": {"index": i},
            }
            for i in range(2 * PROMPTS)
        ]
        sampler = PromptSampler(rows, PROMPTS, shuffle=False)
        self.trainer = RayPPOTrainer(config, parts, sampler, val_rows=rows[:3])


@pytest.fixture()
def make_run(tmp_path, tokenizer, monkeypatch):
    runs: list[Run] = []

    def make(reward: str = REWARD, **kwargs: Any) -> Run:
        runs.append(Run(tmp_path, tokenizer, monkeypatch, reward, **kwargs))
        return runs[-1]

    yield make
    for run in runs:
        run.trainer.close()


STEP_KEYS = {
    "training/step",
    "timing_s/tools",
    "timing_s/reward",
    "reward/rule",
    "reward/rule/errors",
    "reward/mean",
    "reward/max",
    "reward/min",
    "reward/errors",
    "timing_s/old_log_prob",
    "rollout/logprob_gap_mean",
    "rollout/logprob_gap_max",
    *(
        f"rollout_corr/{name}"
        for name in (
            "kl",
            "k3_kl",
            "training_ppl",
            "rollout_ppl",
            "training_log_ppl",
            "rollout_log_ppl",
            "ppl_ratio",
            "log_ppl_diff",
            "log_ppl_abs_diff",
            "log_ppl_diff_max",
            "log_ppl_diff_min",
            "chi2_token",
            "chi2_seq",
        )
    ),  # fmt: skip
    "actor/entropy",
    "timing_s/adv",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "timing_s/update_actor",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/grad_norm",
    "actor/lr",
    "actor/optimizer_steps",
    "actor/shared_prefix_saved_frac",
    "actor/filler_samples",
    "actor/skipped_rows",
    "timing_s/weight_sync",
    "weight_sync/mb",
    "weight_sync/version",
    "perf/total_tokens",
    "perf/trainer_tokens_per_s",
    "perf/cpu_memory_used_gb",
    "perf/actor_state_mb",
    "timing_s/step",
}
"""What a step adds to the rollout's own metrics (``timing_s/gen``, ``agent_loop/*``, ...)."""

VERL_STEP_KEYS = {
    *(f"critic/{name}/{stat}" for name in ("score", "rewards", "returns") for stat in STATS),
    *(f"{name}/{stat}" for name in ("response_length", "prompt_length") for stat in STATS),
    "response_length/clip_ratio",
    "prompt_length/clip_ratio",
    "response/aborted_ratio",
    "num_turns/mean",
    "num_turns/max",
    "num_turns/min",
    "training/global_step",
    "training/epoch",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
    "timing_per_token_ms/gen",
    "timing_per_token_ms/adv",
    "timing_per_token_ms/update_actor",
}
"""verl's names a step adds beside ours (``trainer.metrics.verl_names``)."""


@pytest.mark.parametrize("use_kl_loss", [False, True], ids=["no_kl", "kl_loss"])
def test_train_step_runs_the_phases_in_order_and_logs_each(make_run, use_kl_loss):
    run = make_run(use_kl_loss=use_kl_loss)
    metrics = run.trainer.train_step(3)

    ref = ["ref"] if use_kl_loss else []
    assert run.events == [
        "rollout",
        "release_servers",
        "reward",
        "old_log_prob",
        *ref,
        "advantages",
        "update",
        "weight_push",
    ]
    assert run.rollout.traces == [TraceContext(step=3)]
    rollout = run.rollout.batches[0]
    assert "timing_s/gen" in rollout.metrics
    extra = {"timing_s/ref", "timing_per_token_ms/ref", "actor/kl_loss"} if use_kl_loss else set()
    assert set(metrics) == set(rollout.metrics) | STEP_KEYS | VERL_STEP_KEYS | extra
    for key, value in rollout.metrics.items():
        assert metrics[key] == value, key
    assert metrics["training/step"] == 3.0
    assert metrics["timing_s/tools"] == rollout.metrics["agent_loop/tool_s/mean"]
    assert metrics["perf/total_tokens"] == float(rollout.attention_mask.sum())
    assert metrics["weight_sync/version"] == 1.0
    assert all(v >= 0 for k, v in metrics.items() if k.startswith("timing_s/"))
    # verl's names: copies of ours, and what verl computes from the batch tensors
    assert metrics["training/global_step"] == 3.0 and metrics["training/epoch"] == 0.0
    assert metrics["perf/time_per_step"] == metrics["timing_s/step"]
    assert metrics["num_turns/mean"] == rollout.metrics["agent_loop/num_turns/mean"]
    assert metrics["response_length/mean"] == rollout.metrics["agent_loop/response_length/mean"]
    assert metrics["response_length/max"] == rollout.metrics["agent_loop/response_length/max"]
    world = run.config.trainer.world_size
    assert metrics["perf/throughput"] == pytest.approx(
        metrics["perf/total_tokens"] / (metrics["timing_s/step"] * world)
    )


def test_train_step_scores_with_the_rule_reward(make_run, tokenizer):
    run = make_run()
    metrics = run.trainer.train_step(1)
    rollout = run.rollout.batches[0]
    lengths = rollout.attention_mask[:, P:].sum(-1).tolist()
    texts = [tokenizer.decode(rollout.responses[i, :n]) for i, n in enumerate(lengths)]
    expected = torch.tensor([len(t) / 10 for t in texts])
    scores = run.scored[0].scores
    torch.testing.assert_close(scores, expected)
    assert metrics["reward/mean"] == pytest.approx(float(expected.mean()))
    assert metrics["reward/rule"] == pytest.approx(float(expected.mean()))
    assert (metrics["reward/max"], metrics["reward/min"]) == pytest.approx(
        (float(expected.max()), float(expected.min()))
    )
    assert metrics["reward/errors"] == 0.0
    # verl's critic/score and critic/rewards are the scores (no process reward, no KL penalty)
    for stat in STATS:
        assert metrics[f"critic/score/{stat}"] == pytest.approx(metrics[f"reward/{stat}"])
        assert metrics[f"critic/rewards/{stat}"] == pytest.approx(metrics[f"reward/{stat}"])


@pytest.mark.parametrize("use_kl_loss", [False, True], ids=["no_kl", "kl_loss"])
def test_update_gets_the_advantages_of_the_scores_and_groups(make_run, use_kl_loss):
    run = make_run(use_kl_loss=use_kl_loss)
    metrics = run.trainer.train_step(2)
    rollout, scores = run.rollout.batches[0], run.scored[0].scores
    (update,) = run.policy.updates
    batch: TrainBatch = update["batch"]
    mask = rollout.response_mask

    # the rollout's tensors, the trainer's own old log-probs, GRPO over the rollout's groups
    assert torch.equal(batch.input_ids, rollout.input_ids)
    assert torch.equal(batch.response_mask, mask)
    assert len(set(rollout.uid)) == PROMPTS and len(rollout.uid) == PROMPTS * N
    expected = compute_advantages(
        "grpo", scores, mask, rollout.uid, norm_by_std=True, gamma=1.0, token_rewards=None
    )
    assert batch.advantages is not None and batch.advantages.abs().sum() > 0
    torch.testing.assert_close(batch.advantages, expected)
    picked = expected[mask.bool()]
    assert metrics["critic/advantages/mean"] == pytest.approx(float(picked.mean()))
    assert metrics["critic/advantages/max"] == pytest.approx(float(picked.max()))
    for stat in STATS:  # GRPO's returns are its advantages (verl's critic/returns)
        assert metrics[f"critic/returns/{stat}"] == metrics[f"critic/advantages/{stat}"]
    assert batch.old_log_probs is not None
    gap = (batch.old_log_probs - rollout.rollout_log_probs).abs()[mask.bool()]
    assert metrics["rollout/logprob_gap_mean"] == pytest.approx(float(gap.mean()))
    assert (batch.ref_log_probs is not None) == use_kl_loss

    # mini-batches of ppo_mini_batch_size prompts x rollout.n samples: 2 optimizer steps
    assert update["mini_batches"] == PROMPTS // 2
    assert metrics["actor/optimizer_steps"] == 2.0
    assert update["seed"] == run.config.trainer.seed + 2

    # the update changed the weights, and the push sent the updated ones
    (pushed,) = run.sync.pushed
    assert any(not torch.equal(pushed[k], run.initial[k]) for k in run.initial)
    for key, value in run.model.state_dict().items():
        assert torch.equal(pushed[key], value), key


def test_a_step_with_segmented_sessions_weighs_each_session_once(make_run):
    run = make_run()
    run.rollout.segments = {0: 2, 5: 1}  # sample 0: a session of 3 segments, sample 5 of 2
    run.rollout.preset = {5: 0.9}  # sample 5's loop gave its session reward to both
    metrics = run.trainer.train_step(1)
    rollout, scored = run.rollout.batches[0], run.scored[0]
    (update,) = run.policy.updates
    batch: TrainBatch = update["batch"]

    # one row per segment, right after its session, in the session's group
    assert len(rollout) == PROMPTS * N + 3 and rollout.num_sessions == PROMPTS * N
    assert rollout.segment == [0, 1, 2, 0, 0, 0, 0, 0, 1, 0, 0]
    assert rollout.uid[:3] == [rollout.uid[3]] * 3 and rollout.uid[8] == rollout.uid[7]
    assert metrics["agent_loop/segments_per_session/max"] == 3.0
    assert metrics["agent_loop/samples"] == 11.0 and metrics["agent_loop/sessions"] == 8.0

    # a preset reward is each segment's rule reward; the others are scored on their own text
    assert scored.scores[[7, 8]].tolist() == pytest.approx([0.9, 0.9])
    assert len(set(scored.scores[:3].tolist())) > 1

    # advantages weighted by the records' weights; the weights travel with the batch
    weights = torch.tensor([1 / 3] * 3 + [1.0] * 4 + [0.5] * 2 + [1.0] * 2)
    assert batch.weights is not None
    torch.testing.assert_close(batch.weights, weights)
    expected = compute_advantages(
        "grpo", scored.scores, rollout.response_mask, rollout.uid, weights=weights
    )
    torch.testing.assert_close(batch.advantages, expected)
    assert batch.advantages is not None and batch.advantages[:3].abs().sum() > 0

    # the optimizer steps of the batch without segments: 11 samples in 2 mini-batches of
    # 6 + 5, the second filled up with one row that trains nothing
    assert update["mini_batches"] == PROMPTS // 2
    assert metrics["actor/optimizer_steps"] == 2.0
    assert metrics["actor/filler_samples"] == 1.0
    assert metrics["perf/total_tokens"] == float(rollout.attention_mask.sum())


def test_validation_of_segmented_sessions_counts_each_session_once(make_run):
    run = make_run()
    run.rollout.segments = {0: 1, 2: 2}
    out = run.trainer._validate(1)

    batch, scores = run.rollout.batches[0], run.scored[0].scores
    assert len(batch) == 3 + 3 and batch.segment == [0, 1, 0, 0, 1, 2]
    last = [1, 2, 5]  # each session's last segment
    assert out["val/reward/mean"] == pytest.approx(float(scores[last].mean()))
    assert out["val-core/toy/reward/mean@1"] == pytest.approx(out["val/reward/mean"])


def test_fit_logs_every_step_and_closes_the_parts(make_run):
    run = make_run()
    last = run.trainer.fit()

    assert run.trainer.total_steps == 2  # 8 rows, 4 prompts a step, one epoch
    assert run.events.count("weight_push") == 2
    logged = [
        json.loads(line)
        for line in (run.trainer.checkpoints.root / "metrics.jsonl").read_text().splitlines()
    ]
    assert [entry["step"] for entry in logged] == [1, 2]
    assert set(logged[-1]) == {"step"} | set(last)
    assert logged[-1]["reward/mean"] == pytest.approx(last["reward/mean"])
    assert run.rollout.shut_down and run.policy.shut_down and run.trainer.parts.closed


def test_each_step_and_validation_writes_its_scored_samples_where_verls_keys_say(
    make_run, tmp_path
):
    """``trainer.rollout_data_dir`` / ``validation_data_dir``: ``<step>.jsonl`` with one line
    per sample, the ids the update trained on and the score the step used (0: validation
    before training)."""

    def edit(config: Config) -> None:
        config.trainer.rollout_data_dir = str(tmp_path / "rollouts")
        config.trainer.validation_data_dir = str(tmp_path / "val")
        config.trainer.val_before_train = True
        config.trainer.test_freq = 2

    run = make_run(edit=edit)
    run.trainer.fit()
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["0.jsonl", "2.jsonl"]
    # generate_sequences order: validation 0, step 1, step 2, validation 2
    files = ["val/0.jsonl", "rollouts/1.jsonl", "rollouts/2.jsonl", "val/2.jsonl"]
    for path, batch, reward in zip(files, run.rollout.batches, run.scored, strict=True):
        lines = [json.loads(line) for line in (tmp_path / path).read_text().splitlines()]
        assert {line["step"] for line in lines} == {int(Path(path).stem)}
        assert [line["score"] for line in lines] == pytest.approx(reward.scores.tolist())
        assert [line["scores"]["rule"] for line in lines] == reward.components["rule"]
        width = batch.attention_mask[:, batch.prompts.shape[1] :].sum(-1).tolist()
        assert [line["response_ids"] for line in lines] == [
            batch.responses[i, :n].tolist() for i, n in enumerate(width)
        ]
    assert len(lines) == 3  # validation: one greedy sample for each of the 3 rows


def test_val_only_validates_once_and_ends_without_a_step_or_a_checkpoint(make_run, tmp_path):
    """``trainer.val_only`` (verl's key): one validation of the weights, its metrics logged
    and returned, its samples kept; nothing trained, pushed or saved."""

    def edit(config: Config) -> None:
        config.trainer.val_only = True
        config.trainer.validation_data_dir = str(tmp_path / "val")
        config.trainer.save_freq = 1

    run = make_run(edit=edit)
    out = run.trainer.fit()
    assert "val/reward/mean" in out and "training/step" not in out
    assert run.events == ["rollout", "reward"]  # one greedy pass over the 3 rows, scored
    assert [p.name for p in (tmp_path / "val").iterdir()] == ["0.jsonl"]
    assert len((tmp_path / "val" / "0.jsonl").read_text().splitlines()) == 3
    assert run.trainer.checkpoints.latest() is None
    logged = (run.trainer.checkpoints.root / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in logged] == [0]
    assert run.trainer.parts.closed


def test_a_run_with_tools_whose_samples_never_call_one_is_warned_once(make_run, caplog):
    run = make_run()
    run.config.actor_rollout_ref.rollout.multi_turn.tool_config_path = "tools.yaml"
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run.trainer.fit()  # 2 steps; the scripted model writes no tool call
    warned = [r.getMessage() for r in caplog.records if "tool call" in r.getMessage()]
    assert warned == [
        "step 1: no sample attempted a tool call although tools are configured "
        "(actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml): check that the "
        "rows run a loop that offers them (agent_name: tool_agent) and that the model writes "
        "tool calls (agent_loop/calls_attempted/mean); said once per run"
    ]


def test_a_run_without_tools_is_not_warned_about_tool_calls(make_run, caplog):
    run = make_run()
    with caplog.at_level("WARNING", logger="agentloop.train"):
        run.trainer.fit()
    assert not [r for r in caplog.records if "tool call" in r.getMessage()]


# ---- validation -----------------------------------------------------------------------------
PRED_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n" + (
    "    return {'score': len(solution_str) / 10, 'pred': str(len(solution_str) % 3)}\n"
)


def test_validation_is_one_greedy_response_per_prompt_under_our_and_verls_names(make_run):
    run = make_run()
    out = run.trainer._validate(5)

    assert run.rollout.traces == [TraceContext(step=5, validate=True)]  # val_kwargs sampling
    assert len(run.rollout.batches[0]) == 3  # val_kwargs.n = 1
    assert out["val-core/toy/reward/mean@1"] == pytest.approx(out["val/toy/reward/mean"])
    assert out["val-aux/num_turns/mean"] == out["val/num_turns/mean"]
    assert not any("@" in k and "mean@1" not in k for k in out)


def test_validation_with_n_samples_votes_on_the_rewards_pred(make_run):
    run = make_run(PRED_REWARD)
    val = ValKwargsConfig(n=4, do_sample=True, temperature=1.0)
    run.config.actor_rollout_ref.rollout.val_kwargs = val
    out = run.trainer._validate(2)

    batch, scored = run.rollout.batches[0], run.scored[0]
    assert len(batch) == 3 * 4 and len(set(batch.uid)) == 3
    assert scored.extra_info["pred"] == [str(round(10 * x) % 3) for x in scored.scores.tolist()]
    expected = validation_metrics(
        ["toy"] * 12, batch.uid, scored.scores.tolist(), scored.extra_info, batch.num_turns
    )
    assert {k: v for k, v in out.items() if k.startswith("val-")} == expected
    assert out["val-core/toy/reward/mean@4"] == pytest.approx(out["val/toy/reward/mean"])
    for name in ("best@4/mean", "maj@4/mean"):
        assert f"val-core/toy/reward/{name}" in out
    for name in ("std@4", "worst@4/mean", "best@2/mean", "maj@2/mean"):
        assert f"val-aux/toy/reward/{name}" in out


# ---- how a stopped run explains itself ------------------------------------------------------
def test_stopped_message_names_the_server_restart_budget(tmp_path):
    exc = ServerRestartError(
        "server 0 died and 3 restart(s) were already spent (max_restarts=3): look at the "
        "server's log (OOM kill? engine error?)"
    )
    checkpoints = CheckpointManager(tmp_path / "run")
    assert stopped_message(exc, 3, checkpoints) == (
        f"{exc} (the budget is actor_rollout_ref.rollout.recovery.max_server_restarts); "
        "the run stopped in step 3: no checkpoint was saved yet (trainer.save_freq), so a new "
        "run starts over. Run the same command again (trainer.resume_mode=auto) to go on from "
        "the last checkpoint."
    )


def test_stopped_message_names_the_last_checkpoint(tmp_path):
    checkpoints = CheckpointManager(tmp_path / "run")
    state = {"sampler": {"epoch": 0, "position": 2}}
    saved = checkpoints.save(2, None, ["extra"], state)  # type: ignore[arg-type]  (no ranks)
    message = stopped_message(ServerRestartError("server 1 died"), 0, checkpoints)
    assert message == (
        "server 1 died (the budget is actor_rollout_ref.rollout.recovery.max_server_restarts); "
        f"the run stopped before its first step: the last checkpoint is {saved} (step 2). Run "
        "the same command again (trainer.resume_mode=auto) to go on from the last checkpoint."
    )


def test_a_step_of_one_optimizer_step_takes_its_old_log_probs_from_the_update(make_run):
    """One mini-batch, one epoch: no old-log-prob pass; the update's own forward gives the
    old log-probs (ratio exactly 1), and the step's metrics and weights are those of a step
    that ran the pass (``recompute_old_log_prob=True``)."""
    own = make_run(ppo_mini_batch_size=PROMPTS)
    got = own.trainer.train_step(1)  # before the next run records its own advantages
    recomputed = make_run(ppo_mini_batch_size=PROMPTS, recompute_old_log_prob=True)
    want = recomputed.trainer.train_step(1)

    assert own.events == [
        "rollout", "release_servers", "reward", "advantages", "update", "weight_push"
    ]  # fmt: skip
    assert "old_log_prob" in recomputed.events
    assert "timing_s/old_log_prob" not in got and "timing_s/old_log_prob" in want
    assert own.policy.updates[0]["batch"].old_log_probs is None
    assert got["actor/optimizer_steps"] == want["actor/optimizer_steps"] == 1.0
    assert got["actor/ppo_kl"] == 0.0 and got["actor/pg_clipfrac"] == 0.0
    for key in ("actor/entropy", "rollout/logprob_gap_mean", "rollout/logprob_gap_max"):
        assert got[key] == pytest.approx(want[key], rel=1e-5), key
    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-5, abs=1e-7)
    for key, value in recomputed.model.state_dict().items():
        torch.testing.assert_close(own.model.state_dict()[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mini", [2, PROMPTS], ids=["two_mini_batches", "own_old_log_probs"])
def test_a_group_that_scored_alike_is_skipped_and_the_step_is_the_same(make_run, mini):
    """Prompt 1's samples all scored 0.5 (GRPO advantage 0): the update computes fillers in
    their place, with their tokens still in the normaliser, and its step is the step of an
    update that computed them (``skip_zero_advantage_rows=False``), bit for bit: one row a
    micro-batch, so the other rows' forwards are the same, and a skipped row's gradient was
    exactly 0."""
    alike = {k: 0.5 for k in range(N, 2 * N)}
    skip = make_run(ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=1)
    skip.rollout.preset = alike
    got = skip.trainer.train_step(1)
    full = make_run(
        ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=1, skip_zero_advantage_rows=False
    )
    full.rollout.preset = alike
    want = full.trainer.train_step(1)

    assert got["actor/skipped_rows"] == float(N) and want["actor/skipped_rows"] == 0.0
    computed, whole = skip.policy.updates[0]["batch"], full.policy.updates[0]["batch"]
    assert whole.advantages[N : 2 * N].abs().sum() == 0 and whole.stand_in_tokens is None
    tokens = whole.response_mask[N : 2 * N].sum(-1).float()
    assert torch.equal(computed.stand_in_tokens[N : 2 * N], tokens)
    assert computed.attention_mask[N : 2 * N].sum() == N  # one prompt token each
    assert got["actor/pg_loss"] == want["actor/pg_loss"]
    for key, value in full.model.state_dict().items():
        assert torch.equal(skip.model.state_dict()[key], value), key


@pytest.mark.parametrize(
    "change",
    [
        {"ppo_mini_batch_size": 2},
        {"ppo_mini_batch_size": PROMPTS, "ppo_epochs": 2},
        {"ppo_mini_batch_size": PROMPTS, "recompute_old_log_prob": True},
    ],
    ids=["two_mini_batches", "two_epochs", "asked_for"],
)
def test_the_old_log_prob_pass_runs_where_the_update_takes_several_steps(make_run, change):
    run = make_run(**change)
    run.trainer.train_step(1)
    assert run.events.index("old_log_prob") < run.events.index("update")


def test_a_gigpo_step_passes_each_samples_turns_and_anchor_keys(make_run):
    """The update's advantages are GiGPO's over the rollout's turns (the records' turn ends,
    anchor keys from what each turn read); the scripted samples read different prompts and
    tool replies, so every step group is a singleton and the advantages are GRPO's."""

    def edit(config: Config) -> None:
        config.algorithm.adv_estimator = "gigpo"
        config.algorithm.gigpo.step_advantage_w = 0.5

    run = make_run(edit=edit)
    metrics = run.trainer.train_step(1)
    rollout, scores = run.rollout.batches[0], run.scored[0].scores
    (update,) = run.policy.updates
    batch = update["batch"]
    steps = gigpo_steps(batch, rollout, None)
    assert all(len(e) == 2 for e in steps.ends)
    expected = compute_advantages(
        "gigpo", scores, rollout.response_mask, rollout.uid, turns=steps, step_advantage_w=0.5
    )
    torch.testing.assert_close(batch.advantages, expected)
    grpo = compute_advantages("grpo", scores, rollout.response_mask, rollout.uid)
    assert grpo.abs().sum() > 0
    torch.testing.assert_close(batch.advantages, grpo)
    assert metrics["gigpo/step_group_share"] == 0.0
    assert metrics["gigpo/step_group_size_mean"] == 0.0


def test_samples_with_roles_are_compared_within_their_prompt_and_role(make_run):
    """Samples that carry a role (the agent's, the gateway's ``model``, or the row's) are
    normalised within (prompt, role): the update's advantages are GRPO's over those groups,
    and each role's samples and mean reward are logged."""
    run = make_run()
    generate = run.rollout.generate_sequences

    def with_roles(*args: Any, **kwargs: Any) -> RolloutBatch:
        batch = generate(*args, **kwargs)
        for i, record in enumerate(batch.records):
            record.role = "planner" if i % 2 == 0 else None
        for i, row in enumerate(batch.rows):
            if i % 2:
                row["extra_info"] = {**row.get("extra_info", {}), "role": "executor"}
        return batch

    run.rollout.generate_sequences = with_roles  # type: ignore[method-assign]
    metrics = run.trainer.train_step(1)
    rollout, scores = run.rollout.batches[0], run.scored[0].scores
    roles = ["planner" if i % 2 == 0 else "executor" for i in range(len(rollout.uid))]
    assert sample_roles(rollout) == roles
    (update,) = run.policy.updates
    groups = credit_groups(rollout.uid, roles)
    assert len(set(groups)) == 2 * len(set(rollout.uid))
    expected = compute_advantages("grpo", scores, rollout.response_mask, groups)
    torch.testing.assert_close(update["batch"].advantages, expected)
    mixed = compute_advantages("grpo", scores, rollout.response_mask, rollout.uid)
    assert not torch.allclose(expected, mixed)
    planner = scores[0::2]
    assert metrics["role/planner/samples"] == float(planner.numel())
    assert metrics["role/planner/reward/mean"] == pytest.approx(float(planner.mean()))
    assert metrics["role/executor/reward/mean"] == pytest.approx(float(scores[1::2].mean()))


def test_rejection_trains_only_the_accepted_tokens_with_the_batchs_weights(make_run):
    """A rejection criterion needs the old policy before the update: the old-log-prob pass
    runs even for one optimizer step, and the update gets the accepted tokens as its loss
    mask (its normaliser counts them alone) and the importance weights of the whole batch;
    the step logs the mismatch and what the correction did."""
    plain = make_run(ppo_mini_batch_size=PROMPTS).trainer.train_step(1)
    upper = math.exp(-plain["rollout/logprob_gap_mean"])  # about half the tokens above it
    correction = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_batch_normalize=True, rollout_rs="token_k1",
        rollout_rs_threshold=f"0_{upper}",
    )  # fmt: skip

    def edit(config: Config) -> None:
        config.algorithm.rollout_correction = correction

    run = make_run(ppo_mini_batch_size=PROMPTS, edit=edit)
    metrics = run.trainer.train_step(1)
    assert run.events.index("old_log_prob") < run.events.index("update")
    rollout, (update,) = run.rollout.batches[0], run.policy.updates
    batch = update["batch"]
    assert batch.old_log_probs is not None and batch.is_weights is not None
    done = correct(
        batch.old_log_probs, rollout.rollout_log_probs, rollout.response_mask, correction.spec
    )
    assert done.weights is not None
    assert torch.equal(batch.response_mask, done.accepted.to(batch.response_mask.dtype))
    assert 0 < int(batch.response_mask.sum()) < int(rollout.response_mask.sum())
    torch.testing.assert_close(batch.is_weights, done.weights)
    kept = done.weights[done.accepted.bool()]
    assert float(kept.mean()) == pytest.approx(1.0)  # batch-normalised over accepted tokens
    sampled = float(rollout.response_mask.sum())
    rejected = sampled - float(batch.response_mask.sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected / sampled)
    gap = (batch.old_log_probs - rollout.rollout_log_probs)[rollout.response_mask.bool()]
    assert metrics["rollout_corr/kl"] == pytest.approx(float(-gap.mean()), rel=1e-5)

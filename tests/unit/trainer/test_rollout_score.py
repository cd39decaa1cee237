"""``agentloop-rollout``'s scoring: each trajectory line carries the configured reward (the
real ``RewardManager``, built-in gsm8k scorer), and the summary table's accuracy,
valid-tool-call rate and mean reward, exactly."""

from __future__ import annotations

from agentloop.records import SampleRecord
from tests.unit.trainer.rewards.batch import make_batch
from trainer.cli.rollout import scored_records
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.metrics.rollout_score import RolloutSummary, format_summary, summarize
from trainer.rewards.manager import RewardManager


def _lines(tokenizer, records: list[SampleRecord]) -> list[dict]:
    """``scored_records`` of two gsm8k answers (right, wrong) by the built-in rule reward."""
    batch = make_batch(tokenizer, ["#### 42", "#### 41"], records=records)
    rewards = RewardManager(RewardFunctionConfig(), RewardModelConfig(), tokenizer)
    try:
        return scored_records(batch, tokenizer, rewards)
    finally:
        rewards.close()


def test_each_line_carries_its_score_and_each_named_reward(tokenizer):
    records = [SampleRecord(tool_calls=1), SampleRecord(tool_calls=2, tool_errors=1)]
    lines = _lines(tokenizer, records)
    assert [(r["score"], r["scores"]) for r in lines] == [
        (1.0, {"rule": 1.0}),
        (0.0, {"rule": 0.0}),
    ]
    assert summarize(lines) == RolloutSummary(
        samples=2, accuracy=0.5, valid_tool_calls=0.5, reward_mean=0.5
    )


def test_accuracy_counts_rewards_at_the_threshold_and_the_table_is_exact():
    records = [
        {"score": 1.0, "tool_calls": 1, "tool_errors": 0},
        {"score": 0.5, "tool_calls": 2, "tool_errors": 0},
        {"score": 0.25, "tool_calls": 1, "tool_errors": 1},
        {"score": 0.0, "tool_calls": 0, "tool_errors": 0},
    ]
    assert summarize(records).accuracy == 0.25
    summary = summarize(records, correct_at=0.5)
    assert summary == RolloutSummary(
        samples=4, accuracy=0.5, valid_tool_calls=0.5, reward_mean=0.4375, correct_at=0.5
    )
    assert format_summary(summary) == (
        "| samples | accuracy (reward >= 0.5) | valid tool-call rate | reward mean |\n"
        "|---------|--------------------------|----------------------|-------------|\n"
        "|       4 |                    50.0% |                50.0% |      0.4375 |\n"
    )


def test_no_samples_is_an_all_zero_row():
    assert format_summary(summarize([])).splitlines()[-1] == (
        "|       0 |                   0.0% |                 0.0% |      0.0000 |"
    )


def test_rows_nothing_scores_are_written_unscored_beside_scored_ones(tokenizer):
    batch = make_batch(tokenizer, ["#### 42", "#### 42", "#### 41"])
    batch.rows[1]["data_source"] = "my_task"  # no built-in scorer, no reward file
    rewards = RewardManager(RewardFunctionConfig(), RewardModelConfig(), tokenizer)
    try:
        lines = scored_records(batch, tokenizer, rewards, frozenset({"my_task"}))
        alone = scored_records(batch.select([1]), tokenizer, rewards, frozenset({"my_task"}))
    finally:
        rewards.close()
    assert [(r["score"], r["scores"]) for r in lines] == [
        (1.0, {"rule": 1.0}),
        (None, {}),
        (0.0, {"rule": 0.0}),
    ]
    assert [(r["uid"], r["score"]) for r in alone] == [("u1", None)]
    summary = summarize(lines)
    assert (summary.samples, summary.unscored, summary.accuracy, summary.reward_mean) == (
        3,
        1,
        0.5,
        0.5,
    )
    assert format_summary(summary).splitlines()[-1] == (
        "|       3 |                  50.0% |               100.0% |      0.5000 |        1 |"
    )
    assert format_summary(summarize(alone)).splitlines()[0].endswith("| unscored |")
    assert format_summary(summarize(alone)).splitlines()[-1] == (
        "|       1 |                      - |               100.0% |           - |        1 |"
    )


def test_an_environments_own_reward_functions_are_scores_beside_the_configured_one(tokenizer):
    """A loop that kept its environment's reward functions (``SampleRecord.reward_parts``)
    has them under ``env/<name>`` in ``scores``, beside the configured reward's parts."""
    records = [SampleRecord(reward_parts={"correct": 1.0, "format": 0.5}), SampleRecord()]
    lines = _lines(tokenizer, records)
    assert [r["scores"] for r in lines] == [
        {"rule": 1.0, "env/correct": 1.0, "env/format": 0.5},
        {"rule": 0.0},
    ]

"""Tool-verified rewards against a real SQLite database: the nl2sql recipe's ``verify`` hook
runs the model's final SQL and the gold SQL through the registered ``run_sql`` tool (loaded
from the recipe's verl-layout tool config) and compares result sets. Also: verification runs
concurrently, and a hook that raises, hangs or calls an unknown tool scores 0, counted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentloop.records import SampleRecord
from agentloop.tools import load_tool_config
from recipes.nl2sql.data import make_rows
from recipes.nl2sql.database import build_database
from tests.unit.trainer.rewards.batch import make_batch, tool_call
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig, VerifyConfig
from trainer.rewards import RewardManager, VerifyReward

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes" / "nl2sql"
GOLD = "SELECT name FROM products WHERE category = 'tech' AND price > 10"
ORDERED = "SELECT name FROM customers WHERE city = 'Quito' ORDER BY name"


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return build_database(tmp_path_factory.mktemp("nl2sql") / "shop.db", seed=0)


def manager_for(tokenizer, hook: Path, name: str = "verify", **verify: Any) -> RewardManager:
    config = VerifyConfig(path=str(hook), name=name, **verify)
    tools = load_tool_config(RECIPE / "tool_config.yaml")
    return RewardManager(
        RewardFunctionConfig(),
        RewardModelConfig(verify=config, weights={"rule": 0.0}),
        tokenizer,
        verify=VerifyReward(config, tools),
    )


def batch_of(tokenizer, db: Path, answers: list[str], golds: list[str], calls=None):
    info = [{"tools_kwargs": {"run_sql": {"create_kwargs": {"db_path": str(db)}}}} for _ in golds]
    records = [SampleRecord(calls=c) for c in (calls or [[] for _ in golds])]
    return make_batch(
        tokenizer,
        answers,
        truths=golds,
        data_source="nl2sql",
        records=records,
        extra_info=info,
        response_length=256,
    )


def test_final_sql_is_executed_and_compared_with_the_gold_result_set(tokenizer, db):
    answers = [
        # same rows, different SQL text and row order
        "```sql\nSELECT p.name FROM products AS p WHERE p.price > 10 AND p.category='tech' "
        "ORDER BY p.name DESC\n```",
        "```sql\nSELECT name FROM products WHERE category = 'tech'\n```",  # one row too many
        "```sql\nSELEC name FROM products\n```",  # does not run
        "I do not know.",  # no SQL at all
        f"```sql\n{ORDERED}\n```",  # the gold, ordered
        "```sql\nSELECT name FROM customers WHERE city = 'Quito' ORDER BY name DESC\n```",
    ]
    golds = [GOLD, GOLD, GOLD, GOLD, ORDERED, ORDERED]
    manager = manager_for(tokenizer, RECIPE / "reward.py")
    try:
        out = manager.score(batch_of(tokenizer, db, answers, golds))
    finally:
        manager.close()
    assert len(db_rows(db, ORDERED)) >= 2  # so that the reversed order differs
    assert out.scores.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert out.metrics["reward/verify/executed"] == pytest.approx(4 / 6)
    assert out.metrics["reward/verify/errors"] == 0.0
    # the five samples with SQL ran the gold query and their own; the other ran nothing
    assert out.metrics["reward/verify/tool_calls"] == 5 * 2
    assert out.metrics["reward/verify/tool_errors"] == 1.0  # the SELEC typo


def db_rows(db: Path, sql: str) -> list[Any]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_without_a_sql_block_the_last_successful_tool_query_counts(tokenizer, db):
    calls = [
        [
            tool_call("run_sql", arguments={"query": "SELECT 1"}, ok=True),
            tool_call("run_sql", arguments={"query": GOLD}, ok=True),
            tool_call("run_sql", arguments={"query": "SELEC"}, ok=False),
        ]
    ]
    manager = manager_for(tokenizer, RECIPE / "reward.py")
    try:
        out = manager.score(batch_of(tokenizer, db, ["Those are the products."], [GOLD], calls))
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0]


def test_generated_rows_have_gold_sql_that_runs_on_the_generated_database(tmp_path, tokenizer):
    db = build_database(tmp_path / "shop.db", seed=3)
    rows = make_rows(db, 20, seed=3, split="train")
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    answers = [f"```sql\n{g}\n```" for g in golds]
    manager = manager_for(tokenizer, RECIPE / "reward.py")
    try:
        out = manager.score(batch_of(tokenizer, db, answers, golds))
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0] * 20
    assert json.dumps(rows[0])  # rows are plain JSON (what the data script writes)


HOOKS = """
import asyncio, time

async def slow(sample, tools):
    await tools.call("run_sql", {"query": "SELECT COUNT(*) FROM orders"})
    await asyncio.sleep(0.4)
    return 1.0

async def flaky(sample, tools):
    if sample.index == 0:
        raise RuntimeError("verifier crashed")
    if sample.index == 1:
        await asyncio.sleep(30)
    if sample.index == 2:
        await tools.call("search", {"q": "x"})
    return 1.0

def threaded(sample, tools):
    out = tools.run("run_sql", {"query": sample.ground_truth})
    return float(out.ok and out.text.startswith('{"columns"'))
"""


def test_samples_are_verified_concurrently(tmp_path, tokenizer, db):
    hook = tmp_path / "hooks.py"
    hook.write_text(HOOKS)
    manager = manager_for(tokenizer, hook, name="slow", max_concurrency=8)
    try:
        start = time.perf_counter()
        out = manager.score(batch_of(tokenizer, db, ["x"] * 8, [GOLD] * 8))
        elapsed = time.perf_counter() - start
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0] * 8
    assert elapsed < 0.4 * 8 / 2, f"8 x 0.4 s verifications took {elapsed:.2f} s"


def test_a_raising_hanging_or_misdirected_hook_scores_zero_counted(tmp_path, tokenizer, db):
    hook = tmp_path / "hooks.py"
    hook.write_text(HOOKS)
    manager = manager_for(tokenizer, hook, name="flaky", timeout_s=1.0)
    try:
        out = manager.score(batch_of(tokenizer, db, ["x"] * 4, [GOLD] * 4))
    finally:
        manager.close()
    assert out.scores.tolist() == [0.0, 0.0, 0.0, 1.0]
    assert out.metrics["reward/verify/errors"] == 3.0 and out.metrics["reward/errors"] == 3.0


def test_a_plain_function_hook_calls_tools_from_its_thread(tmp_path, tokenizer, db):
    hook = tmp_path / "hooks.py"
    hook.write_text(HOOKS)
    manager = manager_for(tokenizer, hook, name="threaded")
    try:
        out = manager.score(batch_of(tokenizer, db, ["x", "y"], [GOLD, "SELEC"]))
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0, 0.0]


def test_a_training_config_builds_the_verify_reward_with_the_rollout_tools(tokenizer, db):
    from trainer.config import load_config
    from trainer.rewards import build_rewards, check_rewards

    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={RECIPE / 'tool_config.yaml'}",
            f"reward_model.verify.path={RECIPE / 'reward.py'}",
            "reward_model.weights.rule=0",
        ]
    )
    check_rewards(config)
    manager, judge_servers = build_rewards(config, tokenizer, "cpu")
    try:
        assert [c.name for c in manager.components] == ["verify"] and judge_servers == []
        out = manager.score(batch_of(tokenizer, db, [f"```sql\n{GOLD}\n```"], [GOLD]))
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0] and out.metrics["reward/verify"] == 1.0

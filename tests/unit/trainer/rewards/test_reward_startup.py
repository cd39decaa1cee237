"""Start-up checks of the rewards, through ``agentloop-train`` and ``agentloop-rollout``: a
data_source the built-in scorer cannot score (train or val rows) fails training before any
server starts, naming the file and both fixes, and is written unscored by
``agentloop-rollout``, said once; judge/verify-only runs and custom functions are not
held to it; verl's ``reward_model.enable``/``reward_manager`` are honored or refused clearly."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from trainer.cli.train import main as train_main
from trainer.config import load_config
from trainer.loop.assembly import plan_run
from trainer.loop.rollout_plan import plan_rollout
from trainer.rewards import BUILTIN_SOURCES, check_rewards
from trainer.rewards.build import unscored_sources

USER = [{"role": "user", "content": "Add 2 and 3."}]
FIXES = (
    "no built-in scorer handles it and custom_reward_function.path is not set: set "
    "custom_reward_function.path to a file whose compute_score(data_source, solution_str, "
    "ground_truth, extra_info) scores these rows, or give the rows a data_source with a "
    f"built-in scorer: {BUILTIN_SOURCES}"
)


def rows_file(path: Path, sources: list[str | None]) -> Path:
    rows: list[dict[str, Any]] = []
    for i, source in enumerate(sources):
        row: dict[str, Any] = {"prompt": USER, "extra_info": {"index": i}}
        if source is not None:
            row["data_source"] = source
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base(tmp_path: Path, train: Path) -> list[str]:
    return [
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={train}",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]


def train_error(capsys, *overrides: str) -> str:
    code = train_main(list(overrides))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("agentloop-train: error: ")
    return err.removeprefix("agentloop-train: error: ")


def write(path: Path, source: str) -> str:
    path.write_text(source)
    return str(path)


# --- a data_source without a scorer -------------------------------------------------------


def test_train_rows_without_a_built_in_scorer_fail_at_start_up_naming_file_and_fixes(
    capsys, tmp_path
):
    train = rows_file(tmp_path / "train.jsonl", ["quiz", "quiz", "openai/gsm8k", None])
    err = train_error(capsys, *base(tmp_path, train))
    assert (
        err == f"data.train_files ({train}): data_source 'quiz' (2 rows), missing (1 row): {FIXES}"
    )
    assert not (tmp_path / "run" / "config.yaml").exists()  # stopped before the run was written


def test_rows_with_a_workspace_task_need_no_scorer_their_check_scores_them():
    config, _ = load_config(["actor_rollout_ref.model.path=tiny-qwen3"])
    task = {"workspace": "w", "check": "true"}
    rows = [
        {"prompt": USER, "data_source": "repo_fix", "extra_info": {"workspace_task": task}},
        {"prompt": USER, "data_source": "repo_fix", **task},
        {"prompt": USER, "data_source": "quiz"},
    ]
    assert unscored_sources(config, rows) == [("quiz", 1)]


def test_val_rows_are_checked_too(capsys, tmp_path):
    train = rows_file(tmp_path / "train.jsonl", ["openai/gsm8k"] * 4)
    val = rows_file(tmp_path / "val.jsonl", ["lighteval/MATH", "calculator"])
    err = train_error(capsys, *base(tmp_path, train), f"data.val_files={val}")
    assert err == f"data.val_files ({val}): data_source 'calculator' (1 row): {FIXES}"


def test_agentloop_rollout_writes_the_rows_nothing_scores_unscored_saying_so_once(caplog, tmp_path):
    train = rows_file(tmp_path / "train.jsonl", ["openai/gsm8k"] * 2)
    val = rows_file(tmp_path / "val.jsonl", ["toy", "toy", None, "lighteval/MATH"])
    common = [
        "actor_rollout_ref.model.path=tiny-qwen3",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"+output={tmp_path / 'out.jsonl'}",
    ]
    with caplog.at_level(logging.WARNING, logger="agentloop.rollout"):
        started = plan_rollout([*common, "+split=val"])  # the split it samples is the one held
    assert started.unscored == frozenset({"toy", None})
    said = [r.getMessage() for r in caplog.records if r.name == "agentloop.rollout"]
    fixes = FIXES.removeprefix(
        "no built-in scorer handles it and custom_reward_function.path is not set: "
    )
    assert said == [
        "data_source 'toy' (2 rows), missing (1 row): no built-in scorer handles it and "
        "custom_reward_function.path is not set: these trajectories are written unscored "
        f"(score null); to score them, {fixes}"
    ]
    caplog.clear()
    assert plan_rollout(common).unscored == frozenset()  # the train rows all have a scorer
    assert not [r for r in caplog.records if r.name == "agentloop.rollout"]
    assert not (tmp_path / "out.jsonl").exists()  # checks only: nothing ran


@pytest.mark.parametrize(
    "overrides",
    [
        ["custom_reward_function.path=REWARD"],
        ["reward_model.weights.rule=0", "reward_model.verify.path=VERIFY"],
        [
            "reward_model.weights.rule=0",
            "reward_model.judge.enable=True",
            "reward_model.judge.model_path=tiny-qwen3",
        ],
    ],
    ids=["custom_function", "verify_only", "judge_only"],
)
def test_custom_functions_and_judge_or_verify_only_runs_are_not_held_to_built_in_sources(
    tmp_path, overrides
):
    reward = write(
        tmp_path / "reward.py",
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n",
    )
    verify = write(tmp_path / "verify.py", "def verify(sample, tools):\n    return 1.0\n")
    train = rows_file(tmp_path / "train.jsonl", ["toy"] * 4)
    val = rows_file(tmp_path / "val.jsonl", [None] * 2)
    overrides = [o.replace("REWARD", reward).replace("VERIFY", verify) for o in overrides]
    config, _ = load_config([*base(tmp_path, train), f"data.val_files={val}", *overrides])
    plan = plan_run(config)  # every start-up check passes; nothing has started yet
    try:
        assert len(plan.val_rows) == 2
    finally:
        plan.tracking.finish()


# --- verl's reward_model keys ------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["reward_model.enable=True"],
            "reward_model.enable=True asks for verl's model-based reward model, which is not "
            "supported here: a model that scores responses here is the judge; set "
            "reward_model.enable=False and reward_model.judge.enable=True with "
            "reward_model.judge.model_path=<model>",
        ),
        (
            ["reward_model.reward_manager=dapo"],
            "reward_model.reward_manager=dapo (verl's DAPO manager: its overlong-response "
            "penalty) is not supported here: set reward_model.reward_manager=naive (the same "
            "per-sample calls, without the penalty)",
        ),
        (
            ["reward_model.reward_manager=batch"],
            "reward_model.reward_manager=batch calls custom_reward_function once per batch with "
            "lists, and the built-in scorers score one sample at a time: set "
            "custom_reward_function.path to a file with compute_score(data_sources, "
            "solution_strs, ground_truths, extra_infos, **kwargs), or set "
            "reward_model.reward_manager=naive",
        ),
        (
            ["reward_model.reward_manager=custom_mgr"],
            "reward_model.reward_manager must be one of 'naive', 'batch', 'prime', 'dapo', got "
            "'custom_mgr'",
        ),
        (
            ["+custom_reward_function.reward_kwargs.method=fuzzy"],
            "custom_reward_function.reward_kwargs.method='fuzzy': the built-in gsm8k scorer "
            "takes strict (the answer after '#### ') or flexible (the last number)",
        ),
    ],
    ids=["enable", "dapo", "batch_built_in", "unknown_manager", "bad_method"],
)
def test_verl_reward_keys_we_cannot_honor_fail_at_start_up(capsys, tmp_path, overrides, message):
    train = rows_file(tmp_path / "train.jsonl", ["openai/gsm8k"] * 4)
    assert train_error(capsys, *base(tmp_path, train), *overrides) == message


def test_a_custom_function_that_cannot_take_the_keywords_fails_at_start_up(capsys, tmp_path):
    reward = write(
        tmp_path / "gsm8k.py",
        "def compute_score(solution_str, ground_truth, method='strict'):\n    return 0.0\n",
    )
    train = rows_file(tmp_path / "train.jsonl", ["openai/gsm8k"] * 4)
    err = train_error(capsys, *base(tmp_path, train), f"custom_reward_function.path={reward}")
    assert err == (
        f"{reward}:compute_score cannot take the keywords data_source, extra_info: reward "
        "functions are called by keyword, as verl calls them; define it as def compute_score("
        "data_source, solution_str, ground_truth, extra_info, **kwargs) -> float | dict"
    )


def test_prime_runs_the_function_in_the_process_pool_and_says_so(tmp_path, caplog):
    train = rows_file(tmp_path / "train.jsonl", ["openai/gsm8k"] * 4)
    config, _ = load_config([*base(tmp_path, train), "reward_model.reward_manager=prime"])
    with caplog.at_level(logging.WARNING, logger="agentloop.train"):
        check_rewards(config, {"train": [{"data_source": "openai/gsm8k"}]})
    assert [r.getMessage() for r in caplog.records] == [
        "reward_model.reward_manager=prime: verl's PRIME manager scores each sample in a "
        "process pool; here that is custom_reward_function.executor=process, used for this run "
        "(num_workers=4, timeout_s=30); set reward_model.reward_manager=naive and "
        "custom_reward_function.executor=process to say so directly"
    ]


def test_batch_and_naive_with_a_file_and_reward_kwargs_pass_the_start_up_checks(tmp_path):
    reward = write(
        tmp_path / "reward.py",
        "def per_sample(data_source, solution_str, ground_truth, extra_info, scale):\n"
        "    return scale\n"
        "def per_batch(data_sources, solution_strs, ground_truths, extra_infos, scale):\n"
        "    return [scale] * len(data_sources)\n",
    )
    train = rows_file(tmp_path / "train.jsonl", ["toy"] * 4)
    for manager, name in (("naive", "per_sample"), ("batch", "per_batch")):
        config, _ = load_config(
            [
                *base(tmp_path, train),
                f"custom_reward_function.path={reward}",
                f"custom_reward_function.name={name}",
                "+custom_reward_function.reward_kwargs.scale=0.5",
                f"reward_model.reward_manager={manager}",
            ]
        )
        check_rewards(config, {"train": [{"data_source": "toy"}]})

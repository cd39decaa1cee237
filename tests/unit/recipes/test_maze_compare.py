"""``recipes.maze.compare`` over ``recipes.paired``: two validation dumps paired maze by maze,
the exit read as the reward reads it, the exact sign test against its definition, and
mismatched dumps refused."""

from __future__ import annotations

import json
import math

import pytest

from recipes.maze.compare import Habits, habits, load_walks, main, reached_exit
from recipes.paired import compare, read_dump, sign_test


def dump(path, exits: list[bool], talk: bool = False, walls: list[int] | None = None):
    """A dump of walks; ``walls[i]``: walk i's moves into a wall (a walk that bumped is cut at
    the length limit, one that did not ended by answering)."""
    walls = walls or [0] * len(exits)
    with path.open("w") as f:
        for i, reached in enumerate(exits):
            if talk:  # the simulated user's rows: no tool reward, the rule score is the exit
                tool_rewards, scores = {}, {"rule": float(reached)}
            else:  # a settled score: 1 only at the exit, 0.1 x distance elsewhere
                tool_rewards = {"move": float(reached)}
                scores = {"rule": 1.0 if reached else 1.2, "turns": -0.3}
            record = {"index": i, "step": 8, "tool_rewards": tool_rewards, "scores": scores}
            bump = "<tool_response>\nA wall blocks the way up. You are at row 1, column 1.\n"
            record["response_text"] = "<tool_call>...</tool_call>" + bump * walls[i]
            record["stop_reason"] = "length" if walls[i] else "no_tool_call"
            f.write(json.dumps(record) + "\n")
    return path


def test_the_exit_is_the_move_tools_reward_else_the_users_rule_score():
    assert reached_exit({"tool_rewards": {"move": 1.0}, "scores": {"rule": 0.4}})
    assert not reached_exit({"tool_rewards": {"move": 0.0}, "scores": {"rule": 1.2}})
    assert reached_exit({"tool_rewards": {}, "scores": {"rule": 1.0}})
    assert not reached_exit({"tool_rewards": None, "scores": {"rule": 0.0}})
    with pytest.raises(ValueError) as info:
        reached_exit({"index": 7, "tool_rewards": {}, "scores": {}})
    assert str(info.value) == (
        "row index 7: neither a move-tool reward nor a rule score; compare the dumps of a maze "
        "run (trainer.validation_data_dir)"
    )


def test_the_sign_test_is_the_binomial_tail_doubled():
    assert sign_test(3, 0) == pytest.approx(0.25)
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 5) == 1.0
    assert sign_test(31, 1) == pytest.approx(2 * (1 + 32) / 2**32)
    assert sign_test(2, 9) == pytest.approx(2 * sum(math.comb(11, i) for i in range(3)) / 2**11)


def test_two_runs_pair_by_maze(tmp_path, capsys):
    a = [True, True, False, True, False, True]
    b = [True, False, False, False, True, False]
    pa, pb = dump(tmp_path / "a.jsonl", a), dump(tmp_path / "b.jsonl", b, talk=True)
    r = compare(load_walks(pa), load_walks(pb))
    assert (r.n, r.a_only, r.b_only) == (6, 3, 1)
    assert r.a_rate == pytest.approx(4 / 6) and r.b_rate == pytest.approx(2 / 6)
    assert r.diff_points == pytest.approx(100 * 2 / 6)
    assert r.paired_se_points == pytest.approx(100 * 2 / 6)
    assert r.p_value == pytest.approx(2 * 5 / 16)
    main([str(pa), str(pb)])
    assert capsys.readouterr().out == (
        "A: 6 walks, 66.7% at the exit, 0.00 moves into a wall a walk, 0 cut at the length limit, "
        "2 answered short of the exit\n"
        "B: 6 walks, 33.3% at the exit, 0.00 moves into a wall a walk, 0 cut at the length limit, "
        "4 answered short of the exit\n"
        "6 mazes: A 66.7%, B 33.3%, A - B +33.3 points (paired SE 33.3); "
        "A alone 3, B alone 1; sign test p = 0.62\n"
    )


def test_a_dumps_habits_count_wall_moves_and_cut_walks(tmp_path, capsys):
    exits = [True, False, False, True, False]
    path = dump(tmp_path / "a.jsonl", exits, walls=[0, 3, 5, 1, 0])
    got = habits(read_dump(path))
    assert got == Habits(walks=5, exit_rate=0.4, wall_moves=1.8, cut=3, gave_up=1)
    main([str(path)])  # one dump alone: its habits only
    assert capsys.readouterr().out == (
        "A: 5 walks, 40.0% at the exit, 1.80 moves into a wall a walk, 3 cut at the length limit, "
        "1 answered short of the exit\n"
    )
    with pytest.raises(ValueError) as info:
        habits([])
    assert str(info.value) == "the dump holds no walks"


def test_a_training_dump_gives_its_habits_but_is_not_paired(tmp_path, capsys):
    one = dump(tmp_path / "one.jsonl", [True, False], walls=[0, 2])
    group = tmp_path / "5.jsonl"  # a training dump: each maze walked twice
    group.write_text(one.read_text() * 2)
    main([str(group)])
    assert capsys.readouterr().out == (
        "A: 4 walks, 50.0% at the exit, 1.00 moves into a wall a walk, 2 cut at the length limit, "
        "0 answered short of the exit\n"
    )
    with pytest.raises(ValueError) as info:
        main([str(group), str(one)])
    assert str(info.value) == (
        f"{group}: row index 0 appears more than once (a training dump, or "
        "rollout.val_kwargs.n > 1), so there is no one sample a row to pair; pass it alone for "
        "its habits"
    )


def test_dumps_of_different_mazes_are_refused(tmp_path):
    pa = dump(tmp_path / "a.jsonl", [True, False, True])
    pb = dump(tmp_path / "b.jsonl", [True, False])
    with pytest.raises(ValueError) as info:
        compare(load_walks(pa), load_walks(pb))
    assert str(info.value) == (
        "the dumps hold different rows (e.g. index [2]); compare validations of the same "
        "data.val_files"
    )

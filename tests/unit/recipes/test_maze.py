"""The maze recipe (issue 56): generated mazes several moves deep, train and validation apart;
the ``move`` tool's observations, progress rewards, walls, move limit and named states; solved
SFT conversations that replay exactly through the real tool; the simulated-user version; and
a real ``tool_agent`` rollout whose calls name their cells, which GiGPO reads as anchor keys."""

from __future__ import annotations

import json
import random

import pytest
import torch

from recipes.maze.compare import Habits, habits, reached_exit
from recipes.maze.data import (
    make_mazes,
    make_rows,
    make_sft_rows,
    maze_key,
    write_task,
)
from recipes.maze.env import MAX_MOVES, MOVES, WALL_REPLY, Maze, make_maze, observe
from recipes.maze.interaction import MazeUser, direction_of
from recipes.maze.reward import compute_score
from recipes.maze.tools import MoveTool


def maze_of(row: dict) -> Maze:
    spec = row["extra_info"].get("tools_kwargs", {}).get("move", {}).get("create_kwargs")
    spec = spec or row["extra_info"]["interaction_kwargs"]
    return Maze.from_json(spec["maze"])


def test_mazes_are_several_moves_deep_solvable_and_apart_between_splits():
    rng = random.Random(0)
    for _ in range(50):
        maze = make_maze(rng)
        path = maze.shortest_path()
        assert 4 <= len(path) <= 8
        cell = maze.start
        for move in path:
            cell = maze.step(cell, move)
        assert cell == maze.goal
    assert make_rows(3, 0, "train") == make_rows(3, 0, "train")  # seeded


def test_validation_and_sft_mazes_are_none_of_the_training_ones(tmp_path):
    write_task(tmp_path, train=64, val=32, sft=32)

    def keys(name: str) -> set[str]:
        rows = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        return {maze_key(maze_of(r)) for r in rows}

    train, val, talk = keys("train.jsonl"), keys("val.jsonl"), keys("val_talk.jsonl")
    assert len(train) == 64 and len(val) == 32 and val == talk and not train & val


def test_an_observation_shows_the_neighbours_and_the_exits_offset_only():
    maze = Maze(("#####", "#...#", "###.#", "#####"), (1, 1), (2, 3))
    assert observe(maze, (1, 1)) == (
        "You are at row 1, column 1. up: wall, down: wall, left: wall, right: open. "
        "The exit is 1 down, 2 right."
    )


async def test_the_move_tool_rewards_progress_names_cells_and_counts_moves():
    maze = Maze(("#####", "#...#", "###.#", "#####"), (1, 1), (2, 3))
    tool = MoveTool({"progress": 0.1, "invalid": 0.2})
    iid = await tool.create(maze=maze.to_json(), max_moves=3)
    bump = await tool.execute(iid, {"direction": "up"})
    assert bump.reward == pytest.approx(-0.2) and bump.state_key == "(1, 1)"
    assert bump.text.startswith("A wall blocks the way up. You are at row 1, column 1.")
    assert bump.text.endswith("Moves left: 2.")
    step = await tool.execute(iid, {"direction": "right"})
    assert step.reward == pytest.approx(0.1) and step.state_key == "(1, 2)"
    assert await tool.calc_reward(iid) == 0.0
    done = await tool.execute(iid, {"direction": "right"})
    assert done.reward == pytest.approx(0.1) and "Moves left: 0." in done.text
    out = await tool.execute(iid, {"direction": "down"})
    assert out.text == "You have no moves left." and out.reward is None
    with pytest.raises(Exception) as info:
        await tool.execute(iid, {"direction": "north"})
    assert str(info.value) == "direction must be one of up, down, left, right, got 'north'"
    iid2 = await tool.create(maze=maze.to_json(), max_moves=5)
    for move in maze.shortest_path():
        last = await tool.execute(iid2, {"direction": move})
    assert last.text == "You reached the exit!" and last.state_key == "exit"
    assert await tool.calc_reward(iid2) == 1.0


async def test_sft_conversations_replay_exactly_through_the_real_tool():
    tool = MoveTool()
    for row, maze in zip(make_sft_rows(10, 2), make_mazes(10, 2), strict=True):
        iid = await tool.create(maze=maze.to_json(), max_moves=MAX_MOVES)
        messages = row["messages"]
        assert messages[1]["content"] == observe(maze, maze.start)
        for said, heard in zip(messages[2:-1:2], messages[3:-1:2], strict=True):
            args = said["tool_calls"][0]["function"]["arguments"]
            assert (await tool.execute(iid, args)).text == heard["content"]
        assert messages[-1] == {"role": "assistant", "content": "Done."}
        assert await tool.calc_reward(iid) == 1.0


async def test_the_simulated_user_version_scores_turns_and_ends_at_the_exit():
    maze = Maze(("#####", "#...#", "###.#", "#####"), (1, 1), (2, 3))
    user = MazeUser({"progress": 0.1, "invalid": 0.1})
    iid = await user.start_interaction("s", maze=maze.to_json(), max_moves=6)
    said = [{"role": "assistant", "content": "I think I should go RIGHT."}]
    done, text, score, _ = await user.generate_response(iid, said)
    assert (done, score) == (False, pytest.approx(0.1)) and text == observe(maze, (1, 2))
    done, text, score, _ = await user.generate_response(iid, [{"content": "hmm"}])
    assert not done and text.startswith("Answer with one direction.") and score == -0.1
    for move in ("right", "down"):
        done, text, score, _ = await user.generate_response(iid, [{"content": move}])
    assert done and text == "You reached the exit!" and await user.calculate_score(iid) == 1.0
    assert direction_of("left, then up") == "up" and direction_of("") is None


def test_the_reward_is_the_exit_from_the_tool_or_the_user():
    assert compute_score("maze", "", "exit", {"tool_rewards": {"move": 1.0}}) == 1.0
    assert compute_score("maze", "", "exit", {"tool_rewards": {"move": 0.0}}) == 0.0
    assert compute_score("maze", "", "exit", {"interaction": {"final_score": 1.0}}) == 1.0
    assert compute_score("maze", "", "exit", {}) == 0.0


async def test_a_tool_agent_rollout_names_each_turns_cell_for_gigpo(tmp_path, tokenizer):
    from agentloop import MultiTurnConfig, RolloutConfig
    from agentloop.config import AgentConfig
    from agentloop.worker import AgentLoopWorker
    from tests.unit.agentloop.scripted import ScriptedServer
    from trainer.loop.advantages import gigpo_steps
    from trainer.workers import TrainBatch

    write_task(tmp_path, train=2, val=1, sft=1)
    row = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    maze = maze_of(row)
    path = maze.shortest_path()

    def call(move: str) -> str:
        body = {"name": "move", "arguments": {"direction": move}}
        return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"

    # one move into the wall above the start (row 1 is the top row), then the shortest path
    turns = [call("up")] + [call(m) for m in path] + ["Done."]
    config = RolloutConfig(
        prompt_length=1024,
        response_length=2048,
        multi_turn=MultiTurnConfig(max_assistant_turns=MAX_MOVES + 1),
        agent=AgentConfig(default_agent_loop="tool_agent"),
    )
    server = ScriptedServer(tokenizer, turns, end_token="<|im_end|>")
    worker = AgentLoopWorker(config, server, tokenizer, tools={"move": MoveTool()})
    sample = {**row, "raw_prompt": row["prompt"], "uid": "u", "rollout_n": 0}
    (out,) = await worker.generate_sequences([sample])
    record = out.record
    assert [c.state_key for c in record.calls][-1] == "exit"
    assert record.tool_rewards == {"move": 1.0}
    assert compute_score("maze", "", "exit", {"tool_rewards": record.tool_rewards}) == 1.0
    # as a validation dump holds it: the exit, and the one move into a wall in the replies
    dumped = {"tool_rewards": record.tool_rewards, "stop_reason": record.stop_reason}
    dumped["response_text"] = tokenizer.decode(out.response_ids)
    assert reached_exit(dumped)
    assert habits([dumped]) == Habits(walks=1, exit_rate=1.0, wall_moves=1.0, cut=0, gave_up=0)
    # what the trainer makes of it: one anchor key per model turn, named by the tool's cells
    p, r = len(out.prompt_ids), len(out.response_ids)
    ids = torch.tensor([out.prompt_ids + out.response_ids])
    attn = torch.ones_like(ids)
    batch = TrainBatch(
        input_ids=ids, attention_mask=attn, position_ids=attn.cumsum(1) - 1,
        response_mask=torch.tensor([out.response_mask]),
    )  # fmt: skip
    assert batch.prompt_length == p and batch.response_length == r
    steps = gigpo_steps(batch, type("R", (), {"records": [record]})(), None)
    keys = steps.keys[0]
    assert len(keys) == len(path) + 2 and not keys[0].startswith("state:")
    assert keys[1] == "state:(1, 1)"  # the bump left the walk where it started
    assert keys[1:] == [f"state:{c.state_key}" for c in record.calls]
    assert set(MOVES) >= {c.arguments["direction"] for c in record.calls}


async def test_settled_progress_sums_to_the_starts_distance_whatever_the_walk():
    """``settle``: random walks through the real tool, ended anywhere (moves left or not, the
    exit or not): their progress rewards plus the settle term always make ``settle`` x the
    start's distance, walls aside, so no walk gains by stopping early; acc is the exit."""
    rng = random.Random(3)
    tool = MoveTool({"progress": 0.1, "invalid": 0.0})
    ends = set()
    for maze in make_mazes(12, 5):
        start = maze.distances()[maze.start]
        for _ in range(6):
            spec = {"maze": maze.to_json(), "max_moves": MAX_MOVES}
            iid = await tool.create(**spec)
            calls, progress = [], 0.0
            for _ in range(rng.randrange(0, 10)):
                out = await tool.execute(iid, {"direction": rng.choice(list(MOVES))})
                progress += out.reward or 0.0
                calls.append({"name": "move", "state_key": out.state_key})
            info = {
                "tool_rewards": {"move": await tool.calc_reward(iid)},
                "calls": calls,
                "tools_kwargs": {"move": {"create_kwargs": spec}},
            }
            got = compute_score("maze", "", "exit", info, settle=0.1)
            reached = await tool.calc_reward(iid)
            assert got["acc"] == reached
            assert progress + got["score"] - reached == pytest.approx(0.1 * start)
            ends.add((reached, len(calls) > 0))
    assert ends >= {(0.0, False), (0.0, True)}  # walks of no move and walks cut short ran
    solved = make_mazes(1, 5)[0]
    spec = {"maze": solved.to_json(), "max_moves": MAX_MOVES}
    iid = await tool.create(**spec)
    for move in solved.shortest_path():
        await tool.execute(iid, {"direction": move})
    info = {"tool_rewards": {"move": 1.0}, "calls": [{"name": "move", "state_key": "exit"}]}
    info["tools_kwargs"] = {"move": {"create_kwargs": spec}}
    assert compute_score("maze", "", "exit", info, settle=0.1) == {"score": 1.0, "acc": 1.0}


async def test_give_up_charges_the_moves_left_so_no_answer_beats_moving_on():
    """``give_up``: random walks through the real tool (walls at 0.1) that stop short of the exit:
    progress + score make settle x the start's distance less 0.1 for every wall hit and every
    move left, the least any continuation of the walk can score (all its moves into walls), so
    answering early never pays more than moving on. Walks that reach the exit or use every move
    are not charged."""
    rng = random.Random(5)
    tool = MoveTool({"progress": 0.1, "invalid": 0.1})
    charged = 0
    for maze in make_mazes(12, 6):
        start = maze.distances()[maze.start]
        for _ in range(6):
            spec = {"maze": maze.to_json(), "max_moves": MAX_MOVES}
            iid = await tool.create(**spec)
            calls, progress, walls = [], 0.0, 0
            for _ in range(rng.randrange(0, MAX_MOVES + 2)):
                out = await tool.execute(iid, {"direction": rng.choice(list(MOVES))})
                progress += out.reward or 0.0
                walls += out.text.startswith(WALL_REPLY)
                calls.append({"name": "move", "state_key": out.state_key})
            reached = await tool.calc_reward(iid)
            info = {
                "tool_rewards": {"move": reached},
                "calls": calls,
                "tools_kwargs": {"move": {"create_kwargs": spec}},
            }
            got = compute_score("maze", "", "exit", info, settle=0.1, give_up=0.1)
            used = sum(1 for c in calls if c["state_key"].startswith("("))
            left = MAX_MOVES - used if not reached else 0
            charged += left > 0
            want = 1.0 + 0.1 * start - 0.1 * walls if reached else 0.1 * (start - walls - left)
            assert progress + got["score"] == pytest.approx(want)
            assert got["acc"] == reached
    assert charged > 20  # most walks stopped with moves left
    info = {"tool_rewards": {"move": 0.0}, "calls": [], "tools_kwargs": {"move": {}}}
    info["tools_kwargs"]["move"]["create_kwargs"] = {"maze": maze.to_json(), "max_moves": 5}
    assert compute_score("maze", "", "exit", info, give_up=0.2) == {"score": -1.0, "acc": 0.0}


def test_settle_on_the_simulated_user_rows_is_refused_naming_the_key():
    with pytest.raises(ValueError) as info:
        compute_score("maze", "", "exit", {"interaction": {"final_score": 0.0}}, settle=0.1)
    assert str(info.value) == (
        "custom_reward_function.reward_kwargs.settle needs the move-tool rows "
        "(extra_info.tools_kwargs.move); the simulated-user rows name no cells: drop settle"
    )
    with pytest.raises(ValueError) as info:
        compute_score("maze", "", "exit", {"interaction": {"final_score": 0.0}}, give_up=0.1)
    assert str(info.value) == (
        "custom_reward_function.reward_kwargs.give_up needs the move-tool rows "
        "(extra_info.tools_kwargs.move); the simulated-user rows name no cells: drop give_up"
    )

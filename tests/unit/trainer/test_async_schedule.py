"""The async schedule (``trainer.loop.async_schedule``) in a tick simulation of a run: a
producer that admits whenever there is room (and sometimes stalls, missing pushes), groups
that finish and are scored after random delays (some scores outlast several steps), a filter
that drops groups, and a trainer that takes each step's groups and pushes every ``m`` steps.
Swept over staleness 0-6, every push interval the validator accepts (1..s+1), filter on and
off, 1-3 groups per step: every run finishes its steps, no group is trained more than ``s``
versions after its admission, no group twice, and nothing scored is lost."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from trainer.loop.async_schedule import Admitted, GroupSchedule

STEPS = 12


@dataclass
class Run:
    steps_done: int = 0
    trained: list[tuple[int, Admitted]] = field(default_factory=list)
    admitted: int = 0
    dropped: int = 0
    left: int = 0
    hang: str | None = None


def simulate(staleness: int, push_every: int, per_step: int, filter_groups: bool, seed: int) -> Run:
    rng = random.Random(seed)
    schedule: GroupSchedule[str] = GroupSchedule(per_step, staleness, STEPS * per_step)
    run = Run()
    finishing: dict[int, list] = {}  # tick -> keys whose rollout ends
    scored: dict[int, list] = {}  # tick -> keys whose score ends
    producer_free, trainer_free, step, position = 0, 0, 1, 0
    for tick in range(4000):
        if tick >= producer_free:
            while schedule.room() > 0:
                key = (0, position)
                position += 1
                schedule.admit(key)
                finishing.setdefault(tick + rng.randint(1, 6), []).append(key)
            if rng.random() < 0.1:  # a stall: the producer misses the next pushes
                producer_free = tick + rng.randint(2, 20)
        for key in finishing.pop(tick, []):
            slow = rng.random() < 0.15  # a judge or sandbox score outlasting several steps
            scored.setdefault(
                tick + (rng.randint(5, 30) if slow else rng.randint(0, 2)), []
            ).append(key)
        for key in scored.pop(tick, []):
            keep = not (filter_groups and rng.random() < 0.3)
            schedule.finish(key, "batch", keep=keep)
        if tick == trainer_free and step > 1:  # the update ended: push every m steps, and last
            if (step - 1) % push_every == 0 or step - 1 == STEPS:
                schedule.pushed(step - 1)
        if tick >= trainer_free:
            if step > STEPS:
                break
            chosen = schedule.take(step)
            if chosen is not None:
                run.trained += [(step, admitted) for admitted, _ in chosen]
                trainer_free = tick + rng.randint(1, 4)
                step += 1
    else:
        run.hang = schedule.describe(step)
    run.steps_done = step - 1
    run.admitted, run.dropped = schedule.admitted, schedule.dropped
    run.left = len(schedule.ready) + len(schedule.pending)
    return run


SETTINGS = [
    (s, m, g, f)
    for s in range(7)
    for m in range(1, s + 2)
    for g in (1, 2, 3)
    for f in (False, True)
]


@pytest.mark.parametrize("staleness", range(7))
def test_every_accepted_setting_finishes_within_the_bound_and_loses_nothing(staleness):
    runs = 0
    for s, m, g, f in SETTINGS:
        if s != staleness:
            continue
        for seed in range(6):
            run = simulate(s, m, g, f, seed)
            where = f"staleness={s} push_every={m} groups={g} filter={f} seed={seed}"
            assert run.hang is None, f"{where}: waits forever: {run.hang}"
            assert run.steps_done == STEPS, where
            assert len(run.trained) == STEPS * g, where
            lags = [step - 1 - a.version for step, a in run.trained]
            assert max(lags) <= s, f"{where}: a group trained {max(lags)} versions late"
            keys = [a.key for _, a in run.trained]
            assert len(set(keys)) == len(keys), f"{where}: a group trained twice"
            # every admitted group is trained, filtered out, or still waiting at the end
            assert run.admitted == len(keys) + run.dropped + run.left, where
            runs += 1
    assert runs == 6 * 6 * (staleness + 1)


def test_staleness_0_trains_the_groups_in_admission_order():
    for seed in range(3):
        run = simulate(0, 1, 3, False, seed)
        assert [a.seq for _, a in run.trained] == list(range(STEPS * 3))
        assert all(step - 1 == a.version for step, a in run.trained)  # on-policy


def test_a_version_jump_after_a_push_every_3_steps_is_taken_at_once():
    """The case that hung before: staleness 2, a push every 3 steps; after the push at step 3
    every untrained group is of version 3, and step 4 takes them."""
    schedule: GroupSchedule[str] = GroupSchedule(1, 2, 10)
    for step in (1, 2, 3):
        while schedule.room():
            schedule.finish(schedule.admit((0, schedule.admitted)).key, "b")
        assert [a.version for a, _ in schedule.take(step) or []] == [0]
    schedule.pushed(3)
    while schedule.room():
        schedule.finish(schedule.admit((0, schedule.admitted)).key, "b")
    assert [a.version for a, _ in schedule.take(4) or []] == [3]


def test_a_group_due_now_is_waited_for_and_a_later_one_never_takes_its_slot():
    schedule: GroupSchedule[str] = GroupSchedule(1, 1, 10)
    old = schedule.admit((0, 0))  # version 0: due at step 2
    schedule.finish(schedule.admit((0, 1)).key, "b")
    assert [a.key for a, _ in schedule.take(1) or []] == [(0, 1)]
    schedule.pushed(1)
    schedule.finish(schedule.admit((0, 2)).key, "b")  # version 1, due at step 3
    assert schedule.take(2) is None  # (0, 0) is due at step 2 and not scored yet
    assert "1 of them due now" in schedule.describe(2)
    schedule.finish(old.key, "b")
    assert [a.key for a, _ in schedule.take(2) or []] == [(0, 0)]


def test_an_early_group_waits_while_older_ones_in_flight_fill_the_steps_before_its_deadline():
    schedule: GroupSchedule[str] = GroupSchedule(1, 3, 10)
    first = [schedule.admit((0, i)) for i in range(4)]  # version 0, due at step 4
    schedule.finish(first[0].key, "b")
    assert schedule.take(1) is not None
    schedule.pushed(1)
    schedule.pushed(2)
    late = schedule.admit((0, 4))  # version 2, due at step 6
    schedule.finish(late.key, "b")
    # steps 2-4 are needed by the three version-0 groups still in flight: the late one waits
    assert schedule.take(2) is None
    schedule.finish(first[1].key, "b")
    assert [a.key for a, _ in schedule.take(2) or []] == [(0, 1)]

"""Which finished groups an async step trains, and how many prompts the stream may admit.

Pure bookkeeping, no threads and no I/O: ``AsyncRollout`` calls it under its lock, and the
simulation test (tests/unit/trainer/test_async_schedule.py) drives it through 1,008 runs of
settings and delays.

Versions count updates: the trainer at step ``k`` holds version ``k - 1``. A group admitted
while the servers held version ``v`` must be trained by step ``deadline = v + s + 1``
(``s``: ``staleness_threshold``), so that none lags the policy it trains more than ``s``.

- Admission: while fewer than ``(served + s + 1) * G`` groups (``G`` per step, plus the ones
  filtered out) were admitted over the run, and no more than the run trains.
- A step waits for every unscored group whose deadline is this step; then it takes the
  scored groups earliest deadline first (admission order among equals). A group with a later
  deadline ``D`` is taken only if, for every step ``d`` before ``D``, the groups still to
  train with deadlines up to ``d`` fit in the steps left until ``d`` (``(d - k) * G``): a
  group trained early must not take the slot an older one needs. Future admissions never
  enter that count: they come at the servers' version or later, so their deadlines are past
  every scored group's.

Versions may jump (a push every few steps, a producer that misses pushes): the rule looks at
deadlines, not at version numbers next to the step, so a step always has groups it may take
once the ones it waits for are scored. Finished work is never dropped for staleness; only
``filter_groups`` drops a group (and a replacement is admitted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from trainer.data.sampler import RowKey

__all__ = ["Admitted", "GroupSchedule"]

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class Admitted:
    key: RowKey
    """The sampler's key of the prompt (epoch, position)."""
    seq: int
    """Admission order over the run (the sampler's order)."""
    version: int
    """Version the servers held when admitted."""
    deadline: int
    """The last step that may train it (``version + staleness + 1``)."""


class GroupSchedule(Generic[T]):
    """Admitted, scored and trained groups of an async run; ``T`` is what a scored group
    carries to the step (the trainer's batch and reward)."""

    def __init__(self, groups_per_step: int, staleness: int, total_groups: int) -> None:
        self.groups_per_step = groups_per_step
        self.staleness = staleness
        self.total_groups = total_groups
        self.served = 0
        """The version the servers hold (the last pushed)."""
        self.admitted = 0
        self.dropped = 0
        self.pending: dict[RowKey, Admitted] = {}
        """Admitted, not yet scored."""
        self.ready: list[tuple[Admitted, T]] = []
        """Scored, not yet trained."""

    # ---- admission ----------------------------------------------------------------------
    def room(self) -> int:
        """Groups the stream may admit now."""
        g, s = self.groups_per_step, self.staleness
        limit = min((self.served + s + 1) * g, self.total_groups) + self.dropped
        return max(limit - self.admitted, 0)

    def admit(self, key: RowKey) -> Admitted:
        admitted = Admitted(key, self.admitted, self.served, self.served + self.staleness + 1)
        self.pending[key] = admitted
        self.admitted += 1
        return admitted

    def finish(self, key: RowKey, payload: T, *, keep: bool = True) -> Admitted:
        """A group is scored: ready to train, or (``keep=False``) filtered out."""
        admitted = self.pending.pop(key)
        if keep:
            self.ready.append((admitted, payload))
        else:
            self.dropped += 1
        return admitted

    def pushed(self, version: int) -> None:
        self.served = version

    def restore(self, step: int) -> None:
        """After resuming from the checkpoint of ``step``: its groups admitted and trained."""
        self.served = step
        self.admitted = step * self.groups_per_step

    # ---- a step -------------------------------------------------------------------------
    def waiting_for(self, step: int) -> list[Admitted]:
        """Unscored groups that step ``step`` must train (their deadline is now)."""
        return [a for a in self.pending.values() if a.deadline <= step]

    def _fits(self, step: int, deadline: int, left: list[int]) -> bool:
        """Taking a group due at ``deadline`` now leaves, for each step ``d`` before it, room
        for the untrained groups due by ``d`` (``left``: their deadlines, sorted)."""
        g = self.groups_per_step
        due = 0
        for d in range(step + 1, deadline):
            while due < len(left) and left[due] <= d:
                due += 1
            if due > (d - step) * g:
                return False
        return True

    def take(self, step: int) -> list[tuple[Admitted, T]] | None:
        """Step ``step``'s groups in admission order, or None while it must wait."""
        if self.waiting_for(step):
            return None
        g = self.groups_per_step
        candidates = sorted(self.ready, key=lambda r: (r[0].deadline, r[0].seq))
        if len(candidates) < g:
            return None
        chosen = candidates[:g]
        rest = sorted(
            [a.deadline for a, _ in candidates[g:]] + [a.deadline for a in self.pending.values()]
        )
        if not self._fits(step, chosen[-1][0].deadline, rest):
            return None
        taken = {id(r) for r in chosen}
        self.ready = [r for r in self.ready if id(r) not in taken]
        return sorted(chosen, key=lambda r: r[0].seq)

    def describe(self, step: int) -> str:
        """What step ``step`` waits for (the wait log)."""

        def versions(items: list[Admitted]) -> str:
            counts: dict[int, int] = {}
            for a in items:
                counts[a.version] = counts.get(a.version, 0) + 1
            return ", ".join(f"v{v} x{n}" for v, n in sorted(counts.items())) or "none"

        must = self.waiting_for(step)
        return (
            f"step {step} (trainer version {step - 1}, servers at {self.served}, staleness "
            f"{self.staleness}) needs {self.groups_per_step} groups: {len(self.ready)} scored "
            f"({versions([a for a, _ in self.ready])}), {len(self.pending)} in flight or "
            f"scoring ({versions(list(self.pending.values()))}), {len(must)} of them due now; "
            f"{self.room()} more may be admitted"
        )

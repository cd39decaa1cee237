"""``data.sampler``: the order of the training rows picked by a sampler class of the user's,
with verl's contract:

- constructed once as ``cls(data_source=<the training rows: len() and [i]>,
  data_config=<the data config as an OmegaConf DictConfig>)``;
- iterated for dataset indices, lazily, one row at a time, so that what it yields after a
  step can depend on that step (an epoch ends after ``len(rows) // train_batch_size`` batches,
  or earlier when its iterator ends; the next epoch iterates it again);
- ``update(batch)`` after every training step, where it has the method (verl's
  ``AbstractCurriculumSampler``), with the step's samples as ``StepBatch`` (the attributes a
  curriculum sampler reads of verl's ``DataProto``: ``batch``, ``non_tensor_batch``,
  ``meta_info``, ``len()``);
- ``state_dict()`` saved in every checkpoint and ``load_state_dict()`` on resume, where it
  has them; iterating it again after that goes on with the order it would have had when its
  state holds where its iteration stands (torchdata's stateful samplers' contract, which
  verl's resume relies on too). Either way the rest of the epoch leaves out the rows the run
  already drew in it, so no prompt is trained twice or skipped; a sampler without a state is
  rebuilt and says so (logged).
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from agentloop.batch import RolloutBatch
from servers.user_code import load_object
from trainer.algos.core import scores_to_token_rewards
from trainer.config.schema import DataConfig
from trainer.data.sampler import PromptSampler, RowKey

__all__ = ["StepBatch", "UserSampler", "build_sampler"]

logger = logging.getLogger(__name__)

KEY = "data.sampler"


@dataclass(slots=True)
class StepBatch:
    """One training step's samples, shaped as the parts of verl's ``DataProto`` a curriculum
    sampler reads: ``batch`` (tensors: ``responses``, ``attention_mask``, ``response_mask``,
    ``token_level_scores`` and ``token_level_rewards``, the score on each sample's last
    response token, and ``scores`` [batch]), ``non_tensor_batch`` (object arrays: ``index``,
    the row's ``extra_info.index`` or position; ``dataset_index``, the row's position in the
    sampler's ``data_source``; ``uid``, ``data_source``, ``reward_model``, ``extra_info``) and
    ``meta_info`` (``global_steps``)."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.non_tensor_batch["uid"])


class UserSampler(PromptSampler):
    """``PromptSampler``'s keys, batches, requeue and state, over the user sampler's order."""

    def __init__(self, rows: list[dict[str, Any]], batch_size: int, sampler: Any) -> None:
        super().__init__(rows, batch_size, shuffle=False)
        self.sampler = sampler
        self._drawn: dict[int, list[int]] = {}  # dataset indices drawn, per epoch (last two)
        self._iter: Any = None
        self._iter_epoch = -1
        self._skip: set[int] = set()  # resumed without sampler state: drawn before the stop
        indices = [row.get("index") for row in rows]
        unique = len(set(map(repr, indices))) == len(indices)
        self._position = {repr(k): i for i, k in enumerate(indices)} if unique else None

    def _draw(self, epoch: int, position: int) -> int:
        drawn = self._drawn.setdefault(epoch, [])
        while len(drawn) <= position:
            if self._iter is None or self._iter_epoch != epoch:
                self._iter, self._iter_epoch = iter(self.sampler), epoch
            index = next(self._iter)  # StopIteration: the sampler's epoch is over
            if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.rows):
                raise ValueError(
                    f"{KEY}: {type(self.sampler).__name__} yielded {index!r}; it must yield "
                    f"dataset indices in [0, {len(self.rows)})"
                )
            if epoch == self.epoch and int(index) in self._skip:
                continue
            drawn.append(int(index))
        for old in [e for e in self._drawn if e < epoch - 1]:
            del self._drawn[old]
        return drawn[position]

    def row(self, key: RowKey) -> dict[str, Any]:
        return self.rows[self._draw(*key)]

    def next_row(self) -> tuple[RowKey, dict[str, Any]]:
        if self.requeued:
            key = self.requeued.pop(0)
            return key, self.row(key)
        for _ in range(2):  # the sampler may end its epoch early: then a new one starts
            if self.offset >= len(self) * self.batch_size:
                self.epoch, self.offset, self._skip = self.epoch + 1, 0, set()
            key = (self.epoch, self.offset)
            try:
                row = self.row(key)
            except StopIteration:
                self.offset = len(self) * self.batch_size
                continue
            self.offset += 1
            return key, row
        raise ValueError(f"{KEY}: {type(self.sampler).__name__} yielded no index in an epoch")

    def after_step(self, step: int, rollout: RolloutBatch, scores: torch.Tensor) -> None:
        """The user sampler's ``update(batch=...)`` with the step's ``StepBatch``."""
        update = getattr(self.sampler, "update", None)
        if callable(update):
            update(batch=self.step_batch(step, rollout, scores))

    def step_batch(self, step: int, rollout: RolloutBatch, scores: torch.Tensor) -> StepBatch:
        """The step's samples as a ``StepBatch`` (see its doc)."""
        width = rollout.prompts.shape[1]
        # verl's token_level_scores: the score on each sample's last response token
        token_scores = scores_to_token_rewards(scores, rollout.attention_mask[:, width:])
        rows = rollout.rows
        index = [row.get("index") for row in rows]
        objects = {
            "index": index,
            "dataset_index": [
                None if self._position is None else self._position.get(repr(i)) for i in index
            ],
            "uid": list(rollout.uid),
            "data_source": [row.get("data_source") for row in rows],
            "reward_model": [row.get("reward_model") for row in rows],
            "extra_info": [row.get("extra_info") for row in rows],
        }
        non_tensor = {}
        for key, values in objects.items():
            array = np.empty(len(values), dtype=object)
            array[:] = values
            non_tensor[key] = array
        tensors = {
            "responses": rollout.responses,
            "attention_mask": rollout.attention_mask,
            "response_mask": rollout.response_mask,
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores,
            "scores": scores.float(),
        }
        return StepBatch(tensors, non_tensor, {"global_steps": step})

    def state_dict(self, in_flight: list[RowKey] | None = None) -> dict[str, Any]:
        state = super().state_dict(in_flight)
        state["drawn"] = {str(e): list(d) for e, d in self._drawn.items()}
        own = getattr(self.sampler, "state_dict", None)
        if callable(own):
            value = own()
            try:  # the loop's state is JSON; a state with tensors (RNGs) travels pickled
                json.dumps(value)
                state["sampler_state"] = value
            except (TypeError, ValueError):
                state["sampler_state_pickle"] = base64.b64encode(pickle.dumps(value)).decode()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        drawn = {int(e): [int(i) for i in d] for e, d in (state.get("drawn") or {}).items()}
        # The epoch's rows drawn so far stay as they were (requeued keys point at them); the
        # rest of the epoch comes from iterating the sampler again, less those: a sampler
        # whose state holds where its iteration stands (torchdata's stateful samplers) goes
        # on exactly where it was; any other never repeats a row within the epoch.
        self._drawn = {self.epoch: drawn.get(self.epoch, [])[: self.offset]}
        self._skip = set(self._drawn[self.epoch])
        load = getattr(self.sampler, "load_state_dict", None)
        if "sampler_state_pickle" in state:
            state = {**state, "sampler_state": pickle.loads(base64.b64decode(state.pop(
                "sampler_state_pickle")))}  # fmt: skip
        if "sampler_state" in state and callable(load):
            load(state["sampler_state"])
            return
        logger.warning(
            "%s: %s has no state_dict/load_state_dict, so the resumed run draws the rest of "
            "epoch %d in a new order (leaving out the %d rows already drawn)",
            KEY,
            type(self.sampler).__name__,
            self.epoch,
            len(self._skip),
        )


def build_sampler(rows: list[dict[str, Any]], data: DataConfig) -> PromptSampler:
    """``data.sampler``'s class over the training rows, or the seeded shuffle without one."""
    if data.sampler.class_path is None:
        return PromptSampler(rows, data.train_batch_size, shuffle=data.shuffle, seed=data.seed)
    from omegaconf import OmegaConf

    assert data.sampler.class_name is not None
    cls = load_object(
        data.sampler.class_path,
        data.sampler.class_name,
        key=f"{KEY}.class_path",
        name_key=f"{KEY}.class_name",
    )
    where = f"{KEY} ({data.sampler.class_name} from {data.sampler.class_path})"
    try:
        sampler = cls(data_source=rows, data_config=OmegaConf.create(asdict(data)))
    except Exception as exc:
        raise ValueError(f"{where}: constructing it raised {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(sampler, "__iter__", None)):
        raise ValueError(
            f"{where} is not a sampler: it must iterate dataset indices (__iter__), as verl's "
            "AbstractSampler does"
        )
    return UserSampler(rows, data.train_batch_size, sampler)

"""A curriculum sampler written against verl's sampler API (``AbstractCurriculumSampler``;
verl is not installed), like the ``RandomCurriculumSampler`` of verl's curriculum example: a
seeded random order, and ``update(batch)`` after every step. For the e2e test it appends what
each call saw to the file named by ``AGENTLOOP_TEST_SAMPLER_LOG``."""

import json
import os

import torch


class RandomCurriculumSampler:
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.generator = torch.Generator().manual_seed(int(data_config.get("seed") or 1))
        self._log({"init": self.n, "train_batch_size": data_config.train_batch_size})

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())

    def __len__(self):
        return self.n

    def update(self, batch) -> None:
        self._log(
            {
                "update": len(batch),
                "step": batch.meta_info["global_steps"],
                "indices": sorted(int(i) for i in batch.non_tensor_batch["dataset_index"]),
                "scores": batch.batch["token_level_scores"].sum(-1).tolist(),
            }
        )

    @staticmethod
    def _log(entry: dict) -> None:
        path = os.environ.get("AGENTLOOP_TEST_SAMPLER_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")

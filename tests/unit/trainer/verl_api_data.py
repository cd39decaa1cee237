"""A dataset class and samplers written against verl's data API (verl is not installed):
a ``torch.utils.data.Dataset`` built as verl's ``create_rl_dataset`` builds one, whose items
carry verl's batching tensors, and curriculum samplers with verl's constructor and
``update(batch)``. Calls are logged on the classes for the tests to read."""

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset


class PrefixedDataset(Dataset):
    """Reads the parquet files and prepends a system message of its own (``config.system``
    would be a verl user's extra data key; here a constant) to each ``question`` column."""

    seen: dict = {}

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        type(self).seen = {
            "data_files": list(data_files),
            "max_samples": max_samples,
            "processor": processor,
            "max_prompt_length": config.get("max_prompt_length"),
            "prompt_key": config.prompt_key,
        }
        self.tokenizer = tokenizer
        self.rows = [r for f in data_files for r in pq.read_table(f).to_pylist()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        messages = [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": row["question"]},
        ]
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        return {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.ones(len(ids), dtype=torch.long),
            "raw_prompt": messages,
            "data_source": "arith",
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"index": i, "split": "train"},
            "index": i,
        }


class OldSignature(PrefixedDataset):
    """An older verl dataset: no ``max_samples``."""

    def __init__(self, data_files, tokenizer, config, processor=None):
        super().__init__(data_files, tokenizer, config, processor)


class NotADataset:
    def __init__(self, **kwargs):
        pass


class BadItems(PrefixedDataset):
    def __getitem__(self, i):
        return ["not", "a", "row"]


class HardestFirst:
    """A curriculum: each epoch, the rows with the lowest mean score so far come first (ties
    by index). Stateful as torchdata's samplers are: ``state_dict`` holds its scores and where
    the epoch's iteration stands, and iterating after ``load_state_dict`` goes on from there."""

    updates: list = []

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.scores: dict[int, list[float]] = {}
        self.order: list[int] = []
        self.pos = 0
        self.resume = False
        self.config = data_config

    def _mean(self, i):
        seen = self.scores.get(i)
        return sum(seen) / len(seen) if seen else 0.0

    def __iter__(self):
        if not self.resume:
            self.order = sorted(range(self.n), key=lambda i: (self._mean(i), i))
            self.pos = 0
        self.resume = False
        while self.pos < len(self.order):
            self.pos += 1
            yield self.order[self.pos - 1]

    def __len__(self):
        return self.n

    def update(self, batch):
        type(self).updates.append(batch)
        indices = batch.non_tensor_batch["dataset_index"]
        for i, s in zip(indices, batch.batch["scores"].tolist(), strict=True):
            self.scores.setdefault(int(i), []).append(s)

    def state_dict(self):
        scores = {str(k): v for k, v in self.scores.items()}
        return {"scores": scores, "order": self.order, "pos": self.pos}

    def load_state_dict(self, state):
        self.scores = {int(k): v for k, v in state["scores"].items()}
        self.order, self.pos, self.resume = list(state["order"]), state["pos"], True


class SeededShuffle:
    """A fresh torch-seeded order every epoch; its state (an RNG state tensor, where the
    epoch stands) is not JSON."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.gen = torch.Generator().manual_seed(7)
        self.order: list[int] = []
        self.pos = 0
        self.resume = False

    def __iter__(self):
        if not self.resume:
            self.order, self.pos = torch.randperm(self.n, generator=self.gen).tolist(), 0
        self.resume = False
        while self.pos < len(self.order):
            self.pos += 1
            yield self.order[self.pos - 1]

    def state_dict(self):
        return {"rng": self.gen.get_state(), "order": self.order, "pos": self.pos}

    def load_state_dict(self, state):
        self.gen.set_state(state["rng"])
        self.order, self.pos, self.resume = state["order"], state["pos"], True


class Reversed:
    """A stateless sampler: the rows in reverse order; no update, no state_dict."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


class OutOfRange(Reversed):
    def __iter__(self):
        return iter([self.n + 5])

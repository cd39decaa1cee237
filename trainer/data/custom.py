"""``data.custom_cls``: rows from a dataset class of the user's, constructed as verl constructs
one: ``cls(data_files=[...], tokenizer=tokenizer, processor=None, config=<the data config as
an OmegaConf DictConfig>, max_samples=-1)`` (``max_samples`` only where ``__init__`` takes
it, as older verl classes do not). ``len(dataset)`` items are read with ``dataset[i]``; each
must be a mapping. Tensors and numeric arrays an item carries for verl's own batching
(``input_ids``, ``attention_mask``, ``position_ids``, ...) are dropped: agent loops render the
prompt themselves from ``raw_prompt`` (or the ``data.prompt_key`` column). What is left is a
row in verl's layout and goes through the same checks as rows read from files.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from servers.user_code import load_object
from trainer.config.schema import DataConfig

__all__ = ["custom_rows"]

KEY = "data.custom_cls"


def custom_rows(files: Sequence[str], config: DataConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """Every item of the user's dataset over ``files``, as a plain row dict."""
    from omegaconf import OmegaConf

    assert config.custom_cls.path is not None and config.custom_cls.name is not None
    where = f"{KEY} ({config.custom_cls.name} from {config.custom_cls.path})"
    cls = load_object(
        config.custom_cls.path, config.custom_cls.name, key=f"{KEY}.path", name_key=f"{KEY}.name"
    )
    if not (inspect.isclass(cls) and hasattr(cls, "__getitem__") and hasattr(cls, "__len__")):
        raise ValueError(
            f"{where} is not a dataset class: it needs __len__ and __getitem__ (verl's "
            "custom datasets subclass torch.utils.data.Dataset)"
        )
    kwargs: dict[str, Any] = {
        "data_files": list(files),
        "tokenizer": tokenizer,
        "processor": None,
        "config": OmegaConf.create(asdict(config)),
    }
    if _takes(cls, "max_samples"):
        kwargs["max_samples"] = -1
    try:
        dataset = cls(**kwargs)
    except Exception as exc:
        raise ValueError(f"{where}: constructing it raised {type(exc).__name__}: {exc}") from exc
    rows = []
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, Mapping):
            raise ValueError(
                f"{where}: item {i} is a {type(item).__name__}, not a mapping of row fields"
            )
        rows.append({k: plain(v) for k, v in item.items() if not _tensor_like(v)})
    return rows


def _takes(cls: type, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _tensor_like(value: Any) -> bool:
    """A tensor, or a numeric numpy array (verl's batching fields)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, np.ndarray) and value.dtype != object


def plain(value: Any) -> Any:
    """Python objects all the way down (numpy object arrays and scalars become lists and
    numbers), as rows read from parquet are."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value

"""Validation metrics under verl's names, so a verl validation dashboard carries over.

Each validation prompt gets ``rollout.val_kwargs.n`` responses (one group, one ``uid``). For
every data source and every variable (``reward``: the sample's reward; and each numeric key
the reward function returned in its dict, e.g. ``acc``), per group of ``n``:

- ``mean@n``; for ``n > 1`` also ``std@n`` (population std) and, for ``k`` in 2, 4, 8, ...
  below ``n`` and ``n`` itself, bootstrap estimates over 1000 draws of ``k`` responses with
  replacement (seed 42): ``best@k/{mean,std}`` (the draw's max), ``worst@k/{mean,std}`` (its
  min) and, when every response of the data source carries a predicted answer (the reward's
  ``pred``), ``maj@k/{mean,std}``: the value of the draw's first response that gave the most
  common answer. Without ``pred`` no ``maj`` metric is logged (rather than a wrong one).

then the mean over groups, logged as ``val-core/<data_source>/<variable>/<metric>`` for the
core variable (``acc`` if the reward returns it, else ``reward``) and the ``mean``, ``best``
and ``maj`` metrics at the largest ``n``, and as ``val-aux/...`` for the rest; plus
``val-aux/num_turns/{min,max,mean}``. The draws are those of verl's bootstrap (the same seed
and generator), computed for all draws at once instead of one at a time.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_extremes", "bootstrap_majority", "group_metrics", "validation_metrics"]

N_BOOTSTRAP = 1000
SEED = 42


def _draws(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """[n_bootstrap, k] response indices drawn with replacement (verl's draws)."""
    return np.random.RandomState(seed).randint(0, n, size=(n_bootstrap, k))


def bootstrap_extremes(
    values: np.ndarray, k: int, *, n_bootstrap: int = N_BOOTSTRAP, seed: int = SEED
) -> tuple[float, float, float, float]:
    """``(best mean, best std, worst mean, worst std)`` over draws of ``k`` of ``values``."""
    drawn = values[_draws(len(values), k, n_bootstrap, seed)]  # [n_bootstrap, k]
    best, worst = drawn.max(axis=1), drawn.min(axis=1)
    return float(best.mean()), float(best.std()), float(worst.mean()), float(worst.std())


def bootstrap_majority(
    values: np.ndarray,
    votes: Sequence[Any],
    k: int,
    *,
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = SEED,
) -> tuple[float, float]:
    """``(mean, std)`` over draws of ``k`` of the value of the draw's majority answer: the
    answer (``votes``) given most often, ties going to the one drawn first, and the value of
    its first response in the draw."""
    codes: dict[Any, int] = {}
    answer = np.array(
        [codes.setdefault(v if isinstance(v, Hashable) else repr(v), len(codes)) for v in votes]
    )
    idx = _draws(len(values), k, n_bootstrap, seed)  # [n_bootstrap, k]
    drawn = answer[idx]
    hits = drawn[:, :, None] == np.arange(len(codes))  # [n_bootstrap, k, answers]
    counts = hits.sum(axis=1)  # [n_bootstrap, answers]
    first = np.where(hits.any(axis=1), hits.argmax(axis=1), k)  # first position drawn
    leading = counts == counts.max(axis=1, keepdims=True)
    position = np.where(leading, first, k).min(axis=1)  # [n_bootstrap]
    picked = values[idx[np.arange(n_bootstrap), position]]
    return float(picked.mean()), float(picked.std())


def _sizes(n: int) -> list[int]:
    """2, 4, 8, ... below ``n``, then ``n``."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


def group_metrics(
    values: Sequence[float], votes: Sequence[Any] | None = None, *, seed: int = SEED
) -> dict[str, float]:
    """The metrics of one prompt's ``n`` responses (names without the section prefix)."""
    arr = np.asarray(values, dtype=np.float64)
    n = len(arr)
    out = {f"mean@{n}": float(arr.mean())}
    if n == 1:
        return out
    out[f"std@{n}"] = float(arr.std())
    for k in _sizes(n):
        best, best_std, worst, worst_std = bootstrap_extremes(arr, k, seed=seed)
        out |= {f"best@{k}/mean": best, f"best@{k}/std": best_std}
        out |= {f"worst@{k}/mean": worst, f"worst@{k}/std": worst_std}
        if votes is not None:
            maj, maj_std = bootstrap_majority(arr, votes, k, seed=seed)
            out |= {f"maj@{k}/mean": maj, f"maj@{k}/std": maj_std}
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.bool_))


def _section(variable: str, core: str, name: str, n_max: int) -> str:
    at = int(name.split("@")[1].split("/")[0])
    leading = name.startswith(("mean@", "best@", "maj@"))
    return "val-core" if variable == core and leading and at == n_max else "val-aux"


def validation_metrics(
    data_sources: Sequence[str],
    uids: Sequence[str],
    scores: Sequence[float],
    extra_info: dict[str, list[Any]] | None = None,
    num_turns: Sequence[int] | None = None,
    *,
    seed: int = SEED,
) -> dict[str, float]:
    """verl's ``val-core``/``val-aux`` metrics of one validation batch (module docstring):
    per sample its data source, group ``uid`` and reward; ``extra_info``: the reward's other
    keys per sample (``RewardOutput.extra_info``)."""
    extra_info = extra_info or {}
    variables: dict[str, list[Any]] = {"reward": list(scores)}
    for key, column in extra_info.items():
        if key != "pred" and key != "reward" and all(_is_number(v) for v in column):
            variables[key] = [float(v) for v in column]
    preds = extra_info.get("pred")
    groups: dict[str, dict[str, list[int]]] = {}  # source -> uid -> sample indices
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        groups.setdefault(source, {}).setdefault(uid, []).append(i)
    out: dict[str, float] = {}
    for source, by_uid in groups.items():
        members = [i for idx in by_uid.values() for i in idx]
        has_pred = preds is not None and all(preds[i] is not None for i in members)
        core = "acc" if "acc" in variables else "reward"
        for variable, column in variables.items():
            per_name: dict[str, list[float]] = {}
            for idx in by_uid.values():
                votes = [preds[i] for i in idx] if has_pred and preds is not None else None
                metrics = group_metrics([column[i] for i in idx], votes, seed=seed)
                for name, value in metrics.items():
                    per_name.setdefault(name, []).append(value)
            n_max = max(int(name.split("@")[1].split("/")[0]) for name in per_name)
            for name, values in per_name.items():
                section = _section(variable, core, name, n_max)
                out[f"{section}/{source}/{variable}/{name}"] = float(np.mean(values))
    if num_turns:
        turns = np.asarray(num_turns, dtype=np.float64)
        out["val-aux/num_turns/min"] = float(turns.min())
        out["val-aux/num_turns/max"] = float(turns.max())
        out["val-aux/num_turns/mean"] = float(turns.mean())
    return out

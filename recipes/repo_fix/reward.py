"""The repo_fix rows' rule reward for ``custom_reward_function.path``.

A repo_fix sample's reward is its workspace check (the package's pytest run, ``partial``: the
fraction of tests passing), which the worker's workspace hook sets as the sample's
``reward_score``; the reward manager keeps that preset score as the ``rule`` reward. The
start-up check still wants a scorer for the ``repo_fix`` data source, and the manager calls it
beside the preset, so this one names the rows' reward and scores 0: what a repo_fix row that
did not run in a workspace (no check, no score) earns.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compute_score"]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float:
    """0.0: the check's preset score replaces it for every sample that ran in a workspace."""
    return 0.0

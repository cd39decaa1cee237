"""verl's ``reward_extra_info``: the keys of a reward function's dict results, per sample, on
the ``RewardOutput`` (validation votes on ``pred``), kept in order by ``RewardOutput.cat``."""

from __future__ import annotations

import torch

from tests.unit.trainer.rewards.batch import make_batch
from trainer.config.reward import RewardFunctionConfig, RewardModelConfig
from trainer.rewards import RewardManager
from trainer.rewards.manager import RewardOutput

SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    answer = solution_str.strip().split()[-1]
    if answer == "none":
        return 0.0
    return {"score": float(answer == ground_truth), "acc": answer == ground_truth, "pred": answer}
"""


def test_dict_keys_other_than_score_are_kept_per_sample(tmp_path, tokenizer):
    path = tmp_path / "reward.py"
    path.write_text(SOURCE)
    manager = RewardManager(RewardFunctionConfig(path=str(path)), RewardModelConfig(), tokenizer)
    try:
        out = manager.score(make_batch(tokenizer, ["it is 42", "so 41", "none"]))
    finally:
        manager.close()
    assert out.scores.tolist() == [1.0, 0.0, 0.0]
    assert out.extra_info == {"acc": [True, False, None], "pred": ["42", "41", None]}


def test_cat_keeps_each_samples_info_and_fills_what_a_part_lacks():
    def part(n: int, info: dict) -> RewardOutput:
        return RewardOutput(torch.zeros(n), None, {}, {}, info)

    out = RewardOutput.cat([part(2, {"pred": ["a", "b"]}), part(1, {}), part(1, {"pred": ["c"]})])
    assert out.extra_info == {"pred": ["a", "b", None, "c"]}

"""``custom_reward_function`` and ``reward_model``: what scores a trajectory.

Three kinds of reward, each a named component of a weighted sum:

- ``rule``: ``custom_reward_function`` (the verl signature; built-in scorers by data_source),
  plus any extra named rule functions under ``reward_model.rules``;
- ``judge``: a judge model on its own group of AsyncServers (``reward_model.judge``);
- ``verify``: a hook that may call the registered tools (``reward_model.verify``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DAPO_REFUSED",
    "DEFAULT_JUDGE_TEMPLATE",
    "ENABLE_REFUSED",
    "JUDGE_FIELDS",
    "JudgeConfig",
    "RewardFunctionConfig",
    "RewardModelConfig",
    "RuleRewardConfig",
    "VerifyConfig",
]

JUDGE_FIELDS = ("question", "response", "ground_truth", "data_source")

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading an assistant's answer.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{ground_truth}\n\n"
    "Assistant's answer:\n{response}\n\n"
    "Is the assistant's final answer correct and consistent with the reference? "
    "Reply with a score between 0 and 1 in the form <score>x</score>."
)


ENABLE_REFUSED = (
    "reward_model.enable=True asks for verl's model-based reward model, which is not "
    "supported here: a model that scores responses here is the judge; set "
    "reward_model.enable=False and reward_model.judge.enable=True with "
    "reward_model.judge.model_path=<model>"
)
DAPO_REFUSED = (
    "reward_model.reward_manager=dapo (verl's DAPO manager: its overlong-response penalty) is "
    "not supported here: set reward_model.reward_manager=naive (the same per-sample calls, "
    "without the penalty)"
)


@dataclass(kw_only=True, slots=True)
class RewardFunctionConfig:
    path: str | None = None
    """Python file defining the reward function (None: the built-in scorers by data_source)."""
    name: str = "compute_score"
    """Called by keyword, as verl calls it: ``compute_score(data_source=, solution_str=,
    ground_truth=, extra_info=, **reward_kwargs) -> float | dict``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords of every call (verl's ``custom_reward_function.reward_kwargs``); the
    built-in scorers take ``method`` (``strict`` | ``flexible``, gsm8k), ``format_score`` and
    ``score``."""
    timeout_s: float = 30.0
    num_workers: int = 4
    """Calls scoring samples in parallel."""
    executor: Literal["thread", "process"] = "thread"
    """``process`` for CPU-bound scorers (math verification): a pool of processes that each
    import the function; a call that times out gets its process replaced."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("custom_reward_function.timeout_s must be > 0")
        if self.num_workers < 1:
            raise ValueError("custom_reward_function.num_workers must be >= 1")


@dataclass(kw_only=True, slots=True)
class RuleRewardConfig:
    """An extra named rule reward (``reward_model.rules[i]``), logged as ``reward/<name>``."""

    name: str
    path: str
    function: str = "compute_score"
    timeout_s: float = 30.0
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords of every call of ``function``."""


@dataclass(kw_only=True, slots=True)
class JudgeConfig:
    enable: bool = False
    model_path: str | None = None
    """The judge model (a folder or an agentloop-models asset name)."""
    num_servers: int = 1
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.4
    max_model_len: int = 4096
    node_resource: str | None = None
    """A custom Ray resource of the nodes that run the judge's servers (docs/cluster.md);
    None: any node."""
    prompt_template: str = DEFAULT_JUDGE_TEMPLATE
    """Filled with {question}, {response}, {ground_truth}, {data_source}; sent as one user
    message through the judge's chat template."""
    prompt_template_path: str | None = None
    """A text file holding the template (overrides ``prompt_template``)."""
    chat_template_kwargs: dict[str, bool | str | int] = field(
        default_factory=lambda: {"enable_thinking": False}
    )
    """The judge's chat template variables."""
    temperature: float = 0.0
    max_tokens: int = 128
    score_pattern: str = r"<score>\s*([-+]?\d+(?:\.\d+)?)\s*</score>"
    """Regex whose first group is the score (the last match counts)."""
    min_score: float = 0.0
    max_score: float = 1.0
    """Parsed scores are clamped to [min_score, max_score]."""
    fallback_score: float = 0.0
    """Score when the judge's output has no parseable score (counted:
    ``reward/judge/parse_failures``)."""
    max_concurrency: int = 32
    """Judge requests in flight at once."""
    max_retries: int = 2
    """Attempts after the whole judge group failed (servers marked dead are tried again)."""
    retry_backoff_s: float = 2.0

    def template(self) -> str:
        if self.prompt_template_path is None:
            return self.prompt_template
        from pathlib import Path

        path = Path(self.prompt_template_path).expanduser()
        if not path.is_file():
            raise ValueError(
                f"reward_model.judge.prompt_template_path={self.prompt_template_path!r} does "
                "not exist: point it at a text file"
            )
        return path.read_text()

    def check(self) -> None:
        from servers.placement import check_resource_name

        if not self.model_path:
            raise ValueError(
                "reward_model.judge.enable=True needs reward_model.judge.model_path=<model>"
            )
        check_resource_name(self.node_resource, "reward_model.judge.node_resource")
        if self.num_servers < 1 or self.max_concurrency < 1 or self.max_retries < 0:
            raise ValueError(
                "reward_model.judge.num_servers and max_concurrency must be >= 1, max_retries >= 0"
            )
        if self.min_score > self.max_score:
            raise ValueError("reward_model.judge.min_score must be <= max_score")
        fields = {f for _, f, _, _ in string.Formatter().parse(self.template()) if f is not None}
        unknown = sorted(fields - set(JUDGE_FIELDS))
        if unknown:
            raise ValueError(
                f"reward_model.judge.prompt_template uses {{{unknown[0]}}}; the fields are "
                + ", ".join(f"{{{f}}}" for f in JUDGE_FIELDS)
            )
        if "response" not in fields:
            raise ValueError(
                "reward_model.judge.prompt_template never shows the answer: add {response}"
            )
        import re

        try:
            groups = re.compile(self.score_pattern).groups
        except re.error as exc:
            raise ValueError(f"reward_model.judge.score_pattern is not a regex: {exc}") from None
        if groups < 1:
            raise ValueError(
                "reward_model.judge.score_pattern needs a group around the number, "
                r"e.g. <score>(\d+)</score>"
            )


@dataclass(kw_only=True, slots=True)
class VerifyConfig:
    path: str | None = None
    """Python file with ``async def verify(sample, tools) -> float | dict`` (or a plain def)."""
    name: str = "verify"
    timeout_s: float = 60.0
    max_concurrency: int = 8


@dataclass(kw_only=True, slots=True)
class RewardModelConfig:
    enable: bool = False
    """verl's model-based reward model: only False is accepted (True is refused, naming the
    judge, which is how a model scores responses here)."""
    reward_manager: Literal["naive", "batch", "prime", "dapo"] = "naive"
    """How ``custom_reward_function`` is called (verl's names): ``naive``, once per sample;
    ``batch``, once per batch with lists (``data_sources``, ``solution_strs``,
    ``ground_truths``, ``extra_infos``) returning a list of scores; ``prime``, per sample in a
    process pool (``custom_reward_function.executor=process``, with a warning); ``dapo`` is
    refused (no overlong penalty here). ``reward_model.rules`` are always called per sample."""
    weights: dict[str, float] = field(
        default_factory=lambda: {"rule": 1.0, "judge": 1.0, "verify": 1.0}
    )
    """Weight of each named reward that is on, in the sum; 0 turns one off. A reward not
    named here (an extra rule) weighs 1.0."""
    rules: list[RuleRewardConfig] = field(default_factory=list)
    """Extra rule rewards, each logged as ``reward/<name>``:
    ``[{name, path, function, timeout_s, reward_kwargs}]``."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A judge model on its own group of AsyncServers."""
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """A hook that may call the registered tools."""
    process_reward_coef: float = 0.0
    """> 0: each tool call's own reward x coef is added at the last token of the model turn
    that made the call (per-turn process rewards); 0: tool rewards only reach the outcome
    reward through ``extra_info``."""

    def components(self) -> list[str]:
        """Names of the rewards that are on, in scoring order."""
        names = ["rule", *(r.name for r in self.rules)]
        if self.judge.enable:
            names.append("judge")
        if self.verify.path:
            names.append("verify")
        return [n for n in names if self.weights.get(n, 1.0) != 0.0]

    def check(self) -> None:
        if self.enable:
            raise ValueError(ENABLE_REFUSED)
        if self.reward_manager == "dapo":
            raise ValueError(DAPO_REFUSED)
        seen = {"rule", "judge", "verify"}
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(
                    f"reward_model.rules has a second reward named {rule.name!r}: names must be "
                    "unique and not rule, judge or verify"
                )
            seen.add(rule.name)
        known = {"rule", "judge", "verify", *(r.name for r in self.rules)}
        unknown = sorted(set(self.weights) - known)
        if unknown:
            raise ValueError(
                f"reward_model.weights.{unknown[0]} names no reward; known: "
                f"{', '.join(sorted(known))} (add extra rule rewards under reward_model.rules)"
            )
        if not self.components():
            raise ValueError("reward_model.weights turns every reward off: keep one non-zero")
        if self.judge.enable:
            self.judge.check()

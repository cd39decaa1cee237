"""``agentloop-studio``: a local web console to build a tool environment: tools loaded from
any config the trainer takes and called by hand, a reward file tried on a pasted answer.
Pages are rendered on the server (no JavaScript build); every action is also a JSON API."""

from trainer.studio.app import create_app
from trainer.studio.reward import RewardBench
from trainer.studio.tools import ToolBench

__all__ = ["RewardBench", "ToolBench", "create_app"]

"""Simulated users (verl's interactions): an interaction answers each model turn that calls
no tool, may end the episode, and scores turns (docs/interactions.md)."""

from agentloop.interactions.base import Interaction, InteractionError, UserReply, check_reply
from agentloop.interactions.config import load_interactions, row_interaction
from agentloop.interactions.session import InteractionSession
from agentloop.interactions.simulated_user import SimulatedUser, UserModel

__all__ = [
    "Interaction",
    "InteractionError",
    "InteractionSession",
    "SimulatedUser",
    "UserModel",
    "UserReply",
    "check_reply",
    "load_interactions",
    "row_interaction",
]

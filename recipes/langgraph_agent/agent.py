"""``math_expression``: the ReAct LangGraph loop with the ``custom_op`` tool (registered by
``agent.yaml``)."""

from __future__ import annotations

from agentloop.langgraph import ReactAgentLoop
from recipes.langgraph_agent.tools import custom_op

__all__ = ["MathExpressionAgentLoop"]


class MathExpressionAgentLoop(ReactAgentLoop):
    def langchain_tools(self):
        return [custom_op]

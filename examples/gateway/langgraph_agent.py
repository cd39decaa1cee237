"""LangGraph's prebuilt ReAct agent over ``langchain-openai``'s ``ChatOpenAI`` pointed at the
session's endpoint: the graph, its ``ToolNode`` and the LangChain tools are used as written
for any OpenAI server."""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10

from examples.gateway.calc_tools import calculator, multiply, prompt_of, score

__all__ = ["agent"]

TOOLS = [tool(calculator), tool(multiply)]


async def agent(row: dict[str, Any], llm: Any, max_turns: int = 4) -> float:
    """A model call and a tool node per turn; a graph still looping after ``max_turns`` model
    calls scores 0."""
    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
    with warnings.catch_warnings():  # its successor, langchain.agents.create_agent, is not a
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)  # dependency here
        graph = create_react_agent(model, TOOLS)
    try:
        state = await graph.ainvoke(
            {"messages": prompt_of(row)}, config={"recursion_limit": 2 * max_turns}
        )
    except GraphRecursionError:
        return 0.0
    return score(row, str(state["messages"][-1].text))

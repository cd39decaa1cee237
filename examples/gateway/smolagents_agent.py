"""A smolagents ``ToolCallingAgent`` over its ``OpenAIModel`` (``OpenAIServerModel`` is the
same class) on the session's endpoint. smolagents is synchronous, so the run goes to a
thread: the gateway serves it from this event loop meanwhile.

smolagents writes its history itself (a tool call comes back as assistant text "Calling
tools: ...", its result as a user "Observation: ..." message), so each of its calls extends
no earlier one and the gateway makes each call its own segment."""

from __future__ import annotations

import asyncio
import importlib.resources
from typing import Any

import yaml
from smolagents import OpenAIModel, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

from examples.gateway.calc_tools import calculator, multiply, score, task_of

__all__ = ["agent"]

TOOLS = [tool(calculator), tool(multiply)]


def _templates(system_prompt: str | None) -> dict[str, Any]:
    """smolagents' own prompt templates, the system prompt replaced when one is given (its
    default is ~950 tokens of examples: too long for a small model's context)."""
    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml")
    templates = yaml.safe_load(text.read_text())
    if system_prompt is not None:
        templates["system_prompt"] = system_prompt
    return templates


def _run(row: dict[str, Any], llm: Any, max_steps: int, system_prompt: str | None) -> Any:
    model = OpenAIModel(
        model_id=llm.model,
        api_base=llm.base_url,
        api_key=llm.api_key,
        client_kwargs={"max_retries": 0},
    )
    system, task = task_of(row)
    smol = ToolCallingAgent(
        tools=TOOLS,
        model=model,
        prompt_templates=_templates(system_prompt),
        max_steps=max_steps,
        instructions=system or None,
        verbosity_level=LogLevel.OFF,
    )
    return smol.run(task)


async def agent(
    row: dict[str, Any], llm: Any, max_steps: int = 4, system_prompt: str | None = None
) -> float:
    """The answer is what the model passed to smolagents' ``final_answer`` tool (the bare
    number, or a ``#### N`` line). ``system_prompt``: a Jinja template replacing smolagents'
    (it may use ``tools`` and ``custom_instructions``, the row's system message)."""
    answer = str(await asyncio.to_thread(_run, row, llm, max_steps, system_prompt))
    return score(row, answer if "####" in answer else f"#### {answer.strip()}")

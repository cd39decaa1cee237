"""Test doubles written against verl's tool API (verl is not installed): an older-verl tool
(JSON-string parameters, plain-text results, ``create`` returns the id) and a newer-verl one
(dict parameters, ``ToolResponse``-like results, ``create`` returns ``(id, response)`` and
reads ``create_kwargs=``). Every call is logged on the class for the tests to read.

No ``from __future__ import annotations`` here: ``parameters: str`` stays the ``str`` class.
"""

import asyncio
import json
import uuid
from typing import Any

import pydantic

ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class Function(pydantic.BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class ToolSchema(pydantic.BaseModel):
    """A minimal pydantic schema like verl's ``OpenAIFunctionToolSchema``."""

    type: str
    function: Function


class Response:
    """Like verl's ``ToolResponse``: text and optional images/videos."""

    def __init__(self, text=None, image=None, video=None):
        self.text, self.image, self.video = text, image, video


class OldVerlTool:
    """Older verl: ``create`` returns the id, ``parameters`` is a JSON string, ``execute``
    returns ``(str, reward, metrics)``; ``{"a": 0}`` raises, ``{"a": -1}`` hangs."""

    log: list[tuple[str, Any]] = []

    def __init__(self, config: dict, tool_schema):
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name
        self.state: dict[str, dict] = {}

    def get_openai_tool_schema(self):
        return self.tool_schema

    async def create(self, instance_id=None, offset=0, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self.state[instance_id] = {"offset": offset, "total": 0}
        self.log.append(("create", (instance_id, offset, kwargs)))
        return instance_id

    async def execute(self, instance_id: str, parameters: str, **kwargs):
        self.log.append(("execute", parameters))
        args = json.loads(parameters)
        if args["a"] == 0:
            raise ValueError("a must not be 0")
        if args["a"] == -1:
            await asyncio.sleep(10)
        total = args["a"] + args["b"] + self.state[instance_id]["offset"]
        self.state[instance_id]["total"] = total
        return str(total), 0.25, {"adds": 1}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        self.log.append(("calc_reward", instance_id))
        return float(self.state[instance_id]["total"])

    async def release(self, instance_id: str, **kwargs) -> None:
        self.log.append(("release", instance_id))
        del self.state[instance_id]


class NewVerlTool:
    """Newer verl: no schema in the YAML (``get_openai_tool_schema`` supplies it), ``create``
    reads ``create_kwargs=`` and returns ``(id, Response)``, ``parameters`` is a dict,
    ``execute`` returns ``(Response, reward, metrics)``."""

    log: list[tuple[str, Any]] = []

    def __init__(self, config: dict, tool_schema):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self):
        return ToolSchema.model_validate(ADD_SCHEMA)

    async def create(self, instance_id=None, **kwargs):
        self.log.append(("create", kwargs))
        return instance_id or str(uuid.uuid4()), Response()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        self.log.append(("execute", parameters))
        text = str(parameters["a"] + parameters["b"])
        return Response(text=text, image=["<img>"]), 1.0, {"adds": 1}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.5

    async def release(self, instance_id: str, **kwargs) -> None:
        self.log.append(("release", instance_id))


class NoReleaseTool:
    """verl-like but incomplete: no ``calc_reward``/``release``."""

    def __init__(self, config: dict, tool_schema):
        self.tool_schema = tool_schema

    def get_openai_tool_schema(self):
        return self.tool_schema

    async def create(self, instance_id=None, **kwargs):
        return instance_id

    async def execute(self, instance_id, parameters, **kwargs):
        return "", 0.0, {}


class SessionVerlTool(NewVerlTool):
    """Reads what verl's agent loop passes ``execute``: ``agent_data`` (keeps a counter in its
    ``extra_fields`` across the sample's calls, reads the chat so far) and the row's
    ``execute_kwargs`` (here ``offset``)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], *, agent_data, offset=0):
        calls = agent_data.extra_fields.get("calls", 0) + 1
        agent_data.extra_fields["calls"] = calls
        self.log.append(("execute", agent_data.request_id, len(agent_data.messages), calls, offset))
        total = parameters["a"] + parameters["b"] + offset
        return Response(text=str(total)), float(calls), {}

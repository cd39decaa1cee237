"""qwen-agent tools behind our interface: a built-in by name (storage, on disk), a user
subclass by class path and by registered name (old list-style parameters converted), in the
verl YAML layout, and clear errors for unknown names."""

from __future__ import annotations

import pytest
import yaml

from agentloop.tools import QwenAgentTool, load_tool_config, qwen_agent_tool
from tests.integration.agentloop.qwen_tools_for_tests import ReverseText

pytestmark = pytest.mark.integration


async def test_builtin_storage_tool_by_name_round_trips(tmp_path):
    tool = qwen_agent_tool("storage", {"storage_root_path": str(tmp_path)})
    assert isinstance(tool, QwenAgentTool) and tool.name == "storage"
    assert tool.tool_schema["function"]["parameters"]["required"] == ["operate"]
    await tool.execute("i", {"operate": "put", "key": "/a/b", "value": "42"})
    assert (await tool.execute("i", {"operate": "get", "key": "/a/b"})).text == "42"
    assert (tmp_path / "a" / "b").read_text() == "42"


async def test_user_subclass_with_list_parameters_gets_a_json_schema():
    tool = qwen_agent_tool(ReverseText)
    assert tool.tool_schema == {
        "type": "function",
        "function": {
            "name": "reverse_text",
            "description": "Reverse a text.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "Text to reverse."}},
                "required": ["text"],
            },
        },
    }
    assert (await tool.execute("i", {"text": "abc"})).text == "cba"


def test_verl_yaml_qwen_agent_entries_by_name_and_class(tmp_path):
    path = tmp_path / "tools.yaml"
    entries = [
        {
            "class_name": "qwen_agent",
            "config": {
                "type": "qwen_agent",
                "name": "storage",
                "cfg": {"storage_root_path": str(tmp_path)},
            },
        },
        {
            "class_name": "tests.integration.agentloop.qwen_tools_for_tests.ReverseText",
            "config": {"type": "qwen_agent"},
        },
    ]
    path.write_text(yaml.safe_dump({"tools": entries}))
    assert sorted(load_tool_config(path)) == ["reverse_text", "storage"]


def test_unknown_qwen_agent_tool_lists_the_registered_ones():
    with pytest.raises(ValueError) as info:
        qwen_agent_tool("no_such_tool")
    assert str(info.value).startswith("qwen-agent has no tool named 'no_such_tool'; registered: ")
    assert "storage" in str(info.value)


def test_non_qwen_class_is_rejected():
    with pytest.raises(ValueError, match="is not a qwen_agent.tools.base.BaseTool subclass"):
        qwen_agent_tool(dict)

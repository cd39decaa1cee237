"""Tool config YAML (verl layout): every malformed file or entry fails at load time with a
message that names the file, the entry and what to change."""

from __future__ import annotations

import pytest
import yaml

from agentloop.tools import load_tool_config

CALC = "agentloop.tools.calculator.CalculatorTool"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"tool": []}, "{path}: expected a top-level 'tools:' list"),
        ({"tools": [{"config": {"type": "native"}}]}, "{path}: tools[0] needs class_name"),
        ({"tools": ["calculator"]}, "{path}: tools[0] needs class_name"),
        (
            {"tools": [{"class_name": "CalculatorTool"}]},
            "{path}: tools[0].class_name='CalculatorTool': names no object; write "
            "path/to/file.py:name, package.module:name or package.module.name",
        ),
        (
            {"tools": [{"class_name": "nowhere_pkg.tools.Tool"}]},
            "{path}: tools[0].class_name='nowhere_pkg.tools.Tool': cannot import module "
            "'nowhere_pkg.tools' (ModuleNotFoundError: No module named 'nowhere_pkg'); install "
            "the package that provides 'nowhere_pkg', put its folder on PYTHONPATH, or correct "
            "the name",
        ),
        (
            {"tools": [{"class_name": "collections.OrderedDict"}]},
            "{path}: tools[0]: collections.OrderedDict is not a BaseTool subclass and does not "
            "follow verl's tool API (missing: __init__(config, tool_schema), create, execute, "
            "calc_reward, release, get_openai_tool_schema); subclass agentloop.tools.BaseTool, "
            "or write it against verl's API: __init__(config, tool_schema), async "
            "create/execute/calc_reward/release and get_openai_tool_schema",
        ),
        (
            {"tools": [{"class_name": CALC, "config": {"type": "grpc"}}]},
            "{path}: tools[0]: config.type 'grpc' is not supported; use native, mcp, qwen_agent or "
            "workspace",
        ),
        (
            {"tools": [{"class_name": CALC}, {"class_name": CALC}]},
            "{path}: tools[1]: a tool named 'calculator' is already configured",
        ),
        (
            {"tools": [{"class_name": "x.Mcp", "config": {"type": "mcp"}}]},
            "{path}: tools[0]: an mcp entry needs mcp.mcp_servers_config_path",
        ),
        (
            {"tools": [{"class_name": CALC, "tool_schema": {"function": {"description": "x"}}}]},
            "tool schema needs function.name, got {{'function': {{'description': 'x'}}}}",
        ),
    ],
    ids=[
        "no_tools_list",
        "no_class_name",
        "entry_not_a_mapping",
        "not_dotted",
        "import_fails",
        "not_a_tool",
        "unknown_type",
        "duplicate_name",
        "mcp_without_servers",
        "schema_without_name",
    ],
)
def test_bad_tool_config_names_the_entry(tmp_path, content, message):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ValueError) as info:
        load_tool_config(path)
    assert str(info.value) == message.format(path=path)


def test_missing_tool_config_file_names_the_setting(tmp_path):
    with pytest.raises(ValueError) as info:
        load_tool_config(tmp_path / "nope.yaml")
    assert str(info.value) == (
        f"multi_turn.tool_config_path {str(tmp_path / 'nope.yaml')!r} does not exist"
    )

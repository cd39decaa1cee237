"""The format registry, the one registry of formats and parsers: the docs table is the
registry's, each family's test template is detected as its own format and as no other,
lookups of unknown names say what exists, parsers are built from their format, and a parser
registered alone gets a plain format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agentloop.formats.base as registry
from agentloop.formats import (
    detect_format,
    get_format,
    register_parser,
    registered_formats,
)
from agentloop.formats.hermes import HERMES, HermesToolParser
from agentloop.formats.table import markdown_table
from agentloop.parsers import ParsedTurn
from tests.chat_families import TEMPLATES

DOCS = Path(__file__).resolve().parents[4] / "docs" / "chat-formats.md"
# test template -> the format it must be detected as
EXPECTED = {
    "qwen25": "hermes",
    "llama3": "llama3_json",
    "mistral": "mistral",
    "mistral_v7": "mistral_v7",
    "mistral_v13": "mistral_v7",
    "gpt_oss": "gpt-oss",
    "glm45": "glm45",
    "glm47": "glm47",
}


def test_the_docs_table_is_the_registry_s():
    text = DOCS.read_text()
    block = re.search(r"<!-- formats:start -->\n(.*?)\n<!-- formats:end -->", text, re.DOTALL)
    assert block is not None
    assert block.group(1) == markdown_table()


def test_every_family_has_a_test_template():
    assert sorted(p.stem for p in TEMPLATES.glob("*.jinja")) == sorted(EXPECTED)


@pytest.mark.parametrize("template", sorted(EXPECTED))
def test_each_test_template_is_detected_as_its_own_family(template):
    assert detect_format((TEMPLATES / f"{template}.jinja").read_text()) == EXPECTED[template]


def test_the_real_qwen3_and_smollm2_templates_are_hermes(tiny_qwen3_path, smollm2_path):
    from transformers import AutoTokenizer

    for path in (tiny_qwen3_path, smollm2_path):
        assert detect_format(AutoTokenizer.from_pretrained(path).chat_template) == "hermes"


def test_a_template_without_tool_markup_matches_no_family():
    assert detect_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_format(None) is None


def test_aliases_name_the_same_format():
    for alias, name in [
        ("qwen", "hermes"),
        ("llama3", "llama3_json"),
        ("harmony", "gpt-oss"),
        ("openai", "gpt-oss"),
        ("glm4.5", "glm45"),
        ("glm46", "glm45"),
        ("glm4.7", "glm47"),
    ]:
        assert get_format(alias) is get_format(name)
        assert alias in registered_formats()


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError) as info:
        get_format("gptoss")
    assert str(info.value) == (
        f"unknown multi_turn.format 'gptoss'; registered: {', '.join(registered_formats())} "
        "(register your own with agentloop.register_format or agentloop.register_parser)"
    )


def test_a_variant_is_picked_by_its_template_also_when_the_base_is_named():
    from agentloop.formats import variant_for

    for template, base, variant in [
        ("mistral_v7", "mistral", "mistral_v7"),
        ("mistral_v13", "mistral", "mistral_v7"),
        ("glm47", "glm45", "glm47"),
        ("glm47", "glm4.5", "glm47"),
    ]:
        text = (TEMPLATES / f"{template}.jinja").read_text()
        assert variant_for(base, text).name == variant
        assert variant_for(variant, None).name == variant
    for template, base in [("mistral", "mistral"), ("glm45", "glm45")]:
        text = (TEMPLATES / f"{template}.jinja").read_text()
        assert variant_for(base, text).name == base
    assert variant_for("mistral_v7", (TEMPLATES / "mistral.jinja").read_text()).name == (
        "mistral_v7"
    )  # a variant set explicitly is kept


# ---- parsers from the registry ----------------------------------------------------------------
def test_new_parser_returns_a_fresh_hermes_parser():
    parser = get_format("hermes").new_parser()
    assert isinstance(parser, HermesToolParser)
    assert parser is not get_format("hermes").new_parser()
    assert isinstance(get_format("qwen").new_parser(repair=False), HermesToolParser)


def test_an_unknown_name_lists_exactly_the_registered_ones(monkeypatch):
    monkeypatch.setattr(registry, "_FORMATS", {"hermes": HERMES, "aaa": HERMES})
    with pytest.raises(ValueError) as info:
        get_format("nope")
    assert str(info.value) == (
        "unknown multi_turn.format 'nope'; registered: aaa, hermes "
        "(register your own with agentloop.register_format or agentloop.register_parser)"
    )


def test_the_unknown_name_error_names_hermes_among_the_builtin_formats():
    with pytest.raises(
        ValueError, match=r"^unknown multi_turn\.format 'nope'; registered: .*\bhermes\b"
    ):
        get_format("nope")


def test_register_parser_makes_a_custom_parser_available_in_a_plain_format(monkeypatch):
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))

    @register_parser("shout")
    class ShoutParser:
        def parse(self, text: str) -> ParsedTurn:
            return ParsedTurn(content=text.upper())

    assert ShoutParser.__name__ == "ShoutParser"  # the decorator returns the class itself
    parser = get_format("shout").new_parser()
    assert isinstance(parser, ShoutParser)
    assert parser.parse("hi").content == "HI"
    assert isinstance(get_format("hermes").new_parser(), HermesToolParser)
    assert "shout" in registered_formats()
    assert get_format("shout").end_tokens == ()  # turns end with the tokenizer's eos


def test_a_parser_registered_under_a_format_s_name_keeps_the_family_s_end_tokens(monkeypatch):
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))

    @register_parser("hermes")
    class MyHermes(HermesToolParser):
        pass

    fmt = get_format("hermes")
    assert isinstance(fmt.new_parser(), MyHermes)
    assert (fmt.end_tokens, fmt.template_markers) == (HERMES.end_tokens, HERMES.template_markers)
    assert get_format("qwen") is HERMES  # the alias keeps the built-in parser
    assert [f.parser for f in registry.all_formats() if f.name == "hermes"] == [MyHermes]


def test_a_user_parser_without_a_repair_switch_is_used_as_is_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))
    monkeypatch.setattr(registry, "_NO_REPAIR_WARNED", set())

    @register_parser("plain")
    class PlainParser:
        def parse(self, text: str) -> ParsedTurn:
            return ParsedTurn(content=text)

    with caplog.at_level("WARNING", logger="agentloop.formats.base"):
        assert isinstance(get_format("plain").new_parser(repair=False), PlainParser)
        assert isinstance(get_format("plain").new_parser(repair=False), PlainParser)
    assert [r.getMessage() for r in caplog.records] == [
        "multi_turn.repair_tool_calls=False: the 'plain' parser takes no repair switch and "
        "parses as it always does"
    ]

"""Chat formats: what ``multi_turn.format`` names. A format ties a model family's tool-call
syntax (its parser) to how its chat template ends a model turn and what the template needs
in the message history to render tool results.

This is the one registry of both formats and parsers: a family module registers its format
with ``register_format``, and a parser is always built from its format
(``fmt.new_parser(...)``), so the parser that reads a turn and the end tokens that closed it
cannot come from two lookups. ``register_parser`` is the shorthand for a parser of one's own: a
plain format around it that ends turns with the tokenizer's eos (or, under the name of a
registered format, that format with the new parser). ``get_format`` looks a format up;
``detect_format`` derives it from a chat template's text, and ``end_tokens`` takes the
end-of-turn ids from the tokenizer (never assumed to be eos).
A format can be a *variant* of another (``variant_of``): the same family in a later template
version that renders history differently (Mistral v7+ tool results, GLM-4.7's reasoning).
The template picks the variant, also when ``multi_turn.format`` names the base format.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, ToolCallParser

__all__ = [
    "ChatFormat",
    "all_formats",
    "content_message",
    "detect_format",
    "EndTokens",
    "end_tokens",
    "get_format",
    "plain_tool_message",
    "register_format",
    "register_parser",
    "registered_formats",
    "resolve_format",
    "variant_for",
]

logger = logging.getLogger(__name__)

AssistantBuilder = Callable[[str, ParsedTurn], dict[str, Any]]
ToolBuilder = Callable[[str, "ToolCall | ToolCallError", int, dict[str, Any]], dict[str, Any]]


def content_message(text: str, parsed: ParsedTurn) -> dict[str, Any]:
    """The assistant message as sampled text (templates that render ``content`` verbatim)."""
    return {"role": "assistant", "content": text}


def plain_tool_message(
    content: str, item: ToolCall | ToolCallError, index: int, assistant: dict[str, Any]
) -> dict[str, Any]:
    """``{"role": "tool", "content": ...}``: the answer to item ``index`` of the turn."""
    return {"role": "tool", "content": content}


@dataclass(frozen=True, kw_only=True)
class ChatFormat:
    name: str
    parser: Callable[..., ToolCallParser]
    """The parser class; ``new_parser`` builds one (with ``repair=`` when it takes it)."""
    end_tokens: tuple[str, ...] = ()
    """Special tokens that end a model turn, in order of preference (every one the tokenizer
    has counts). Empty: the tokenizer's eos token."""
    call_end_tokens: tuple[str, ...] | None = None
    """End tokens after which the turn's tool calls run (None: every end token). A turn
    ending with another end token (gpt-oss ``<|return|>``) is final."""
    end_opens_next: bool = False
    """The end token the model samples is the header of the next message, as GLM's
    ``<|observation|>``: the delta starts right after it in the rendering."""
    delta_end_tokens: tuple[str, ...] = ()
    """Tokens that close a message in the rendered history, counted by ``encode_delta`` to
    find where the sampled turn ends (empty: ``end_tokens``). gpt-oss closes messages inside
    a turn, and re-renders an earlier ``<|return|>``, with ``<|end|>``: counted here, but not
    an end token (it must not stop the engine)."""
    template_markers: tuple[str, ...] = ()
    """Strings that all appear in the family's chat template (``detect_format``)."""
    variant_of: str = ""
    """The format this one refines (a later template version of the same family). A
    template that is the base's and holds any of ``variant_markers`` gets this format, also
    when ``multi_turn.format`` names the base."""
    variant_markers: tuple[str, ...] = ()
    """Strings of which one in the base family's template marks this version."""
    aliases: tuple[str, ...] = ()
    assistant_message: AssistantBuilder = content_message
    """History message for a model turn that called tools (what the template needs to
    render the tool results after it; the trajectory keeps the sampled tokens)."""
    tool_message: ToolBuilder = plain_tool_message
    """History message answering one call (or error) of that turn."""
    history_rewrite: Callable[[str], str] | None = None
    """Maps rendered history to the form it takes once later messages exist, for the
    template's documented rewrites (dropped reasoning). None: the default drops ``<think>``
    blocks."""
    family: str = ""
    """The model families the format is for (docs)."""
    call_syntax: str = ""
    """How a tool call is written (docs)."""
    eos_fallback: bool = False
    """Use the tokenizer's eos token when it has none of ``end_tokens``."""
    notes: str = ""
    """One line for the docs: what the template rewrites, what is exact."""

    def new_parser(
        self, *, repair: bool = True, schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> ToolCallParser:
        """A fresh parser for this format's turns. ``repair``
        (``multi_turn.repair_tool_calls``) goes to parsers whose constructor takes it, and
        ``schemas`` (tool name -> schema) to those that take it, for syntaxes whose argument
        values are untyped text (GLM); a user parser that takes no repair switch is used as
        it is (logged once per format when repair is off)."""
        params = inspect.signature(self.parser).parameters
        if "repair" in params:
            extra = {"schemas": schemas} if schemas is not None and "schemas" in params else {}
            return self.parser(repair=repair, **extra)
        if not repair and self.name not in _NO_REPAIR_WARNED:
            _NO_REPAIR_WARNED.add(self.name)
            logger.warning(
                "multi_turn.repair_tool_calls=False: the %r parser takes no repair switch and "
                "parses as it always does",
                self.name,
            )
        return self.parser()


_FORMATS: dict[str, ChatFormat] = {}
_NO_REPAIR_WARNED: set[str] = set()


def register_format(fmt: ChatFormat) -> ChatFormat:
    """Make ``fmt`` (and its aliases) available as ``multi_turn.format``."""
    for name in (fmt.name, *fmt.aliases):
        _FORMATS[name] = fmt
    return fmt


def register_parser(name: str) -> Callable[[type], type]:
    """Class decorator: make a parser available as ``multi_turn.format=name``, for a family
    whose turns end with the tokenizer's eos (a plain format around the parser). Under the
    name of a registered format it replaces that format's parser alone, so the family's end
    tokens and history messages are kept (its aliases keep the old parser)."""

    def wrap(cls: type) -> type:
        known = _FORMATS.get(name)
        fmt = (
            ChatFormat(name=name, parser=cls)
            if known is None
            else replace(known, name=name, parser=cls, aliases=())
        )
        _FORMATS[name] = fmt
        return cls

    return wrap


def registered_formats() -> list[str]:
    """Every name ``multi_turn.format`` accepts (formats, aliases, parsers registered alone)."""
    return sorted(_FORMATS)


def all_formats() -> list[ChatFormat]:
    """Every registered format once (aliases folded), by name."""
    return [fmt for name, fmt in sorted(_FORMATS.items()) if name == fmt.name]


def get_format(name: str) -> ChatFormat:
    """The format registered as ``name`` (a format, an alias or a parser registered alone).
    Unknown names raise naming the registered ones."""
    if name in _FORMATS:
        return _FORMATS[name]
    raise ValueError(
        f"unknown multi_turn.format {name!r}; registered: {', '.join(registered_formats())} "
        "(register your own with agentloop.register_format or agentloop.register_parser)"
    )


def detect_format(chat_template: str | None) -> str | None:
    """The registered format whose template markers all appear in ``chat_template`` (the
    one with most markers when several match); None when none does."""
    if not chat_template:
        return None
    best: tuple[int, str] | None = None
    for name, fmt in _FORMATS.items():
        if name != fmt.name or not fmt.template_markers:
            continue
        if all(m in chat_template for m in fmt.template_markers):
            score = len(fmt.template_markers)
            if best is None or score > best[0]:
                best = (score, name)
    return variant_for(best[1], chat_template).name if best else None


def variant_for(name: str, chat_template: str | None) -> ChatFormat:
    """The format ``name`` (aliases too), or its variant whose marker ``chat_template``
    holds (the template version it renders)."""
    fmt = get_format(name)
    if fmt.variant_of or not chat_template:
        return fmt
    for variant in all_formats():
        if variant.variant_of == fmt.name and any(
            m in chat_template for m in variant.variant_markers
        ):
            return variant
    return fmt


def _template_of(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    return template


def resolve_format(name: str | None, tokenizer: Any) -> ChatFormat:
    """``multi_turn.format`` as configured, or derived from the tokenizer's chat template
    when unset (``hermes`` when no family matches, logged once). A configured base format
    becomes its variant when the template is that version's (logged once)."""
    template = _template_of(tokenizer)
    if name:
        fmt = variant_for(name, template)
        if fmt.name != get_format(name).name and (name, fmt.name) not in _WARNED:
            _WARNED.add((name, fmt.name))
            logger.info(
                "multi_turn.format=%s: the chat template is the %s version (%s)",
                name,
                fmt.name,
                fmt.family,
            )
        return fmt
    found = detect_format(template)
    if found is None:
        if "hermes" not in _WARNED:
            _WARNED.add("hermes")
            logger.warning(
                "multi_turn.format is unset and the chat template matches no registered "
                "format; parsing tool calls as hermes (set multi_turn.format to choose)"
            )
        found = "hermes"
    return get_format(found)


_WARNED: set[str | tuple[str, str]] = set()


def _token_id(tokenizer: Any, token: str) -> int | None:
    vocab_id = tokenizer.convert_tokens_to_ids(token)
    # an unknown token maps to unk, whose text differs (unless it is the unk token itself)
    if vocab_id is None or tokenizer.convert_ids_to_tokens(vocab_id) != token:
        return None
    return int(vocab_id)


@dataclass(frozen=True, slots=True)
class EndTokens:
    """A format's end-of-turn tokens as this tokenizer has them."""

    strings: tuple[str, ...]
    """Every token that ends a model turn (text form, as rendered by the template)."""
    ids: frozenset[int]
    call_ids: frozenset[int]
    """Ends after which the turn's tool calls run."""
    opens_next: bool
    """The end token is the next message's header (``ChatFormat.end_opens_next``)."""
    boundaries: tuple[str, ...]
    """What ``encode_delta`` counts to find the cut: ``ChatFormat.delta_end_tokens`` the
    tokenizer has, else ``strings``."""


def end_tokens(tokenizer: Any, fmt: ChatFormat) -> EndTokens:
    """The format's end tokens the tokenizer has (its eos token where the format names
    none; hermes falls back to eos for ChatML-like templates without ``<|im_end|>``).
    Raises ``ValueError`` naming the tokens when the tokenizer has none of them."""
    eos = getattr(tokenizer, "eos_token", None)
    names: Sequence[str] = fmt.end_tokens or ([eos] if eos else [])
    ends = {t: i for t in names if (i := _token_id(tokenizer, t)) is not None}
    if not ends and fmt.eos_fallback and eos and (i := _token_id(tokenizer, eos)) is not None:
        ends = {eos: i}
    if not ends:
        raise ValueError(
            f"multi_turn.format={fmt.name} ends model turns with "
            f"{' or '.join(names) or 'the eos token'}, but the tokenizer has none of them: "
            "set multi_turn.format to the model's family (or leave it unset to derive it from "
            "the chat template)"
        )
    calls = fmt.call_end_tokens
    call_ids = (
        frozenset(ends.values())
        if calls is None
        else frozenset(ends[t] for t in calls if t in ends)
    )
    boundaries = tuple(t for t in fmt.delta_end_tokens if _token_id(tokenizer, t) is not None)
    return EndTokens(
        strings=tuple(ends),
        ids=frozenset(ends.values()),
        call_ids=call_ids,
        opens_next=fmt.end_opens_next,
        boundaries=boundaries or tuple(ends),
    )

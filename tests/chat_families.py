"""Tokenizers for the chat-format families without a model asset here: the tiny-qwen3
tokenizer with the family's special tokens added (each one id, as in the family's own
tokenizer) and the project's test template for the family
(``tests/fixtures/chat_templates/<name>.jinja``). BPE merges never cross a special token,
so the delta boundaries behave as with the family's tokenizer.

``FAMILY_TOKENS`` is the one table of each test template's special tokens, eos and bos;
every family test builds its tokenizer from it through ``family_tokenizer``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from transformers import AutoTokenizer

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class FamilyTokens:
    """The tokens a family's own tokenizer has as single special tokens."""

    format: str
    """The agentloop format the template is detected as."""
    special: tuple[str, ...]
    """Every special token the template writes (each one id)."""
    eos: str
    """The tokenizer's eos token."""
    bos: str | None = None
    """The tokenizer's bos token (None: the family's template writes none)."""


_MISTRAL_V3 = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[ARGS]",
    "[CALL_ID]",
)
# the v7+ templates (Mistral Small 3.x, Devstral, Magistral) add these
_MISTRAL_V7 = (*_MISTRAL_V3[:-2], "[TOOL_CONTENT]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
_MISTRAL_V7 += _MISTRAL_V3[-2:]
# GLM-4.5's tokenizer has all of these as single special tokens (GLM-4.7's the same)
_GLM = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
    "/nothink",
)
_LLAMA3 = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
_GPT_OSS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|endoftext|>",
)
_QWEN = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")

# test template name (tests/fixtures/chat_templates/<name>.jinja) -> its family's tokens
FAMILY_TOKENS: dict[str, FamilyTokens] = {
    "mistral": FamilyTokens("mistral", _MISTRAL_V3, "</s>", "<s>"),
    "mistral_v7": FamilyTokens("mistral_v7", _MISTRAL_V7, "</s>", "<s>"),
    "mistral_v13": FamilyTokens("mistral_v7", _MISTRAL_V7, "</s>", "<s>"),
    "llama3": FamilyTokens("llama3_json", _LLAMA3, "<|eot_id|>", "<|begin_of_text|>"),
    "glm45": FamilyTokens("glm45", _GLM, "<|endoftext|>"),
    "glm47": FamilyTokens("glm47", _GLM, "<|endoftext|>"),
    "gpt_oss": FamilyTokens("gpt-oss", _GPT_OSS, "<|return|>"),
    "qwen25": FamilyTokens("hermes", _QWEN, "<|endoftext|>"),
}


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@functools.cache
def _cached_family_tokenizer(base_path: str, template: str, eos_token: str | None) -> Any:
    tokens = FAMILY_TOKENS[template]
    return build_tokenizer(
        base_path,
        template,
        special_tokens=list(tokens.special),
        eos_token=eos_token or tokens.eos,
        bos_token=tokens.bos,
    )


def family_tokenizer(base_path: str | Path, template: str, *, eos_token: str | None = None) -> Any:
    """The family test tokenizer of ``template`` (its ``FAMILY_TOKENS`` entry) over the
    tokenizer at ``base_path``, built once per process: shared, so a test that changes it
    changes a ``copy.deepcopy`` of it. ``eos_token`` replaces the family's eos."""
    return _cached_family_tokenizer(str(base_path), template, eos_token)


def build_tokenizer(
    base_path: str | Path,
    template: str,
    *,
    special_tokens: list[str],
    eos_token: str,
    bos_token: str | None = None,
) -> Any:
    """The tokenizer at ``base_path`` with ``special_tokens`` added, the chat template
    ``tests/fixtures/chat_templates/<template>.jinja`` and the family's eos/bos."""
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    # all of them, those already in the vocabulary too (their id is kept, now split first)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": list(special_tokens)}, replace_extra_special_tokens=False
    )
    tokenizer.chat_template = template_text(template)
    tokenizer.eos_token = eos_token
    if bos_token is not None:
        tokenizer.bos_token = bos_token
    split = split_special_tokens(tokenizer, special_tokens)
    if split:
        raise AssertionError(f"special tokens that are not one id in context: {split}")
    return tokenizer


# text a special token is tried next to: characters BPE would merge an ordinary token with
NEIGHBOURS = ("", "]", ">", "<", "x", " ", "\n", "s", "[", "|", "/")


def split_special_tokens(tokenizer: Any, tokens: list[str]) -> dict[str, list[str]]:
    """The tokens of ``tokens`` the tokenizer does not keep as one id next to every
    neighbour in ``NEIGHBOURS`` (token -> the pieces it was split into)."""
    split: dict[str, list[str]] = {}
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        for left in NEIGHBOURS:
            for right in NEIGHBOURS:
                ids = tokenizer.encode(left + token + right, add_special_tokens=False)
                if ids.count(token_id) != 1 or tokenizer.decode([token_id]) != token:
                    split[token] = tokenizer.tokenize(left + token + right)
    return split


def property_settings(max_examples: int) -> settings:
    """The hypothesis settings of the format property tests: reproducible examples, no
    deadline (a render takes milliseconds), a module-scoped tokenizer allowed."""
    return settings(
        deadline=None,
        max_examples=max_examples,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def render(tokenizer: Any, messages, tools=None, *, add_generation_prompt=True, **kwargs) -> str:
    """The chat template's text of ``messages`` (with the generation prompt by default)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


def decode(tokenizer: Any, ids: list[int]) -> str:
    """``ids`` as text, special tokens and spaces exactly as encoded."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

"""Tokenizers for the chat-format families without a model asset here: the tiny-qwen3
tokenizer with the family's special tokens added (each one id, as in the family's own
tokenizer) and the project's test template for the family
(``tests/fixtures/chat_templates/<name>.jinja``). BPE merges never cross a special token,
so the delta boundaries behave as with the family's tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def family_tokenizer(
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

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
    new = [t for t in special_tokens if t not in tokenizer.get_vocab()]
    if new:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": new}, replace_extra_special_tokens=False
        )
    tokenizer.chat_template = template_text(template)
    tokenizer.eos_token = eos_token
    if bos_token is not None:
        tokenizer.bos_token = bos_token
    return tokenizer

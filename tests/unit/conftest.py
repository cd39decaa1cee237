"""Fixtures the unit tests share across modules: what is costly to build is built once per
session here instead of once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer(tiny_qwen3_path: Path) -> Iterator[Any]:
    """The tiny-qwen3 tokenizer, loaded once for every unit module that asks for ``tokenizer``
    (a load parses its 18 MB ``tokenizer.json``: seconds on two cores). Shared, so no test may
    change it: the session ends with a check that its vocabulary and template are unchanged. A
    module that needs another tokenizer defines its own ``tokenizer`` fixture."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    vocab, template = len(tokenizer), tokenizer.chat_template
    yield tokenizer
    assert (len(tokenizer), tokenizer.chat_template) == (vocab, template), (
        "a test changed the shared session tokenizer (tests/unit/conftest.py): copy it or load "
        "your own in a module fixture before adding tokens or setting a chat template"
    )

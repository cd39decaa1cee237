"""The tiny-qwen3 tokenizer is the Qwen BPE: same ids as tiktoken over qwen.tiktoken.

Like Qwen's own Hugging Face tokenizers it NFC-normalises text first, so the reference is
tiktoken applied to the NFC form.
"""

from __future__ import annotations

import random
import unicodedata

import pytest
import tiktoken

from trainer.models.qwen_tokenizer import (
    QWEN_PATTERN,
    QWEN_SPECIAL_TOKENS,
    load_ranks,
    qwen_tiktoken_path,
)

FIRST_SPECIAL_ID = 151643

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "日本語のテキストと한국어 텍스트",
    "def add(a: int, b: int) -> int:\n    return a + b  # sum\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    '{"name": "calculator", "arguments": {"expr": "3 * (4 + 5)"}}',
    "🙂🚀 emoji 👩‍👩‍👧 family 🇫🇷 flag",
    "a   b\t\tc\n\n\n  d    ",
    "   leading spaces and trailing   ",
    "\n\n\n",
    "I'm sure you'LL see it's they've we'd",
    "1234567890 3.14159 -42 1e-9",
    "Ünïcödé naïve café résumé",
    '<tool_call>\n{"name": "f"}\n</tool_call><|im_end|>',
    "",
]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    specials = {text: FIRST_SPECIAL_ID + i for i, (text, _) in enumerate(QWEN_SPECIAL_TOKENS)}
    return tiktoken.Encoding(
        "qwen-reference",
        pat_str=QWEN_PATTERN,
        mergeable_ranks=load_ranks(qwen_tiktoken_path()),
        special_tokens=specials,
    )


def _reference_ids(reference: tiktoken.Encoding, text: str) -> list[int]:
    return reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")


def _random_texts(n: int, seed: int = 0) -> list[str]:
    """Seeded mixed-script strings: ASCII words, CJK, digits, punctuation, emoji, whitespace."""
    rng = random.Random(seed)
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [chr(c) for c in range(0x4E00, 0x4E00 + 400)],
        [chr(c) for c in range(0x3040, 0x30FF)],
        [chr(c) for c in range(0x0400, 0x0450)],
        ["🙂", "🚀", "🎉", "👍🏽", "❤️", "\u200d"],
        [" ", "  ", "\t", "\n", "\r\n", "    "],
    ]
    texts = []
    for _ in range(n):
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 60))]
        texts.append("".join(parts))
    return texts


@pytest.mark.parametrize("text", STRINGS)
def test_tokenizer_matches_tiktoken_bpe(tokenizer, reference, text):
    assert tokenizer.encode(text, add_special_tokens=False) == _reference_ids(reference, text)


def test_tokenizer_matches_tiktoken_on_random_mixed_script_text(tokenizer, reference):
    texts = _random_texts(300)
    mismatches = [
        t
        for t in texts
        if tokenizer.encode(t, add_special_tokens=False) != _reference_ids(reference, t)
    ]
    assert mismatches == []


def test_tokenizer_nfc_normalises_like_qwen(tokenizer):
    decomposed = "cafe\u0301 \u3057\u3099"  # e + combining acute, し + combining dakuten
    composed = unicodedata.normalize("NFC", decomposed)
    assert composed != decomposed
    assert tokenizer.encode(decomposed, add_special_tokens=False) == tokenizer.encode(
        composed, add_special_tokens=False
    )


def test_tokenizer_roundtrips_text(tokenizer):
    for text in STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_each_special_token_is_one_id_at_its_qwen_position(tokenizer):
    for offset, (text, _special) in enumerate(QWEN_SPECIAL_TOKENS):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == [FIRST_SPECIAL_ID + offset], text
    assert len(tokenizer) == FIRST_SPECIAL_ID + len(QWEN_SPECIAL_TOKENS)


def test_special_tokens_inside_text_are_single_ids(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)
    assert ids[0] == 151644 and 151645 in ids
    assert tokenizer.convert_ids_to_tokens(ids[-2]) == "<|im_end|>"


def test_tool_and_think_markers_survive_skip_special_tokens(tokenizer):
    ids = tokenizer.encode("<think>x</think><tool_call>y</tool_call><|im_end|>")
    assert (
        tokenizer.decode(ids, skip_special_tokens=True)
        == "<think>x</think><tool_call>y</tool_call>"
    )


def test_eos_and_pad_are_qwen3s(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 151643
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"

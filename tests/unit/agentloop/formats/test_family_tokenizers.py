"""The family test tokenizers (tiny-qwen3's with each family's special tokens): every special
token is one id next to any text, also those tiny-qwen3 has as ordinary text (``<s>``,
``</s>``, ``<think>``), and the end tokens ``end_tokens`` reports are the ids the text of a
closed turn encodes to. ``FAMILY_TOKENS`` names the format each template is detected as."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentloop.formats import detect_format, end_tokens, get_format
from tests.chat_families import (
    FAMILY_TOKENS,
    family_tokenizer,
    split_special_tokens,
    template_text,
)


@pytest.mark.parametrize("template", sorted(FAMILY_TOKENS))
def test_every_special_token_is_one_id_in_context(tiny_qwen3_path, template):
    tokens = FAMILY_TOKENS[template]
    name, special = tokens.format, list(tokens.special)
    tok = family_tokenizer(tiny_qwen3_path, template)
    assert detect_format(template_text(template)) == name
    assert tok.eos_token == tokens.eos and tokens.bos in (None, tok.bos_token)
    assert split_special_tokens(tok, special) == {}
    ids = [tok.convert_tokens_to_ids(t) for t in special]
    assert len(set(ids)) == len(special)
    for token, token_id in zip(special, ids, strict=True):
        assert tok.encode(f"x]{token}>s", add_special_tokens=False).count(token_id) == 1
    ends = end_tokens(tok, get_format(name))
    for text in ends.strings:
        (end_id,) = tok.encode(text, add_special_tokens=False)
        assert end_id in ends.ids
        assert tok.encode("]" + text, add_special_tokens=False)[-1] == end_id


def test_the_mistral_tokens_tiny_qwen3_has_as_text_are_single_ids(tiny_qwen3_path):
    tok = family_tokenizer(tiny_qwen3_path, "mistral")
    assert tok.tokenize("]</s>") == ["]", "</s>"]
    assert tok.tokenize("<s>[INST]") == ["<s>", "[INST]"]


def test_the_check_finds_a_token_left_as_ordinary_text(tiny_qwen3_path):
    """What the helper did before: ``</s>`` in tiny-qwen3's vocabulary, not split first."""
    plain = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    assert "</s>" in plain.get_vocab()
    split = split_special_tokens(plain, ["</s>", "<think>"])
    assert set(split) == {"</s>"}
    assert split["</s>"] != ["</s>"]

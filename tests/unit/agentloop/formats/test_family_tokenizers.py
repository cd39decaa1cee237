"""The family test tokenizers (tiny-qwen3's with each family's special tokens): every special
token is one id next to any text, also those tiny-qwen3 has as ordinary text (``<s>``,
``</s>``, ``<think>``), and the end tokens ``end_tokens`` reports are the ids the text of a
closed turn encodes to."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentloop.formats import end_tokens, get_format
from tests.chat_families import family_tokenizer, split_special_tokens
from tests.unit.agentloop.formats import (
    test_glm,
    test_gpt_oss,
    test_llama3,
    test_mistral,
    test_qwen25,
)
from tests.unit.agentloop.formats.mistral_official import SPECIAL_V7

# template -> (format, special tokens, eos, bos)
FAMILIES = {
    "mistral": ("mistral", test_mistral.SPECIAL, "</s>", "<s>"),
    "mistral_v7": ("mistral_v7", SPECIAL_V7, "</s>", "<s>"),
    "mistral_v13": ("mistral_v7", SPECIAL_V7, "</s>", "<s>"),
    "llama3": ("llama3_json", test_llama3.SPECIAL, "<|eot_id|>", "<|begin_of_text|>"),
    "glm45": ("glm45", test_glm.SPECIAL, "<|endoftext|>", None),
    "glm47": ("glm47", test_glm.SPECIAL, "<|endoftext|>", None),
    "gpt_oss": ("gpt-oss", test_gpt_oss.SPECIAL, "<|return|>", None),
    "qwen25": ("hermes", test_qwen25.SPECIAL, "<|endoftext|>", None),
}


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_every_special_token_is_one_id_in_context(tiny_qwen3_path, template):
    name, special, eos, bos = FAMILIES[template]
    tok = family_tokenizer(
        tiny_qwen3_path, template, special_tokens=special, eos_token=eos, bos_token=bos
    )
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
    tok = family_tokenizer(
        tiny_qwen3_path, "mistral", special_tokens=test_mistral.SPECIAL, eos_token="</s>"
    )
    assert tok.tokenize("]</s>") == ["]", "</s>"]
    assert tok.tokenize("<s>[INST]") == ["<s>", "[INST]"]


def test_the_check_finds_a_token_left_as_ordinary_text(tiny_qwen3_path):
    """What the helper did before: ``</s>`` in tiny-qwen3's vocabulary, not split first."""
    plain = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    assert "</s>" in plain.get_vocab()
    split = split_special_tokens(plain, ["</s>", "<think>"])
    assert set(split) == {"</s>"}
    assert split["</s>"] != ["</s>"]

"""A Qwen2/2.5/3 tokenizer built offline from the BPE ranks that qwen-agent ships.

``qwen_agent/utils/qwen.tiktoken`` holds the 151,643 byte-level BPE tokens of the Qwen
vocabulary as ``base64(token_bytes) rank`` lines. A tiktoken BPE merges, at each step, the
adjacent pair whose concatenation has the lowest rank. The Hugging Face BPE model merges the
adjacent pair with the lowest *merge priority*, so listing every split ``(left, right)`` of every
token (both halves in the vocabulary) with the merged token's rank as its priority reproduces
tiktoken's choices. Special tokens follow at ids 151643.. in Qwen's order.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "QWEN_PATTERN",
    "QWEN_SPECIAL_TOKENS",
    "bytes_to_unicode",
    "qwen_tiktoken_path",
    "load_ranks",
    "build_qwen_tokenizer",
    "save_qwen_tokenizer",
]

# Pre-tokenisation regex of the Qwen2+ tokenizers (contractions, letters with one leading
# non-letter, single digits, punctuation runs, newlines, other whitespace).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (token, special) in id order from 151643. "special" tokens are skipped by
# `decode(skip_special_tokens=True)`; the tool/think markers stay visible, as in Qwen3.
QWEN_SPECIAL_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte maps to one printable unicode character.

    Printable Latin-1 bytes map to themselves; the rest (control characters, space, ...) are
    shifted to code points from 256 upwards, in byte order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed qwen-agent package."""
    spec = importlib.util.find_spec("qwen_agent")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("qwen-agent is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed qwen-agent")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file into ``{token_bytes: rank}``."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merges(vocab: dict[str, int], tokens: Iterable[str]) -> list[tuple[str, str]]:
    """Every (left, right) split of every token, ordered by the merged token's rank."""
    ranked: list[tuple[int, int, int, str, str]] = []
    for token in tokens:
        rank = vocab[token]
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in vocab and right in vocab:
                ranked.append((rank, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_qwen_tokenizer(chat_template: str, model_max_length: int = 131072):
    """Build a ``PreTrainedTokenizerFast`` equal to the Qwen3 tokenizer.

    Returns the transformers tokenizer; ``save_pretrained`` writes ``tokenizer.json``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast

    alphabet = bytes_to_unicode()
    ranks = load_ranks(qwen_tiktoken_path())
    vocab = {"".join(alphabet[b] for b in token): rank for token, rank in ranks.items()}
    merges = _merges(vocab, vocab)

    bpe = models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    first_id = len(vocab)
    for offset, (text, special) in enumerate(QWEN_SPECIAL_TOKENS):
        added = AddedToken(text, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        assert tok.token_to_id(text) == first_id + offset, text

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def save_qwen_tokenizer(tokenizer, out: Path) -> None:
    """Save ``tokenizer`` under the class name Qwen checkpoints use, so that
    ``AutoTokenizer`` (and vLLM) load it as a ``Qwen2Tokenizer``."""
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config, indent=2) + "\n")

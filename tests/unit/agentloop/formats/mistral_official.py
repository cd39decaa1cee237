"""mistral_common's own encoders for the Mistral test templates, built offline.

``MistralTokenizer.v3()`` and ``.v7()`` ship with the package (SentencePiece). The tekken
tokenizers of v7 and later models are built from the tekken vocabulary the package ships
(``tekken_240718.json``) with the file's version set to v7, v11 or v13 and the special tokens
those versions need: the instruct encoder of that version then lays a conversation out as for
Mistral Small 3.x (v7), Mistral Small 3.2 / Devstral (v11) or Magistral (v13). Comparisons
map the test template's text to these ids: special tokens as themselves, each text piece
between them encoded on its own, as mistral_common encodes each part of a message.
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from tests.chat_families import FAMILY_TOKENS

# the special tokens of the v7+ test templates (each one id in the family test tokenizer)
SPECIAL_V7 = FAMILY_TOKENS["mistral_v7"].special
_LATER_SPECIAL = ["[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]


@functools.cache
def tekken(version: str) -> MistralTokenizer:
    """mistral_common's tekken tokenizer of ``version`` (``v7``, ``v11``, ``v13``);
    ``sp-v7`` is the SentencePiece v7 one it ships (Mistral-Large-2411), whose encoder adds
    a space before each text piece."""
    if version == "sp-v7":
        return MistralTokenizer.v7()
    data = Path(MistralTokenizer._data_path()) / "tekken_240718.json"
    spec = json.loads(data.read_text())
    special = [
        {**dict(t), "token_str": str(dict(t)["token_str"])}
        for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS
    ]
    special += [
        {"rank": len(special) + i, "token_str": token, "is_control": True}
        for i, token in enumerate(_LATER_SPECIAL)
    ]
    spec["config"] = {**spec["config"], "version": version}
    spec["special_tokens"] = special
    with tempfile.TemporaryDirectory(prefix="agentloop-tekken-") as folder:
        path = Path(folder) / f"tekken_{version}.json"
        path.write_text(json.dumps(spec))
        tokenizer = MistralTokenizer.from_file(path)
    assert tokenizer.instruct_tokenizer.tokenizer.version.value == version
    return tokenizer


def official_ids(
    tokenizer: MistralTokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[int]:
    """The conversation as mistral_common encodes it (as a client would send it)."""
    request = ChatCompletionRequest.model_validate({"messages": messages, "tools": tools})
    return tokenizer.encode_chat_completion(request).tokens


def template_as_official_ids(tokenizer: MistralTokenizer, text: str) -> list[int]:
    """A v7+ test template's rendering in the official tokenizer's ids."""
    inner = tokenizer.instruct_tokenizer.tokenizer
    pattern = "(" + "|".join(re.escape(t) for t in SPECIAL_V7) + ")"
    ids: list[int] = []
    for part in re.split(pattern, text):
        if part in SPECIAL_V7:
            ids.append(inner.get_special_token(part))
        elif part:
            ids += inner.encode(part, bos=False, eos=False)
    return ids

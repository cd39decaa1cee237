"""Where a tokenizer comes from: a folder, loaded with the options the model was configured
with (``trust_remote_code``, a chat template that replaces the folder's own). A
``TokenizerSource`` is small and picklable, so agent-loop workers in other processes load the
same tokenizer the driver checked the data with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TokenizerSource", "load_tokenizer"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerSource:
    path: str
    """A local tokenizer folder (hub ids and asset names are resolved to one before)."""
    trust_remote_code: bool = False
    """Let transformers run tokenizer code shipped in the folder."""
    chat_template: str | None = None
    """Jinja chat template text that replaces the tokenizer's own (None: keep it)."""
    external_lib: str | None = None
    """Module imported before the tokenizer loads, in whichever process loads it (the model's
    ``external_lib``: it may register a tokenizer class with transformers)."""

    def load(self) -> Any:
        from transformers import AutoTokenizer

        from servers.user_code import import_external_lib

        import_external_lib(self.external_lib, "actor_rollout_ref.model.external_lib")

        tokenizer = AutoTokenizer.from_pretrained(
            self.path, trust_remote_code=self.trust_remote_code
        )
        if self.chat_template is not None:
            tokenizer.chat_template = self.chat_template
        return tokenizer


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer as is; a ``TokenizerSource`` or a folder path (``str``/``Path``) loaded."""
    if isinstance(tokenizer, (str, Path)):
        tokenizer = TokenizerSource(path=str(tokenizer))
    if isinstance(tokenizer, TokenizerSource):
        return tokenizer.load()
    return tokenizer

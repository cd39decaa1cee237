"""What an in-process gateway agent is handed (its session's endpoint), and the error of an
agent that failed its sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AgentFailed", "LLMEndpoint"]


class AgentFailed(Exception):
    """The agent raised, exited non-zero or ran past its time limit."""


@dataclass(slots=True)
class LLMEndpoint:
    """What an in-process agent gets: where its session's OpenAI endpoint is."""

    base_url: str
    """``http://host:port/sessions/{sid}/v1``: give it to any OpenAI client."""
    api_key: str
    model: str
    session_id: str
    _client: Any = None

    @property
    def anthropic_base_url(self) -> str:
        """``http://host:port/sessions/{sid}``: the base URL of an Anthropic client (it
        appends ``/v1/messages``; Claude Code's ``ANTHROPIC_BASE_URL``)."""
        return self.base_url.removesuffix("/v1")

    @property
    def client(self) -> Any:
        """A ready ``openai.AsyncOpenAI`` for this session (made on first use)."""
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=0
            )
        return self._client

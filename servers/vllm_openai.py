"""The OpenAI chat-completions endpoint, served by vLLM's own serving layer and Hermes tool
parser over the running ``AsyncLLM`` (reuse beats a hand-written copy)."""

from __future__ import annotations

from typing import Any

from servers.http import error_body

__all__ = ["VLLMChat"]


class VLLMChat:
    """``await chat(body) -> (status, json | async iterator of SSE strings)``."""

    def __init__(self, engine, model_path: str, served_name: str, tool_parser: str) -> None:
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.renderers.online_renderer import OnlineRenderer

        models = OpenAIServingModels(
            engine_client=engine,
            base_model_paths=[BaseModelPath(name=served_name, model_path=model_path)],
        )
        common: dict[str, Any] = dict(
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            enable_auto_tools=True,
            tool_parser=tool_parser,
        )
        renderer = OnlineRenderer(
            model_config=engine.model_config, renderer=engine.renderer, **common
        )
        self._serving = OpenAIServingChat(
            engine, models, "assistant", online_renderer=renderer, **common
        )

    async def __call__(self, body: dict[str, Any]) -> tuple[int, Any]:
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
            ChatCompletionResponse,
        )
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.exceptions import VLLMClientError

        try:
            request = ChatCompletionRequest.model_validate(body)
            result = await self._serving.create_chat_completion(request, raw_request=None)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ()))
            return 400, error_body(f"{field}: {first.get('msg')}", param=field or None)
        except (VLLMClientError, ValueError) as exc:
            return 400, error_body(str(exc))
        if isinstance(result, ErrorResponse):
            return result.error.code, result.model_dump()
        if isinstance(result, ChatCompletionResponse):
            return 200, result.model_dump()
        return 200, result  # streaming: async iterator of "data: ...\n\n" strings

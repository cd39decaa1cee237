"""The OpenAI chat-completions and (text) completions endpoints, served by vLLM's own serving
layer and Hermes tool parser over the running ``AsyncLLM`` (reuse beats a hand-written copy).

The HTTP front checks a request's ``n`` and ``max_tokens`` before admitting it
(``servers/limits.py``); its prompt length is known only once vLLM has applied the chat
template (or tokenized a text prompt), so ``max_prompt_tokens`` is checked here, before the
engine sees the request.

On a server with LoRA on, a request that names the served model runs on the adapter version
loaded last (as ``/generate`` does), and its response still names the served model."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from servers.limits import check_prompt_tokens
from servers.types import GenerateInputError, error_body

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

__all__ = ["VLLMOpenAI"]


class VLLMOpenAI:
    """``await chat(body)`` / ``await completions(body)`` -> ``(status, json | async iterator
    of SSE strings)``."""

    def __init__(
        self,
        engine,
        model_path: str,
        served_name: str,
        tool_parser: str,
        max_prompt_tokens: int | None = None,
        *,
        chat_template: str | None = None,
        current_adapter: Callable[[], LoRARequest | None] | None = None,
    ) -> None:
        """``chat_template``: Jinja text rendering chat requests instead of the tokenizer's;
        ``current_adapter``: the LoRA adapter requests run on, asked per request (None: LoRA
        off)."""
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.renderers.online_renderer import OnlineRenderer

        models_cls = OpenAIServingModels if current_adapter is None else _served_name_models()
        models = models_cls(
            engine_client=engine,
            base_model_paths=[BaseModelPath(name=served_name, model_path=model_path)],
        )
        common: dict[str, Any] = dict(
            request_logger=None,
            chat_template=chat_template,
            chat_template_content_format="auto",
            enable_auto_tools=True,
            tool_parser=tool_parser,
        )
        renderer = OnlineRenderer(
            model_config=engine.model_config, renderer=engine.renderer, **common
        )
        chat_cls, completion_cls = OpenAIServingChat, OpenAIServingCompletion
        if current_adapter is not None:
            chat_cls = _on_current_adapter(chat_cls, current_adapter)
            completion_cls = _on_current_adapter(completion_cls, current_adapter)
        if max_prompt_tokens is not None:
            chat_cls, completion_cls = _prompt_limited(chat_cls, completion_cls, max_prompt_tokens)
        self._chat = chat_cls(engine, models, "assistant", online_renderer=renderer, **common)
        self._completion = completion_cls(
            engine, models, online_renderer=renderer, request_logger=None
        )

    async def chat(self, body: dict[str, Any]) -> tuple[int, Any]:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
            ChatCompletionResponse,
        )

        return await _serve(
            ChatCompletionRequest, ChatCompletionResponse, self._chat.create_chat_completion, body
        )

    async def completions(self, body: dict[str, Any]) -> tuple[int, Any]:
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionRequest,
            CompletionResponse,
        )

        return await _serve(
            CompletionRequest, CompletionResponse, self._completion.create_completion, body
        )


async def _serve(
    request_cls: Any,
    response_cls: Any,
    create: Callable[..., Awaitable[Any]],
    body: dict[str, Any],
) -> tuple[int, Any]:
    """Validate ``body`` as ``request_cls``, run it through vLLM's ``create`` and map every
    failure to a status and an OpenAI error body."""
    from pydantic import ValidationError
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.exceptions import GenerationError, VLLMClientError

    try:
        request = _validated(request_cls, body)
        result = await create(request, raw_request=None)
    except GenerateInputError as exc:  # over max_prompt_tokens
        return 400, error_body(str(exc), param=exc.param)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        return 400, error_body(f"{field}: {first.get('msg')}", param=field or None)
    except (VLLMClientError, ValueError) as exc:
        return 400, error_body(str(exc))
    except RecursionError:  # e.g. tool-call arguments JSON nested past json's limit
        return 400, error_body("a JSON string in the request is nested too deeply to parse")
    except GenerationError:  # the engine ended the request with finish reason "error"
        if _constrained(request):
            return 400, error_body(CONSTRAINT_FAILED)
        return 500, error_body("the engine failed this request: see the server log", code=500)
    if isinstance(result, ErrorResponse):
        return result.error.code, result.model_dump()
    if isinstance(result, response_cls):
        return 200, result.model_dump()
    # streaming: async iterator of "data: ...\n\n" strings
    return 200, _constraint_errors_named(result) if _constrained(request) else result


def _on_current_adapter(serving_cls: Any, current: Callable[[], LoRARequest | None]) -> Any:
    """``serving_cls`` whose requests for the served model run on ``current()`` (vLLM would
    run them on the base model: it maps only adapter names it registered to adapters)."""

    class OnCurrentAdapter(serving_cls):
        def _maybe_get_adapters(self, request: Any, supports_default_mm_loras: bool = False):
            named = super()._maybe_get_adapters(request, supports_default_mm_loras)
            return named if named is not None else current()

    return OnCurrentAdapter


def _served_name_models() -> Any:
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    class ServedNameModels(OpenAIServingModels):
        """Responses name the served model, not the adapter version that served them."""

        def model_name(self, lora_request: LoRARequest | None = None) -> str:
            return super().model_name(None)

    return ServedNameModels


def _prompt_limited(chat_cls: Any, completion_cls: Any, limit: int) -> tuple[Any, Any]:
    """``chat_cls`` and ``completion_cls`` that raise ``GenerateInputError`` for a prompt over
    ``limit`` tokens once vLLM has rendered it (``render_chat_request`` applies the chat
    template, ``render_completion_request`` tokenizes a text prompt), before scheduling it."""

    class ChatLimited(chat_cls):
        async def render_chat_request(self, request: Any) -> Any:
            result = await super().render_chat_request(request)
            if isinstance(result, tuple):  # (conversation, engine inputs); else an error
                for engine_input in result[1]:
                    length = self._extract_prompt_len(engine_input)
                    check_prompt_tokens("messages", length, limit, " after the chat template")
            return result

    class CompletionLimited(completion_cls):
        async def render_completion_request(self, request: Any) -> Any:
            result = await super().render_completion_request(request)
            if isinstance(result, list):  # one engine input per prompt; else an error
                for engine_input in result:
                    length = self._extract_prompt_len(engine_input)
                    check_prompt_tokens("prompt", length, limit)
            return result

    return ChatLimited, CompletionLimited


# vLLM checks a grammar before the request starts, but its backends (xgrammar, guidance as
# the fallback) find some faults only when the engine compiles it (a {"$ref": "#"} cycle, a
# regex ending in a lone backslash): the request then fails as an engine error.
CONSTRAINT_FAILED = (
    "generation failed under this request's structured-output constraint (structured_outputs, "
    "response_format or a forced tool_choice): the grammar backend could not build or follow "
    "its regex or JSON schema; simplify it"
)


def _constrained(request: Any) -> bool:
    """Whether the request asks for grammar-constrained output."""
    fmt = getattr(request.response_format, "type", "text")
    return (
        request.structured_outputs is not None
        or fmt != "text"
        or getattr(request, "tool_choice", None) not in (None, "none", "auto")  # chat only
    )


async def _constraint_errors_named(chunks: Any) -> Any:
    """A stream reports a failure after it started as an in-band error event; under a
    constraint that is the constraint's fault (see ``CONSTRAINT_FAILED``): say so, as a 400."""
    async for chunk in chunks:
        if chunk.startswith('data: {"error"'):
            if json.loads(chunk.removeprefix("data: "))["error"].get("code") == 500:
                chunk = f"data: {json.dumps(error_body(CONSTRAINT_FAILED))}\n\n"
        yield chunk


def _validated(model: Any, body: dict[str, Any]) -> Any:
    """``model.model_validate(body)``. vLLM's ``mode="before"`` validators read fields before
    pydantic checks their types, so junk such as ``"messages": null`` raises TypeError (or
    AttributeError, KeyError) there instead of a ValidationError: bad input all the same."""
    try:
        return model.model_validate(body)
    except (TypeError, AttributeError, LookupError) as exc:
        raise ValueError(f"request body has a value of the wrong type ({exc})") from None

"""``SimulatedUser``: a model plays the user. It runs on its own server group
(``multi_turn.user_model``, started by the trainer like the judge's) and sees the conversation
with the roles swapped: its persona as the system prompt, the policy's turns as the user's, its
own earlier lines as its turns.

```yaml
interaction:
  - name: customer
    class_name: agentloop.interactions.SimulatedUser
    config:
      system_prompt: "You are a customer who wants {goal}. ... say {end_marker} when done."
      end_marker: "[DONE]"          # in the user's reply: the episode ends
      score_pattern: "<score>([0-9.]+)</score>"   # optional: a turn score in its reply
      temperature: 0.7
      max_tokens: 128
```

``system_prompt`` is filled with the row's ``interaction_kwargs`` (plus ``end_marker``).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from typing import Any

from agentloop.interactions.base import Interaction
from servers.types import GenerateRequest, SamplingParams

__all__ = ["SimulatedUser", "UserModel"]

DEFAULT_PROMPT = (
    "You are role-playing a user who talks to an AI assistant. Your goal: {goal}. Answer the "
    "assistant's last message in one or two sentences, as that user would. When your goal is "
    "met, reply with exactly {end_marker}."
)


@dataclass(slots=True)
class UserModel:
    """The simulated user's model: a generate client over its server group and its
    tokenizer (built by each agent-loop worker from ``multi_turn.user_model``)."""

    client: Any
    tokenizer: Any
    max_model_len: int

    async def reply(
        self, messages: list[dict[str, Any]], sampling: dict[str, Any], template_kwargs: dict
    ) -> str:
        ids = await asyncio.to_thread(
            self.tokenizer.apply_chat_template,
            messages,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **template_kwargs,
        )
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(
                f"the simulated user's conversation is {len(ids)} tokens, at or over "
                f"multi_turn.user_model.max_model_len={self.max_model_len}"
            )
        params = {**sampling, "max_tokens": min(int(sampling["max_tokens"]), room)}
        request = GenerateRequest(
            prompt_ids=list(ids),
            sampling_params=SamplingParams.from_dict(params),
            session_id=f"user-{uuid.uuid4().hex}",
        )
        out = await self.client.generate(request)
        return await asyncio.to_thread(
            self.tokenizer.decode, out.token_ids, skip_special_tokens=True
        )


class SimulatedUser(Interaction):
    """A model-backed user (see the module doc)."""

    needs_user_model = True
    """Start-up refuses it without ``multi_turn.user_model.model_path``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.system_prompt = str(config.get("system_prompt", DEFAULT_PROMPT))
        self.end_marker = str(config.get("end_marker", "[DONE]"))
        pattern = config.get("score_pattern")
        self.score_pattern = re.compile(pattern) if pattern else None
        self.sampling = {
            "temperature": float(config.get("temperature", 0.7)),
            "top_p": float(config.get("top_p", 1.0)),
            "max_tokens": int(config.get("max_tokens", 128)),
            "logprobs": False,
        }
        self.template_kwargs = dict(config.get("chat_template_kwargs", {"enable_thinking": False}))
        self.model: UserModel | None = None
        self._prompts: dict[str, str] = {}

    def setup(self, user_model: UserModel | None) -> None:
        """Called by the agent-loop worker once, with the user model's client."""
        if user_model is None:
            raise ValueError(
                f"interaction {self.name!r} (SimulatedUser) needs a model: set "
                "actor_rollout_ref.rollout.multi_turn.user_model.model_path"
            )
        self.model = user_model

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        fields = {"goal": "", **kwargs, "end_marker": self.end_marker}
        try:
            self._prompts[instance_id] = self.system_prompt.format(**fields)
        except KeyError as exc:
            raise ValueError(
                f"system_prompt names {{{exc.args[0]}}}, which the row's interaction_kwargs "
                f"lack (it has: {', '.join(sorted(kwargs))})"
            ) from None
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        assert self.model is not None, "setup() was not called"
        swapped = [{"role": "system", "content": self._prompts[instance_id]}]
        for message in messages:
            role = {"user": "assistant", "assistant": "user"}.get(message.get("role", ""))
            if role is not None and message.get("content"):
                swapped.append({"role": role, "content": str(message["content"])})
        text = (await self.model.reply(swapped, self.sampling, self.template_kwargs)).strip()
        score = None
        if self.score_pattern is not None:
            found = self.score_pattern.findall(text)
            score = float(found[-1]) if found else None
            text = self.score_pattern.sub("", text).strip()
        done = self.end_marker in text
        return done, text.replace(self.end_marker, "").strip() or self.end_marker, score, {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._prompts.pop(instance_id, None)

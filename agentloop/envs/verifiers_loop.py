"""``verifiers``: a dataset row rolled out by a verifiers environment, unchanged.

The environment runs its own rollout (its tools, its multi-turn replies, its turn limit) in its
own interpreter (``agentloop.envs.verifiers_env``: one long-lived runner per worker, the
environment loaded once) against the sample's session gateway OpenAI endpoint: every model call
is a gateway call, token-exact and segmented as for any gateway agent. Its rubric scores the
rollout there; the sample's reward is the rubric's weighted sum, each named reward function's
score is kept (``SampleRecord.reward_parts``, logged as ``reward/env/<name>``) and the
environment's state numbers (turns, tool calls) become the sample's ``env/<key>`` metrics and
trace attributes.

Which environment: an agent-loop entry ::

    - {name: calc, _target_: agentloop.envs.VerifiersAgentLoop,
       verifiers: {env_id: vf-calc, env_args: {max_turns: 4}}}

or the row's own ``verifiers`` field (``{env_id, env_args, example}``, as the rows
``data.env_dataset`` makes from the environment's dataset carry it) with ``agent_name:
verifiers``. The example the environment scores against is the row's ``verifiers.example``
(or its ``verifiers`` mapping itself, when it names no env), else the row's ``raw_prompt``,
``reward_model.ground_truth`` (its answer) and ``extra_info``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentloop.base import AgentLoopContext, AgentLoopOutput, register
from agentloop.envs.verifiers_env import (
    VerifiersResult,
    VerifiersRunner,
    VerifiersSpec,
    check_installed,
)
from agentloop.gateway.command import session_log_dir
from agentloop.gateway.endpoint import AgentFailed, LLMEndpoint
from agentloop.gateway.loop import GatewayAgentLoop
from agentloop.gateway.server import Gateway
from agentloop.gateway.session import Session

__all__ = ["VerifiersAgentLoop", "example_of"]


def example_of(row: dict[str, Any]) -> dict[str, Any]:
    """The environment's example of a row: its ``verifiers.example``, else built from the
    row's prompt, ground truth and extra info."""
    given = row.get("verifiers")
    if isinstance(given, dict):
        if isinstance(given.get("example"), dict):
            return dict(given["example"])
        if "env_id" not in given:  # the environment's own row, as its dataset gave it
            return dict(given)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    return {
        "prompt": row.get("raw_prompt") or [],
        "answer": (row.get("reward_model") or {}).get("ground_truth") or "",
        "info": extra,
        "task": row.get("data_source") or "default",
        "example_id": row.get("index", 0),
    }


@register("verifiers")
class VerifiersAgentLoop(GatewayAgentLoop):
    sets_reward = True  # the environment's rubric

    def __init__(
        self,
        context: AgentLoopContext,
        *,
        verifiers: str | dict[str, Any] | None = None,
    ) -> None:
        self.spec = None if verifiers is None else VerifiersSpec.of(verifiers, "verifiers loop")
        # a command agent to the gateway: the worker's runner process (``_run_agent``)
        super().__init__(context, command=["verifiers_runner.py", "serve"])
        self.result: VerifiersResult | None = None

    @classmethod
    def check_config(cls, **kwargs: Any) -> None:
        if "verifiers" in kwargs:
            if kwargs["verifiers"] is not None:
                VerifiersSpec.of(kwargs["verifiers"], "verifiers loop")
            return
        super().check_config(**kwargs)

    @classmethod
    def probe(cls, **kwargs: Any) -> None:
        """Start-up: the entry's environment is installed where it runs (the error names the
        id and the install command)."""
        if kwargs.get("verifiers") is not None:
            check_installed(VerifiersSpec.of(kwargs["verifiers"], "verifiers loop"))

    def spec_of(self, row: dict[str, Any]) -> VerifiersSpec:
        given = row.get("verifiers")
        if isinstance(given, dict) and "env_id" in given:
            return VerifiersSpec.of(given, f"row {row.get('index')}")
        if self.spec is None:
            raise AgentFailed(
                "the verifiers loop has no environment: give its agent-loop entry "
                "verifiers: <env id>, or the row a verifiers: {env_id: ...} field"
            )
        return self.spec

    async def _run_agent(
        self, gateway: Gateway, session: Session, llm: LLMEndpoint, row: dict[str, Any]
    ) -> Any:
        spec = self.spec_of(row)
        key = VerifiersRunner.key(spec)
        runner = self.context.resources.get(key)
        if runner is None:
            runner = self.context.resources[key] = VerifiersRunner(spec)
        row = {**row, "verifiers": {**spec.as_row_field(), "example": example_of(row)}}
        start = time.perf_counter()
        try:
            data = await runner.rollout(spec, row, llm.base_url, llm.api_key, llm.model)
        except (RuntimeError, ValueError) as exc:
            raise AgentFailed(f"verifiers environment {spec.env_id!r}: {exc}") from exc
        finally:
            self.metrics["env_s"] = time.perf_counter() - start
        folder = session_log_dir(self.config.gateway, llm.session_id)
        (folder / "verifiers_result.json").write_text(json.dumps(data))  # as the runner said
        self.result = VerifiersResult.of(data)
        return {"reward": self.result.reward}

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        out = await super().run(sampling_params, **row)
        result = self.result
        if result is None:  # the environment failed: the sample failed with its error
            return out
        for sample in (out, *out.segments):
            sample.record.reward_parts = dict(result.scores)
            sample.metrics.update({f"env/{k}": v for k, v in result.state.items()})
        if self.trace is not None:
            self.trace.environment(
                f"verifiers:{self.spec_of(row).env_id}",
                {"reward": result.reward, "scores": result.scores, "weights": result.weights},
                result.state,
            )
        return out

"""A user agent loop loaded by dotted path in the registry tests."""

from __future__ import annotations

from agentloop import AgentLoopBase, AgentLoopOutput
from agentloop.tokens import Trajectory


class EchoPromptLoop(AgentLoopBase):
    """Returns the prompt's last token as its 'response'; records its YAML kwargs."""

    def __init__(self, context, **kwargs) -> None:
        super().__init__(context, **kwargs)
        self.kwargs = kwargs

    async def run(self, sampling_params, *, raw_prompt, **row) -> AgentLoopOutput:
        prompt = await self.encode_prompt(raw_prompt)
        traj = Trajectory(prompt, self.config.response_length)
        traj.add_sampled(prompt[-1:], [-0.5])
        return self.output(traj, num_turns=2, kwargs=self.kwargs, row_keys=sorted(row))


class NotALoop:
    pass

"""A GSM8K user written against verl's interaction API (``verl.interactions.base``; verl is
not installed): it checks the model's last answer against the row's ground truth, says so,
scores the turn 1 or 0 and ends the episode on a right answer."""

import re
import uuid


class Gsm8kInteraction:
    def __init__(self, config: dict):
        self.config = config
        self.name = config.get("name", "interaction_agent")
        self._answers: dict[str, dict] = {}

    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._answers[instance_id] = {"truth": str(ground_truth), "last": ""}
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        said = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
        self._answers[instance_id]["last"] = said[-1] if said else ""
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        return False, "Your response is incorrect! Reflect on it and try again.", score, {}

    async def calculate_score(self, instance_id, **kwargs) -> float:
        state = self._answers[instance_id]
        found = re.findall(r"####\s*(-?[0-9.,]+)", state["last"])
        return 1.0 if found and found[-1].replace(",", "") == state["truth"] else 0.0

    async def finalize_interaction(self, instance_id, **kwargs) -> None:
        del self._answers[instance_id]

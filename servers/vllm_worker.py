"""Methods added to every vLLM worker (``worker_extension_cls``), called by collective_rpc.

Kept free of module-level vLLM imports: the engine imports this file inside its workers.
"""

from __future__ import annotations

import logging

from servers.weights import StagedBucket, iter_buckets

__all__ = ["WeightLoaderExtension"]

logger = logging.getLogger(__name__)


class WeightLoaderExtension:
    """Loads staged weight buckets into the running model in place."""

    def agentloop_load_staged(self, buckets: list[dict]) -> int:
        """Reload the model from shared-memory buckets; returns the number of tensors."""
        count = 0
        hf_config = self.model_runner.model_config.hf_config
        tied = bool(getattr(hf_config.get_text_config(), "tie_word_embeddings", False))

        def counted():
            nonlocal count
            for name, tensor in iter_buckets(StagedBucket.from_wire(b) for b in buckets):
                count += 1
                if not tied:
                    yield name, tensor
                    continue
                # Tied embeddings: the in-place reload leaves vLLM's lm_head as its own
                # parameter, so it must receive the embedding too, whether or not the sender
                # included an lm_head.weight (the embedding is the source of truth).
                if name == "lm_head.weight":
                    continue
                yield name, tensor
                if name.endswith("embed_tokens.weight"):
                    yield "lm_head.weight", tensor

        # In-place reload handles checkpoint-format names (fused qkv/gate_up, CPU repacking).
        self.model_runner.reload_weights(weights_iterator=counted())
        return count

    def agentloop_weight_checksum(self, name: str) -> float:
        """Sum of one parameter (tests use it to see that an update landed)."""
        params = dict(self.model_runner.get_model().named_parameters())
        return float(params[name].float().sum())

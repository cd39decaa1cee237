"""``agentloop-sft``: multi-turn supervised fine-tuning on chat conversations with tool calls,
the warm start of small models before RL::

    agentloop-sft data.train_files=data/sft.jsonl model.path=smollm2-135m-instruct \\
        data.train_batch_size=16 optim.lr=1e-5 trainer.total_epochs=2

Each row's conversation becomes the token trajectory RL would produce for it
(``trainer.sft.data``); the loss is the token-mean NLL of the assistant tokens
(``trainer.workers.sft_step``), one optimizer step per ``data.train_batch_size`` conversations,
on the same FSDP2 workers as RL. Checkpoints use the RL layout
(``global_step_N/actor/{dcp,huggingface}``); the last step is always saved and its
``huggingface`` folder, printed as the last line on stdout, is the
``actor_rollout_ref.model.path`` of the RL run (with ``model.lora_rank=N`` only a LoRA adapter
trains: the printed folder is ``huggingface_merged``, the model with it merged, and
``huggingface`` is the adapter). ``trainer.resume_mode=auto`` continues from the newest
checkpoint (optimizer step and data position).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from trainer.cli.common import run_command

if TYPE_CHECKING:
    from trainer.config.sft import SFTConfig
    from trainer.sft.loop import SFTSetup

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    return run_command("agentloop-sft", __doc__, argv, _start, _train)


def _start(overrides: list[str]) -> tuple[SFTConfig, SFTSetup]:
    """Every start-up check; no worker is running yet."""
    from trainer.config.sft import load_sft_config
    from trainer.sft.loop import prepare

    cfg = load_sft_config(overrides)
    return cfg, prepare(cfg)


def _train(started: tuple[SFTConfig, SFTSetup]) -> int:
    from trainer.sft.loop import train

    hf_dir = train(*started)
    sys.stdout.write(f"{hf_dir}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

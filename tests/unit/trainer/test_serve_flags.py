"""``agentloop-serve``'s flags are generated from ``ServerConfig``: one per field, its help the
field's docstring, its value in the config the command serves; and the generator itself
(``trainer.cli.flags``) on small dataclasses."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, fields
from typing import Literal

import pytest

from servers import ServerConfig
from servers.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from trainer.cli import serve as serve_cli
from trainer.cli.flags import add_dataclass_flags, flag_name, flag_values
from trainer.config.field_docs import field_docs


def actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in serve_cli.build_parser()._actions}


def serve(monkeypatch, *argv: str) -> ServerConfig:
    """The ``ServerConfig`` that ``agentloop-serve argv`` would serve (the engine start is a
    stand-in)."""
    served: list[ServerConfig] = []

    async def fake_serve(config):
        served.append(config)

    monkeypatch.setattr(serve_cli, "_serve", fake_serve)
    monkeypatch.delenv("AGENTLOOP_API_KEY", raising=False)
    assert serve_cli.main(list(argv)) == 0
    (config,) = served
    return config


def test_every_server_config_field_is_a_flag_whose_help_is_its_docstring():
    docs, by_dest = field_docs(ServerConfig), actions()
    assert docs["port"] == "HTTP port; 0 picks a free one."
    for f in fields(ServerConfig):
        if f.name in serve_cli.NOT_FLAGS:
            assert f.name not in by_dest, f.name
            continue
        action = by_dest[f.name]
        assert action.option_strings[0] == flag_name(f.name)
        if f.name in serve_cli.RESOLVED:
            continue  # takes a name or file: its own help
        help_text = action.help.replace("%%", "%")
        assert help_text in (docs[f.name], docs[f.name] + " (default: %(default)s)"), f.name


def test_the_flags_default_to_the_config_fields_but_port_8000(monkeypatch, tmp_path):
    served = serve(monkeypatch, "--model", str(tmp_path))
    expected = ServerConfig(model=str(tmp_path), port=8000)
    for f in fields(ServerConfig):
        assert getattr(served, f.name) == getattr(expected, f.name), f.name


def adapter(tmp_path) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / ADAPTER_CONFIG).write_text(json.dumps({"r": 8}))
    (folder / ADAPTER_WEIGHTS).write_bytes(b"")
    return str(folder)


# field -> (its flag's arguments, the value the config gets); other flags a value needs after
CASES = {
    "trust_remote_code": (["--trust-remote-code"], True),
    "external_lib": (["json"], "json"),
    "backend": (["sglang"], "sglang"),
    "dtype": (["bfloat16"], "bfloat16"),
    "tensor_parallel_size": (["2"], 2),
    "gpu_memory_utilization": (["0.9"], 0.9),
    "max_model_len": (["512"], 512),
    "enforce_eager": (["--no-enforce-eager"], False),
    "enable_prefix_caching": (["--no-enable-prefix-caching"], False),
    "cpu_kvcache_space_gib": (["4"], 4),
    "cpu_cores": ([str(min(os.sched_getaffinity(0)))], str(min(os.sched_getaffinity(0)))),
    "scheduling_policy": (["fcfs"], "fcfs"),
    "max_num_seqs": (["16"], 16),
    "max_num_batched_tokens": (["4096"], 4096),
    "enable_chunked_prefill": (["--enable-chunked-prefill"], True),
    "engine_kwargs": (['{"max_logprobs": 5}'], {"max_logprobs": 5}),
    "logprobs_mode": (["raw_logprobs"], "raw_logprobs"),
    "seed": (["7"], 7),
    "lora_rank": (["8"], 8),
    "max_loras": (["3"], 3),
    "lora_adapter_path": (["ADAPTER", "--lora-rank", "8"], "ADAPTER"),
    "served_model_name": (["m"], "m"),
    "tool_parser": (["qwen3_coder"], "qwen3_coder"),
    "host": (["0.0.0.0"], "0.0.0.0"),
    "port": (["0"], 0),
    "api_key": (["k"], "k"),
    "max_concurrent_requests": (["8"], 8),
    "max_n": (["4"], 4),
    "max_tokens_per_request": (["100"], 100),
    "max_prompt_tokens": (["50"], 50),
}


def test_every_generated_flag_has_a_case():
    generated = {f.name for f in fields(ServerConfig)} - {
        *serve_cli.RESOLVED,
        *serve_cli.NOT_FLAGS,
    }
    assert set(CASES) == generated


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_flag_value_reaches_the_config(monkeypatch, tmp_path, name):
    args, expected = CASES[name]
    if name == "lora_adapter_path":
        path = adapter(tmp_path)
        args, expected = [path, *args[1:]], path
    if not args[0].startswith("--"):
        args = [flag_name(name), *args]
    served = serve(monkeypatch, "--model", str(tmp_path), *args)
    assert getattr(served, name) == expected
    assert actions()[name].default != expected  # the flag changed it


def test_engine_kwargs_must_be_a_json_object(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(serve_cli, "_serve", None)  # never reached
    with pytest.raises(SystemExit) as exit_info:
        serve_cli.main(["--model", str(tmp_path), "--engine-kwargs", "[1]"])
    assert exit_info.value.code == 2
    assert "argument --engine-kwargs: must be a JSON object {...}, got '[1]'" in (
        capsys.readouterr().err
    )


@dataclass(kw_only=True)
class Base:
    name: str
    """Required: a flag that must be given."""


@dataclass(kw_only=True)
class Small(Base):
    mode: Literal["a", "b"] = "a"
    """Which mode (100% a by default)."""
    tags: dict[str, int] = field(default_factory=dict)
    """Built by the dataclass when absent."""
    limit: float | None = None
    """A float or nothing."""


def test_generated_flags_of_a_small_dataclass():
    parser = argparse.ArgumentParser()
    assert add_dataclass_flags(parser, Small) == ["name", "mode", "tags", "limit"]
    args = parser.parse_args(["--name", "x", "--limit", "0.5"])
    assert flag_values(args, Small) == {"name": "x", "mode": "a", "limit": 0.5}
    assert Small(**flag_values(args, Small)).tags == {}  # the factory's value
    assert "Which mode (100% a by default). (default: a)" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        parser.parse_args(["--limit", "1"])  # --name is required
    with pytest.raises(SystemExit):
        parser.parse_args(["--name", "x", "--mode", "c"])  # not a choice


@dataclass
class Bare:
    x: int = 0


def test_a_field_without_a_docstring_or_an_unknown_default_is_refused():
    with pytest.raises(TypeError, match=r"Bare.x has no docstring"):
        add_dataclass_flags(argparse.ArgumentParser(), Bare)
    with pytest.raises(TypeError, match=r"defaults for no flag of Small: \['nope'\]"):
        add_dataclass_flags(argparse.ArgumentParser(), Small, defaults={"nope": 1})

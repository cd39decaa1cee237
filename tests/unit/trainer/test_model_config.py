"""``actor_rollout_ref.model``'s verl keys beyond ``path``: ``tokenizer_path``,
``custom_chat_template``, ``trust_remote_code`` and ``external_lib`` reach every place that
loads the model or tokenizer or renders a chat (start-up, agent loops, servers, trainer ranks,
SFT, checkpoint export), and each bad value is a start-up error saying what to change."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers.dynamic_module_utils
from transformers import AutoTokenizer

import agentloop
import servers
import trainer.launch.rollout
from agentloop import AgentLoopWorker, RolloutConfig, TokenizerSource
from servers.config import EngineConfig
from tests.hf_cache import add_to_hf_cache, use_hf_cache
from tests.unit.agentloop.scripted import ScriptedServer
from trainer.config import load_config
from trainer.config.actor import ModelConfig
from trainer.config.schema import ActorRolloutRefConfig, Config
from trainer.config.sft import load_sft_config
from trainer.launch.rollout import prepare_rollout, start_rollout
from trainer.models import resolve_model_config, tokenizer_source
from trainer.sft.loop import prepare as prepare_sft
from trainer.workers.fsdp import load_model
from trainer.workers.fsdp_worker import write_model_files

PREFIX = "actor_rollout_ref.model"
USER = [{"role": "user", "content": "What is 2 + 3?"}]
# A ChatML template that marks every message, so prompts rendered with it differ from Qwen's.
CUSTOM = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n[custom] {{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def copy_model(source: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "agentloop-asset.json":
            shutil.copy(item, dest / item.name)
    return dest


def edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def config_with(**model: Any) -> Config:
    return Config(actor_rollout_ref=ActorRolloutRefConfig(model=ModelConfig(**model)))


# ---- defaults and resolution ------------------------------------------------------------------


def test_the_new_keys_default_to_verl_s_behaviour():
    model = ModelConfig(path="tiny-qwen3")
    assert (model.tokenizer_path, model.custom_chat_template, model.external_lib) == (None,) * 3
    assert model.trust_remote_code is False


def test_resolution_gives_folders_and_template_text_once(tiny_qwen3_path, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(CUSTOM)
    model = ModelConfig(path="tiny-qwen3", custom_chat_template=str(template))
    resolved = resolve_model_config(model, PREFIX)
    assert resolved.path == resolved.tokenizer_path == str(tiny_qwen3_path)
    assert resolved.custom_chat_template == CUSTOM  # a file's path is read once, here
    assert model.path == "tiny-qwen3"  # the configured one is left as written
    assert resolve_model_config(resolved, PREFIX) == resolved


def test_every_key_is_set_from_the_command_line(tmp_path):
    cfg, _ = load_config(
        [
            "actor_rollout_ref.model.path=Qwen/Qwen3-0.6B",
            "actor_rollout_ref.model.tokenizer_path=Qwen/Qwen3-0.6B",
            f'actor_rollout_ref.model.custom_chat_template="{CUSTOM}"',  # text: double-quoted
            "actor_rollout_ref.model.trust_remote_code=true",
            "actor_rollout_ref.model.external_lib=my_pkg.models",
        ]
    )
    model = cfg.actor_rollout_ref.model
    assert (model.path, model.tokenizer_path, model.custom_chat_template) == (
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-0.6B",
        CUSTOM,
    )
    assert model.trust_remote_code is True and model.external_lib == "my_pkg.models"


def test_tokenizer_path_may_be_a_hub_id_of_a_tokenizer_only_snapshot(
    tiny_qwen3_path, tmp_path, monkeypatch
):
    source = copy_model(tiny_qwen3_path, tmp_path / "tok")
    (source / "chat_template.jinja").write_text(CUSTOM)
    add_to_hf_cache(tmp_path / "hf", "Org/Tok", source, files=TOKENIZER_FILES)
    use_hf_cache(monkeypatch, tmp_path / "hf")
    resolved = resolve_model_config(
        ModelConfig(path="tiny-qwen3", tokenizer_path="Org/Tok"), PREFIX
    )
    assert resolved.path == str(tiny_qwen3_path)
    assert "models--Org--Tok/snapshots/" in resolved.tokenizer_path
    assert tokenizer_source(resolved).load().chat_template == CUSTOM


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"tokenizer_path": "/nowhere/tok"},
            f"{PREFIX}.tokenizer_path '/nowhere/tok' is neither a model folder nor a known asset "
            "name (smollm2-135m-instruct, tiny-qwen3, tiny-qwen3-long) nor a Hugging Face hub "
            "id (org/name)",
        ),
        (
            {"custom_chat_template": "chat.jinja"},
            f"{PREFIX}.custom_chat_template='chat.jinja' is neither a Jinja chat template (it has "
            "no '{{' or '{%') nor an existing template file: give the template text or a .jinja "
            "file's path",
        ),
        (
            {"custom_chat_template": "{% for m in messages %}{{ m['content'] }}"},
            f"{PREFIX}.custom_chat_template is not a valid Jinja template (line 1: Unexpected end "
            "of template. Jinja was looking for the following tags: 'endfor' or 'else'. The "
            "innermost block that needs to be closed is 'for'.): fix it",
        ),
        (
            {"external_lib": "agentloop_no_such_module"},
            f"{PREFIX}.external_lib='agentloop_no_such_module': cannot import module "
            "'agentloop_no_such_module' (ModuleNotFoundError: No module named "
            "'agentloop_no_such_module'); install the package that provides "
            "'agentloop_no_such_module', put its folder on PYTHONPATH, or correct the name",
        ),
    ],
)
def test_bad_model_keys_are_start_up_errors_naming_the_key(model, message):
    with pytest.raises(ValueError) as info:
        resolve_model_config(ModelConfig(path="tiny-qwen3", **model), PREFIX)
    assert str(info.value) == message


def test_a_bad_key_stops_agentloop_train_before_anything_starts(capsys, tmp_path):
    from trainer.cli.train import main

    code = main(
        [
            "actor_rollout_ref.model.path=tiny-qwen3",
            "actor_rollout_ref.model.external_lib=agentloop_no_such_module",
            "actor_rollout_ref.rollout.n=2",
            f"data.train_files={tmp_path / 'train.jsonl'}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err.startswith(
        "agentloop-train: error: actor_rollout_ref.model.external_lib='agentloop_no_such_module': "
        "cannot import module 'agentloop_no_such_module'"
    )


# ---- custom_chat_template is what renders every chat -------------------------------------------


@pytest.mark.slow
async def test_custom_chat_template_changes_the_agent_loop_prompt_ids(tiny_qwen3_path):
    setup = prepare_rollout(config_with(path="tiny-qwen3", custom_chat_template=CUSTOM))
    plain = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    expected = plain.apply_chat_template(
        USER, chat_template=CUSTOM, add_generation_prompt=True, return_dict=False
    )
    default = plain.apply_chat_template(USER, add_generation_prompt=True, return_dict=False)
    assert expected != default
    # The worker loads the tokenizer from the source the manager hands every worker.
    source = tokenizer_source(setup.model)
    worker = AgentLoopWorker(RolloutConfig(), ScriptedServer(plain, ["5"]), source)
    (out,) = await worker.generate_sequences([{"raw_prompt": USER, "uid": "u"}])
    assert out.prompt_ids == expected
    assert setup.tokenizer.chat_template == CUSTOM  # data filtering and rewards use this one


@pytest.mark.slow
def test_custom_chat_template_renders_sft_conversations(tiny_qwen3_path, tmp_path):
    data = tmp_path / "sft.jsonl"
    conversation = [*USER, {"role": "assistant", "content": "5."}]
    data.write_text("\n".join(json.dumps({"messages": conversation}) for _ in range(2)) + "\n")
    base = [
        "model.path=tiny-qwen3",
        f"data.train_files={data}",
        "data.train_batch_size=2",
        "data.micro_batch_size_per_gpu=1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "trainer.device=cpu",
    ]
    template = tmp_path / "chat.jinja"
    template.write_text(CUSTOM)
    plain = prepare_sft(load_sft_config(base))
    custom = prepare_sft(load_sft_config([*base, f"model.custom_chat_template={template}"]))
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    assert custom.model.custom_chat_template == CUSTOM
    assert custom.train[0].prompt_ids == tokenizer.apply_chat_template(
        USER, chat_template=CUSTOM, add_generation_prompt=True, return_dict=False
    )
    assert custom.train[0].prompt_ids != plain.train[0].prompt_ids


# ---- every consumer gets the resolved model ------------------------------------------------------


def test_start_rollout_hands_servers_and_agent_loops_the_resolved_model(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}

    class Group:
        def __init__(self, config, num_servers, **kwargs) -> None:
            seen["server"] = config
            self.handles = ["server-0"]

    def manager(rollout, group, tokenizer, **users):
        seen["tokenizer"] = tokenizer
        return "manager"

    monkeypatch.setattr(servers, "ServerGroup", Group)
    monkeypatch.setattr(agentloop, "AgentLoopManager", manager)
    monkeypatch.setattr(trainer.launch.rollout, "init_ray", lambda: None)
    model = ModelConfig(
        path="/snap/model",
        tokenizer_path="/snap/tok",
        custom_chat_template=CUSTOM,
        trust_remote_code=True,
    )
    assert start_rollout(RolloutConfig(), model, num_servers=1) == (["server-0"], "manager")
    server = seen["server"]
    assert (server.model, server.tokenizer, server.trust_remote_code, server.chat_template) == (
        "/snap/model",
        "/snap/tok",
        True,
        CUSTOM,
    )
    assert seen["tokenizer"] == TokenizerSource(
        path="/snap/tok", trust_remote_code=True, chat_template=CUSTOM
    )


def test_servers_run_with_lora_only_for_a_lora_actor_on_vllm_with_adapter_sync(monkeypatch):
    """vLLM servers start with LoRA at the actor's rank; with ``lora_sync=merged`` (training
    passes ``lora=False``) or SGLang they start without and are sent merged weights."""
    seen: list[Any] = []

    class Group:
        def __init__(self, config, num_servers, **kwargs) -> None:
            seen.append(config)
            self.handles = ["server-0"]

    monkeypatch.setattr(servers, "ServerGroup", Group)
    monkeypatch.setattr(
        agentloop, "AgentLoopManager", lambda rollout, group, tokenizer, **users: None
    )
    monkeypatch.setattr(trainer.launch.rollout, "init_ray", lambda: None)
    model = ModelConfig(path="/snap/model", lora_rank=8)
    start_rollout(RolloutConfig(), model, num_servers=1)
    start_rollout(RolloutConfig(), model, num_servers=1, lora=False)
    start_rollout(RolloutConfig(engine=EngineConfig(backend="sglang")), model, num_servers=1)
    start_rollout(RolloutConfig(), ModelConfig(path="/snap/model"), num_servers=1)
    assert [c.lora_rank for c in seen] == [8, 0, 0, 0]
    with pytest.raises(ValueError, match=r"lora_sync='both': use adapter .* or merged"):
        RolloutConfig(lora_sync="both")


def test_start_rollout_hands_the_engine_node_to_the_servers_as_it_is(monkeypatch):
    """Every ``rollout.engine`` field reaches the ServerConfig unchanged; ``max_model_len``
    unset is derived once, from the rollout's lengths (``context_length``)."""
    seen: list[Any] = []

    class Group:
        def __init__(self, config, num_servers, **kwargs) -> None:
            seen.append((config, kwargs))
            self.handles = ["server-0"]

    monkeypatch.setattr(servers, "ServerGroup", Group)
    monkeypatch.setattr(
        agentloop, "AgentLoopManager", lambda rollout, group, tokenizer, **users: None
    )
    monkeypatch.setattr(trainer.launch.rollout, "init_ray", lambda: None)
    engine = EngineConfig(tensor_parallel_size=2, max_num_seqs=4, enforce_eager=True)
    rollout = RolloutConfig(prompt_length=100, response_length=28, engine=engine)
    start_rollout(rollout, ModelConfig(path="/snap/model"), 0.5, num_servers=1)
    config, kwargs = seen[0]
    assert (config.tensor_parallel_size, config.max_num_seqs, config.enforce_eager) == (2, 4, True)
    assert config.max_model_len == rollout.context_length == 128
    assert kwargs["num_gpus"] == 1.0  # 0.5 of a GPU per tensor-parallel rank, 2 ranks


def test_export_carries_the_run_s_tokenizer_and_template(tiny_qwen3_path, tmp_path):
    tok = copy_model(tiny_qwen3_path, tmp_path / "tok")
    edit_json(tok / "tokenizer_config.json", model_max_length=4321)
    out = tmp_path / "export"
    out.mkdir()
    model = ModelConfig(
        path=str(tiny_qwen3_path), tokenizer_path=str(tok), custom_chat_template=CUSTOM
    )
    write_model_files(str(tiny_qwen3_path), model, out)
    exported = AutoTokenizer.from_pretrained(out)
    assert exported.chat_template == CUSTOM and exported.model_max_length == 4321
    assert (out / "generation_config.json").is_file()  # the model folder's own files
    assert json.loads((out / "agentloop_export.json").read_text()) == {
        "source": str(tiny_qwen3_path),
        "tokenizer": str(tok),
    }


# ---- trust_remote_code and external_lib ----------------------------------------------------------

REMOTE_CODE = """
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM


class TinyRemoteConfig(Qwen3Config):
    model_type = "agentloop-tiny-remote"


class TinyRemoteForCausalLM(Qwen3ForCausalLM):
    config_class = TinyRemoteConfig


class TinyRemoteTokenizer(PreTrainedTokenizerFast):
    pass
"""

EXTERNAL_LIB = """
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM


class ExtLibConfig(Qwen3Config):
    model_type = "agentloop-extlib-test"


class ExtLibForCausalLM(Qwen3ForCausalLM):
    config_class = ExtLibConfig


AutoConfig.register("agentloop-extlib-test", ExtLibConfig)
AutoModelForCausalLM.register(ExtLibConfig, ExtLibForCausalLM)
"""


def test_trust_remote_code_reaches_the_model_and_tokenizer_loads(
    tiny_qwen3_path, tmp_path, monkeypatch
):
    monkeypatch.setattr(
        transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules")
    )
    folder = copy_model(tiny_qwen3_path, tmp_path / "remote")
    (folder / "modeling_tinyremote.py").write_text(REMOTE_CODE)
    edit_json(
        folder / "config.json",
        model_type="agentloop-tiny-remote",
        architectures=["TinyRemoteForCausalLM"],
        auto_map={
            "AutoConfig": "modeling_tinyremote.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tinyremote.TinyRemoteForCausalLM",
        },
    )
    edit_json(
        folder / "tokenizer_config.json",
        tokenizer_class="TinyRemoteTokenizer",
        auto_map={"AutoTokenizer": [None, "modeling_tinyremote.TinyRemoteTokenizer"]},
    )
    refused = ModelConfig(path=str(folder))
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        load_model(str(folder), refused, "cpu")
    with pytest.raises(ValueError, match="contains custom code which must be executed"):
        tokenizer_source(resolve_model_config(refused, PREFIX)).load()
    trusted = resolve_model_config(ModelConfig(path=str(folder), trust_remote_code=True), PREFIX)
    assert type(load_model(str(folder), trusted, "cpu")).__name__ == "TinyRemoteForCausalLM"
    assert type(tokenizer_source(trusted).load()).__name__ == "TinyRemoteTokenizer"


def test_external_lib_registers_an_architecture_before_the_model_loads(
    tiny_qwen3_path, tmp_path, monkeypatch
):
    folder = copy_model(tiny_qwen3_path, tmp_path / "extlib-model")
    edit_json(
        folder / "config.json",
        model_type="agentloop-extlib-test",
        architectures=["ExtLibForCausalLM"],
    )
    (tmp_path / "agentloop_extlib_test.py").write_text(EXTERNAL_LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "agentloop_extlib_test", raising=False)
    with pytest.raises(ValueError, match="agentloop-extlib-test"):
        load_model(str(folder), ModelConfig(path=str(folder)), "cpu")  # not registered yet
    model = ModelConfig(path=str(folder), external_lib="agentloop_extlib_test")
    assert type(load_model(str(folder), model, "cpu")).__name__ == "ExtLibForCausalLM"
    assert resolve_model_config(model, PREFIX).path == str(folder)  # driver imports it too

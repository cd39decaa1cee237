"""The SGLang adapter against a stand-in engine returning SGLang's documented output format
(SGLang cannot run on the CPU machines; the real engine is covered by a gpu-marked test)."""

from __future__ import annotations

import pytest

from servers import GenerateRequest, SamplingParams, ServerConfig, ServerCore
from servers.sglang import SGLangEngine, engine_args, from_sglang_output, to_sglang_sampling


class StandInTokenizerManager:
    def __init__(self) -> None:
        self.model_config = type("MC", (), {"vocab_size": 1000})()
        self.context_len = 64
        self.aborted: list[str] = []
        self.flushed = 0

    def abort_request(self, rid: str) -> None:
        self.aborted.append(rid)

    async def flush_cache(self) -> None:
        self.flushed += 1


class StandInEngine:
    """``async_generate`` answers like ``sglang.Engine`` with ``skip_tokenizer_init=True``."""

    def __init__(self) -> None:
        self.tokenizer_manager = StandInTokenizerManager()
        self.calls: list[dict] = []

    async def async_generate(self, *, input_ids, sampling_params, return_logprob, rid):
        self.calls.append(
            dict(
                input_ids=input_ids,
                sampling_params=sampling_params,
                return_logprob=return_logprob,
                rid=rid,
            )
        )
        n = sampling_params["max_new_tokens"]
        ids = [(7 * i) % 1000 for i in range(n)]
        return {
            "output_ids": ids,
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": len(input_ids),
                "completion_tokens": n,
                "output_token_logprobs": [(-0.5 - i, t, None) for i, t in enumerate(ids)],
                "weight_version": "default",
            },
        }

    def shutdown(self) -> None:
        pass


def request(prompt_ids: list[int], params: dict, request_id: str) -> GenerateRequest:
    return GenerateRequest(
        prompt_ids=prompt_ids,
        sampling_params=SamplingParams.from_dict(params),
        request_id=request_id,
    )


@pytest.fixture
async def core():
    config = ServerConfig(model="/models/x", backend="sglang")
    server = ServerCore(config, engine=SGLangEngine(config, engine=StandInEngine()))
    await server.start()
    return server


@pytest.fixture
def adapter(core):
    return core.engine


def test_sampling_keys_are_translated_to_sglang_names():
    assert to_sglang_sampling(
        {
            "max_tokens": 5,
            "min_tokens": 1,
            "seed": 3,
            "temperature": 0.7,
            "top_k": 0,
            "stop_token_ids": [2],
            "logprobs": True,
        }
    ) == {
        "max_new_tokens": 5,
        "min_new_tokens": 1,
        "sampling_seed": 3,
        "temperature": 0.7,
        "top_k": -1,
        "stop_token_ids": [2],
    }


async def test_generate_returns_tokens_logprobs_and_finish_reason(core, adapter):
    out = await core.generate(request([1, 2, 3], {"max_tokens": 4, "temperature": 1.0}, "r1"))
    assert out.token_ids == [0, 7, 14, 21]
    assert out.log_probs == [-0.5, -1.5, -2.5, -3.5]
    assert out.finish_reason == "length"
    call = adapter.engine.calls[-1]
    assert call["input_ids"] == [1, 2, 3] and call["rid"] == "r1" and call["return_logprob"]


async def test_max_tokens_clamped_to_context_length(core, adapter):
    out = await core.generate(request([1] * 60, {"max_tokens": 100}, "r2"))
    assert len(out.token_ids) == 4
    assert adapter.engine.calls[-1]["sampling_params"]["max_new_tokens"] == 4


async def test_bad_input_is_rejected_before_reaching_sglang(core, adapter):
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 1000\)"):
        await core.generate(request([5000], {}, "r3"))
    assert adapter.engine.calls == []


async def test_abort_goes_to_the_tokenizer_manager(adapter):
    await adapter.abort("r9")
    assert adapter.engine.tokenizer_manager.aborted == ["r9"]


def test_abort_and_stop_finish_reasons_map():
    base = {"output_ids": [1], "meta_info": {"output_token_logprobs": [(-1.0, 1, None)]}}
    for sg, ours in [("stop", "stop"), ("length", "length"), ("abort", "abort")]:
        base["meta_info"]["finish_reason"] = {"type": sg}
        assert from_sglang_output(base).finish_reason == ours


def test_logprob_count_mismatch_is_an_error():
    bad = {
        "output_ids": [1, 2],
        "meta_info": {
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [(-1.0, 1, None)],
        },
    }
    with pytest.raises(RuntimeError, match="1 log-probs for 2 tokens"):
        from_sglang_output(bad)


def test_engine_settings_reach_sglangs_constructor_under_its_names(caplog):
    config = ServerConfig(
        model="/models/m",
        backend="sglang",
        enforce_eager=True,
        max_num_batched_tokens=512,
        engine_kwargs={"attention_backend": "fa3"},
    )
    with caplog.at_level("WARNING", logger="servers.sglang"):
        args = engine_args(config)
    assert args["disable_cuda_graph"] is True and args["attention_backend"] == "fa3"
    assert "max_num_batched_tokens" not in args
    assert [r.getMessage() for r in caplog.records] == [
        "max_num_batched_tokens is a vLLM setting and has no effect on SGLang: pass SGLang's "
        "own (chunked_prefill_size, max_prefill_tokens) in engine_kwargs"
    ]
    assert "disable_cuda_graph" not in engine_args(ServerConfig(model="m", backend="sglang"))

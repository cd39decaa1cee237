"""Generate-request validation: every bad input names the field to change."""

from __future__ import annotations

import pytest

from servers.types import GenerateInputError, validate_request


def check(prompt_ids, params, *, vocab=100, max_len=16):
    return validate_request(prompt_ids, params, vocab_size=vocab, max_model_len=max_len)


@pytest.mark.parametrize(
    "prompt_ids,params,message,param",
    [
        ([], {}, "prompt_ids is empty: send at least one token id", "prompt_ids"),
        (
            [1, 100],
            {},
            "prompt_ids contains token id 100 outside the vocabulary [0, 100)",
            "prompt_ids",
        ),
        ([-1], {}, "prompt_ids contains token id -1 outside the vocabulary [0, 100)", "prompt_ids"),
        ("hello", {}, "prompt_ids must be a list of integer token ids", "prompt_ids"),
        ([1.5], {}, "prompt_ids must be a list of integer token ids", "prompt_ids"),
        (
            [1] * 16,
            {},
            "prompt_ids has 16 tokens but the model length is 16: shorten the prompt "
            "to at most 15 tokens",
            "prompt_ids",
        ),
        (
            [1],
            {"temperature": -0.1},
            "sampling_params.temperature must be a number >= 0, got -0.1",
            "sampling_params.temperature",
        ),
        (
            [1],
            {"temperature": "hot"},
            "sampling_params.temperature must be a number >= 0, got str 'hot'",
            "sampling_params.temperature",
        ),
        (
            [1],
            {"temperature": float("nan")},
            "sampling_params.temperature must be a number >= 0, got nan",
            "sampling_params.temperature",
        ),
        (
            [1],
            {"max_tokens": 0},
            "sampling_params.max_tokens must be an integer >= 1, got 0",
            "sampling_params.max_tokens",
        ),
        (
            [1],
            {"max_tokens": True},
            "sampling_params.max_tokens must be an integer >= 1, got bool True",
            "sampling_params.max_tokens",
        ),
        (
            [1],
            {"top_p": 1.5},
            "sampling_params.top_p must be a number in (0, 1], got 1.5",
            "sampling_params.top_p",
        ),
        (
            [1],
            {"stop_token_ids": [5, 500]},
            "sampling_params.stop_token_ids contains token id 500 outside the vocabulary [0, 100)",
            "sampling_params.stop_token_ids",
        ),
        ([1], {"n": 2}, "unknown sampling_params key(s) n; supported:", "sampling_params.n"),
        (
            [1],
            {"logit_bias": {"7x": 1.0}},
            "sampling_params.logit_bias has key '7x', not a token id in [0, 100)",
            "sampling_params.logit_bias",
        ),
        (
            [1],
            {"logit_bias": {"7": 101}},
            "sampling_params.logit_bias['7'] must be a number in [-100, 100], got 101",
            "sampling_params.logit_bias",
        ),
        (
            [1],
            [("max_tokens", 1)],
            "sampling_params must be an object of sampling keys",
            "sampling_params",
        ),
    ],
)
def test_bad_input_names_the_field(prompt_ids, params, message, param):
    with pytest.raises(GenerateInputError) as info:
        check(prompt_ids, params)
    assert str(info.value).startswith(message)
    assert info.value.param == param
    assert isinstance(info.value, ValueError)


def test_max_tokens_defaults_to_and_is_clamped_to_the_room_left():
    assert check([1, 2, 3], {}).max_tokens == 13
    assert check([1, 2, 3], {"max_tokens": 100}).max_tokens == 13
    assert check([1, 2, 3], {"max_tokens": 4, "temperature": 0}).max_tokens == 4


def test_logit_bias_keys_become_token_ids():
    assert check([1], {"logit_bias": {"7": 2, 9: -1.5}}).logit_bias == {7: 2.0, 9: -1.5}

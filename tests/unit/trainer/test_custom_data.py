"""verl's ``data.custom_cls`` and ``data.sampler``: a dataset class built as verl builds one,
its rows through the same checks; a curriculum sampler picking the order lazily, updated
after every step with the step's scores, its state in the checkpoint so a resume goes on
exactly; a stateless one resumed without repeating or skipping a prompt; each bad class
refused with a message naming the key."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from agentloop import AgentLoopOutput, collate
from tests.unit.trainer import verl_api_data
from trainer.config.schema import CustomClsConfig, DataConfig, SamplerConfig
from trainer.data.curriculum import UserSampler, build_sampler
from trainer.data.rows import load_rows
from trainer.data.sampler import PromptSampler

MODULE = "pkg://tests.unit.trainer.verl_api_data"


@pytest.fixture()
def files(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return [str(path)]


def data(**kwargs) -> DataConfig:
    return DataConfig(train_batch_size=2, **kwargs)


def test_a_custom_dataset_class_gives_the_rows_as_verl_constructs_it(files, tokenizer):
    config = data(custom_cls=CustomClsConfig(path=MODULE, name="PrefixedDataset"))
    rows = load_rows(files, config, tokenizer)
    assert len(rows) == 6
    assert verl_api_data.PrefixedDataset.seen == {
        "data_files": files,
        "max_samples": -1,
        "processor": None,
        "max_prompt_length": 1024,  # the data config, read the way verl's classes read it
        "prompt_key": "prompt",
    }
    assert rows[3]["raw_prompt"][0] == {"role": "system", "content": "Answer with a number."}
    assert rows[3]["reward_model"]["ground_truth"] == "6" and rows[3]["index"] == 3
    assert "input_ids" not in rows[3] and "attention_mask" not in rows[3]  # verl's batching


def test_an_older_dataset_without_max_samples_and_a_file_path_load(files, tokenizer):
    import tests.unit.trainer.verl_api_data as module

    config = data(custom_cls=CustomClsConfig(path=module.__file__, name="OldSignature"))
    assert len(load_rows(files, config, tokenizer)) == 6


def test_custom_rows_are_length_filtered_like_file_rows(files, tokenizer):
    config = data(
        custom_cls=CustomClsConfig(path=MODULE, name="PrefixedDataset"), max_prompt_length=5
    )
    with pytest.raises(ValueError, match="no rows left .* data.max_prompt_length=5"):
        load_rows(files, config, tokenizer)


@pytest.mark.parametrize(
    ("path", "name", "error"),
    [
        (
            "/nope/data.py",
            "X",
            "data.custom_cls.path='/nope/data.py': there is no file '/nope/data.py'; point it at "
            "an existing .py file (a relative path starts at the working directory)",
        ),
        (
            MODULE,
            "Missing",
            f"data.custom_cls.path='{MODULE}', data.custom_cls.name='Missing': module "
            f"'{MODULE.removeprefix('pkg://')}' defines no 'Missing'; define it there or set "
            "data.custom_cls.name to a name it defines",
        ),
        (
            MODULE,
            "NotADataset",
            f"data.custom_cls (NotADataset from {MODULE}) is not a dataset class: it needs "
            "__len__ and __getitem__ (verl's custom datasets subclass torch.utils.data.Dataset)",
        ),
        (
            MODULE,
            "BadItems",
            f"data.custom_cls (BadItems from {MODULE}): item 0 is a list, not a mapping of row "
            "fields",
        ),
        (
            "pkg://no_such_pkg.data",
            "X",
            "data.custom_cls.path='pkg://no_such_pkg.data': cannot import module "
            "'no_such_pkg.data' (ModuleNotFoundError: No module named 'no_such_pkg'); install the "
            "package that provides 'no_such_pkg', put its folder on PYTHONPATH, or correct the "
            "name",
        ),
    ],
)
def test_a_bad_custom_dataset_is_refused_naming_the_key(files, tokenizer, path, name, error):
    config = data(custom_cls=CustomClsConfig(path=path, name=name))
    with pytest.raises(ValueError) as exc:
        load_rows(files, config, tokenizer)
    assert str(exc.value) == error


def test_half_a_class_setting_is_refused():
    with pytest.raises(ValueError, match="data.custom_cls: set both path and name, or neither"):
        data(custom_cls=CustomClsConfig(path=MODULE))
    with pytest.raises(ValueError, match="data.sampler: set both class_path and class_name"):
        data(sampler=SamplerConfig(class_name="HardestFirst"))


# ---- samplers --------------------------------------------------------------------------------
ROWS = [
    {"index": i, "uid": f"r{i}", "raw_prompt": [], "data_source": "d", "agent_name": "a"}
    for i in range(6)
]


def step_rollout(rows: list[dict]) -> object:
    outputs = [
        AgentLoopOutput(
            prompt_ids=[1, 2],
            response_ids=[3, 4, 5],
            response_mask=[1, 1, 1],
            response_log_probs=[0.0] * 3,
            num_turns=2,
        )
        for _ in rows
    ]
    return collate(outputs, rows, prompt_length=4, response_length=4, pad_token_id=0)


def train(sampler: PromptSampler, steps: int, score) -> list[list[int]]:
    """Draw ``steps`` batches, reporting score(index) for each row after its step."""
    order = []
    for step in range(1, steps + 1):
        rows = sampler.next_batch()
        order.append([r["index"] for r in rows])
        scores = torch.tensor([score(r["index"]) for r in rows])
        sampler.after_step(step, step_rollout(rows), scores)
    return order


def curriculum() -> DataConfig:
    return data(sampler=SamplerConfig(class_path=MODULE, class_name="HardestFirst"))


def test_a_curriculum_sampler_orders_lazily_and_is_updated_after_every_step():
    verl_api_data.HardestFirst.updates = []
    sampler = build_sampler(ROWS, curriculum())
    assert isinstance(sampler, UserSampler) and len(sampler) == 3
    easy = {0, 1, 2}  # solved every time: they sink to the end of the next epoch
    order = train(sampler, 6, lambda i: 1.0 if i in easy else 0.0)
    assert order[:3] == [[0, 1], [2, 3], [4, 5]]  # no scores yet: index order
    assert order[3:] == [[3, 4], [5, 0], [1, 2]]  # epoch 2: the unsolved ones first
    batch = verl_api_data.HardestFirst.updates[0]
    assert len(batch) == 2 and batch.meta_info == {"global_steps": 1}
    assert batch.non_tensor_batch["dataset_index"].tolist() == [0, 1]
    assert batch.non_tensor_batch["uid"].tolist() == ["r0", "r1"]
    assert batch.batch["scores"].tolist() == [1.0, 1.0]
    # verl's token_level_scores: the score on each sample's last response token
    assert batch.batch["token_level_scores"].tolist() == [[0, 0, 1, 0], [0, 0, 1, 0]]


def test_a_curriculum_resumes_exactly_from_its_checkpointed_state():
    def score(i):
        return 1.0 if i % 2 else 0.0

    straight = build_sampler(ROWS, curriculum())
    expected = train(straight, 7, score)

    first = build_sampler(ROWS, curriculum())
    head = train(first, 4, score)
    state = first.state_dict()
    resumed = build_sampler(ROWS, curriculum())  # a new process: a new sampler
    resumed.load_state_dict(state)
    tail = train(resumed, 3, score)
    assert head + tail == expected


def test_a_sampler_state_that_is_not_json_survives_the_checkpoint_file():
    import json

    config = data(sampler=SamplerConfig(class_path=MODULE, class_name="SeededShuffle"))
    expected = train(build_sampler(ROWS, config), 7, lambda i: 0.0)
    first = build_sampler(ROWS, config)
    head = train(first, 5, lambda i: 0.0)
    state = json.loads(json.dumps(first.state_dict()))  # as trainer_state.json holds it
    resumed = build_sampler(ROWS, config)
    resumed.load_state_dict(state)
    assert head + train(resumed, 2, lambda i: 0.0) == expected


def test_a_stateless_sampler_resumes_without_repeating_or_skipping_a_prompt(caplog):
    config = data(sampler=SamplerConfig(class_path=MODULE, class_name="Reversed"))
    first = build_sampler(ROWS, config)
    assert first.next_batch()[0]["index"] == 5
    state = first.state_dict()
    resumed = build_sampler(ROWS, config)
    resumed.load_state_dict(state)
    rest = [r["index"] for _ in range(2) for r in resumed.next_batch()]
    assert sorted(rest) == [0, 1, 2, 3]  # the epoch's other rows, each once
    assert "Reversed has no state_dict/load_state_dict" in caplog.text
    assert [r["index"] for r in resumed.next_batch()] == [5, 4]  # the next epoch


def test_in_flight_rows_come_back_first_after_a_resume():
    sampler = build_sampler(ROWS, curriculum())
    keys = [sampler.next_row()[0] for _ in range(3)]
    state = sampler.state_dict(in_flight=keys[1:])
    resumed = build_sampler(ROWS, curriculum())
    resumed.load_state_dict(state)
    assert [resumed.next_row()[1]["index"] for _ in range(3)] == [1, 2, 3]


def test_a_bad_sampler_is_refused_naming_the_key():
    with pytest.raises(ValueError) as exc:
        build_sampler(ROWS, data(sampler=SamplerConfig(class_path=MODULE, class_name="Nope")))
    assert str(exc.value) == (
        f"data.sampler.class_path='{MODULE}', data.sampler.class_name='Nope': module "
        f"'{MODULE.removeprefix('pkg://')}' defines no 'Nope'; define it there or set "
        "data.sampler.class_name to a name it defines"
    )
    with pytest.raises(ValueError) as exc:
        build_sampler(
            ROWS, data(sampler=SamplerConfig(class_path=MODULE, class_name="NotADataset"))
        )
    assert str(exc.value) == (
        f"data.sampler (NotADataset from {MODULE}) is not a sampler: it must iterate dataset "
        "indices (__iter__), as verl's AbstractSampler does"
    )
    bad = build_sampler(
        ROWS, data(sampler=SamplerConfig(class_path=MODULE, class_name="OutOfRange"))
    )
    with pytest.raises(ValueError) as exc:
        bad.next_batch()
    assert str(exc.value) == (
        "data.sampler: OutOfRange yielded 11; it must yield dataset indices in [0, 6)"
    )

"""search_r1 recipe pieces: the generated world is answerable from its passages, BM25 finds
the passage a one-hop question needs, the reward's exact match and format terms, and the
data script's rows, index, MCP config and bad-input errors."""

from __future__ import annotations

import json

import pytest

from recipes.search_r1.corpus import make_world
from recipes.search_r1.data import main as data_main
from recipes.search_r1.retriever import Bm25Index, format_hits
from recipes.search_r1.reward import compute_score, final_answer


def test_every_answer_is_in_the_passages_and_bm25_finds_one_hop_evidence():
    passages, questions = make_world(seed=1)
    text = " ".join(p["contents"] for p in passages)
    assert all(any(a in text for a in q["answers"]) for q in questions)
    index = Bm25Index.build(passages)
    one_hop = [q for q in questions if q["hops"] == 1]
    found = sum(
        any(q["answers"][0] in h["contents"] for h in index.search(q["question"], 3))
        for q in one_hop
    )
    assert found / len(one_hop) >= 0.9
    assert {q["hops"] for q in questions} == {1, 2}


def test_index_round_trips_through_its_folder(tmp_path):
    passages, _ = make_world(seed=2)
    built = Bm25Index.build(passages, tmp_path / "index")
    loaded = Bm25Index.load(tmp_path / "index")
    query = passages[5]["title"]
    assert [h["id"] for h in loaded.search(query)] == [h["id"] for h in built.search(query)]
    assert loaded.search("the of and") == []
    assert format_hits([]) == "No passage matched the query."
    with pytest.raises(ValueError, match="is not a BM25 index"):
        Bm25Index.load(tmp_path)


def test_reward_is_exact_match_with_format_terms():
    gold = {"target": ["Kelmir", "Kelmir river"]}
    searched = {"calls": [{"name": "retriever-search", "ok": True}]}
    assert compute_score("nq", "<answer>the kelmir river</answer>", gold, searched)["score"] == 1
    wrong = compute_score("nq", "<answer>Austa</answer>", gold, searched)
    assert wrong == {"score": pytest.approx(0.2), "em": 0.0, "format": 1.0}
    unsearched = compute_score("nq", "<answer>Austa</answer>", gold, {"calls": []})
    assert unsearched["score"] == pytest.approx(0.1)
    assert compute_score("nq", "Kelmir", gold, searched)["score"] == 0.0
    assert final_answer("<tool_response>\n<answer>x</answer>\n</tool_response>") is None


def test_data_script_writes_rows_index_and_an_mcp_config(tmp_path):
    assert data_main(["--out", str(tmp_path), "--synthetic", "--train", "10", "--val", "5"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and rows[0]["agent_name"] == "tool_agent"
    assert rows[0]["prompt"][0]["content"].startswith("Answer the question using the search")
    config = json.loads((tmp_path / "mcp_search.json").read_text())
    server = config["mcpServers"]["retriever"]
    assert server["args"][-1] == str((tmp_path / "index").resolve())
    assert (tmp_path / "index" / "passages.jsonl").is_file()


def test_local_corpus_and_qa_files(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "title": "Kelmir", "contents": "Kelmir lies on the Austa."}) + "\n"
    )
    qa = {"question": "Which river?", "golden_answers": ["Austa"]}
    (tmp_path / "qa.jsonl").write_text(json.dumps(qa) + "\n")
    out = tmp_path / "out"
    args = [
        "--out",
        str(out),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
        "--train_file",
        str(tmp_path / "qa.jsonl"),
        "--val_file",
        str(tmp_path / "qa.jsonl"),
        "--data_source",
        "hotpotqa",
    ]
    assert data_main(args) == 0
    (row,) = [json.loads(x) for x in (out / "val.jsonl").read_text().splitlines()]
    assert row["data_source"] == "hotpotqa"
    assert row["reward_model"]["ground_truth"] == {"target": ["Austa"]}


@pytest.mark.parametrize(
    ("qa", "message"),
    [
        ({"question": "q"}, "row 0 needs 'question' and 'golden_answers' (or 'answers'/'answer')"),
        ({"answer": "x"}, "row 0 needs 'question' and 'golden_answers' (or 'answers'/'answer')"),
    ],
)
def test_bad_qa_rows_name_the_file_and_row(tmp_path, capsys, qa, message):
    (tmp_path / "c.jsonl").write_text(json.dumps({"contents": "x"}) + "\n")
    (tmp_path / "qa.jsonl").write_text(json.dumps(qa) + "\n")
    args = [
        "--out",
        str(tmp_path / "o"),
        "--corpus",
        str(tmp_path / "c.jsonl"),
        "--train_file",
        str(tmp_path / "qa.jsonl"),
        "--val_file",
        str(tmp_path / "qa.jsonl"),
    ]
    assert data_main(args) == 2
    err = capsys.readouterr().err
    assert err == f"search_r1 data: error: {tmp_path / 'qa.jsonl'}: {message}\n"
    assert data_main(["--out", str(tmp_path / "o")]) == 2
    assert "give --synthetic, or --corpus, --train_file and --val_file" in capsys.readouterr().err

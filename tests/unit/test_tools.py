"""make_demo_data: deterministic, exact offsets, long contexts, late answers, v2 questions about absent entities,
and files that load cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

import qa_hpc.tools.make_demo_data as mdd
from qa_hpc.squad_io import load_qa_records
from qa_hpc.tools.make_demo_data import generate_squad

N = 600  # ~100 paragraphs at the default 450 words: enough for shares, fast to build


@pytest.fixture(scope="module")
def v1() -> dict:
    return generate_squad(N, seed=0)


@pytest.fixture(scope="module")
def v2() -> dict:
    return generate_squad(N, seed=0, with_impossible=True)


def _qas(ds: dict) -> list[tuple[str, dict]]:
    return [(par["context"], qa) for art in ds["data"] for par in art["paragraphs"] for qa in par["qas"]]


def test_deterministic_ids_and_exact_offsets(v1, v2):
    assert generate_squad(N, seed=0) == v1 and generate_squad(N, seed=1) != v1
    first_context = lambda ds: ds["data"][0]["paragraphs"][0]["context"]  # noqa: E731
    assert first_context(generate_squad(N, seed=0, title_prefix="other")) != first_context(v1)
    ids = [qa["id"] for _, qa in _qas(v1)]
    assert len(set(ids)) == len(ids) == N and ids[0] == "demo-000000" and ids[-1] == f"demo-{N - 1:06d}"
    assert min(len(p["qas"]) for art in v1["data"] for p in art["paragraphs"][:-1]) >= 3  # several per paragraph
    for ctx, qa in _qas(v1) + _qas(v2):
        for a in qa["answers"]:
            assert ctx[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"] == a["text"].strip() != ""
    with pytest.raises(ValueError):
        generate_squad(0)


def test_long_contexts_varied_questions_and_late_answers(v1, tokenizer):
    contexts = [p["context"] for art in v1["data"] for p in art["paragraphs"]]
    assert all(len(p["context"].split()) < 120 for art in generate_squad(30, context_words=60)["data"]
               for p in art["paragraphs"])
    tokens = tokenizer(contexts[:60], add_special_tokens=False)["input_ids"]  # MiniLM's uncased WordPiece
    assert sum(len(ids) > 384 for ids in tokens) / len(tokens) > 0.9
    assert tokenizer.unk_token_id not in {i for ids in tokens for i in ids}  # invented names: known pieces
    # answers in later windows: the token position of the answer start passes the first window
    late = [len(tokenizer(ctx[:qa["answers"][0]["answer_start"]], add_special_tokens=False)["input_ids"]) > 352
            for ctx, qa in _qas(v1)[:300]]
    assert sum(late) / len(late) > 0.25
    assert {"Who", "What", "How", "Which", "When", "In", "Where"} <= {qa["question"].split()[0] for _, qa in _qas(v1)}
    answers = [qa["answers"][0]["text"] for _, qa in _qas(v1)]
    assert any(re.fullmatch(r"1\d\d\d", a) for a in answers) and any(a.endswith("metres") for a in answers)


def test_v2_asks_about_entities_the_paragraph_never_names(v1, v2):
    qas = _qas(v2)
    impossible = [qa for _, qa in qas if qa["is_impossible"]]
    assert 0.25 < len(impossible) / len(qas) < 0.42 and all(qa["answers"] == [] for qa in impossible)
    for ctx, qa in qas:
        names = [w for w in re.findall(r"[A-Za-z]+", qa["question"])[1:] if w[0].isupper() and w not in {"Mount", "Lake"}]
        assert names and (any(n not in ctx for n in names) if qa["is_impossible"] else all(n in ctx for n in names))
    assert not any("is_impossible" in qa for _, qa in _qas(v1))


def test_cli_writes_the_same_bytes_atomically_and_they_load_cleanly(tmp_path, capsys):
    args = ["--num_train", "60", "--num_eval", "20", "--seed", "3", "--context_words", "120"]
    assert mdd.main(["--output_dir", str(tmp_path / "a"), *args]) == 0
    out = capsys.readouterr().out
    assert mdd.main(["--output_dir", str(tmp_path / "b"), *args]) == 0
    names = ["test.json", "train.json", "validation.json"]
    assert sorted(os.listdir(tmp_path / "a")) == names, "no temp files left behind"
    for name in names:
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes() and f"{tmp_path / 'a' / name} " in out
        assert hashlib.sha256(a).hexdigest()[:12] in out
    # the bytes of this version: the README's demo figures were measured on data made by it
    assert "sha256=ae5435f13128" in out and "sha256=d72dc9814842" in out and "sha256=425eeed0f7d1" in out
    (train, rep), (val, _), (test, _) = (load_qa_records(tmp_path / "a" / f"{split}.json", split=split)
                                         for split in ("train", "validation", "test"))
    assert (rep.fmt, rep.n_records, rep.skipped, rep.fixed, len(val)) == ("squad-nested", 60, {}, 0, 20)
    assert [r["id"] for r in test] == [r["id"] for r in val] and all(r["answers"]["text"] == [] for r in test)
    assert not {r["context"] for r in train} & {r["context"] for r in val}, "train and eval differ"
    with pytest.raises(Exception):
        load_qa_records(tmp_path / "a" / "test.json", split="validation")
    assert mdd.main(["--output_dir", str(tmp_path / "c"), *args, "--version_2_with_negative"]) == 0
    v2 = tmp_path / "c" / "train.json"
    _, rep = load_qa_records(v2, version_2_with_negative=True)
    assert json.loads(v2.read_text())["version"] == "2.0" and 0 < rep.n_impossible < 60
    assert rep.n_impossible == sum(qa["is_impossible"] for _, qa in _qas(json.loads(v2.read_text())))

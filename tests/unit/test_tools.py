"""The tools: make_demo_data (deterministic, exact offsets, long contexts, late answers, loads cleanly)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

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


def _paragraphs(ds):
    for art in ds["data"]:
        yield from art["paragraphs"]


def _qas(ds):
    for par in _paragraphs(ds):
        for qa in par["qas"]:
            yield par["context"], qa


def test_deterministic_and_seed_sensitive(v1):
    assert generate_squad(N, seed=0) == v1 and generate_squad(N, seed=1) != v1
    first_context = lambda ds: ds["data"][0]["paragraphs"][0]["context"]  # noqa: E731
    assert first_context(generate_squad(N, seed=0, title_prefix="other")) != first_context(v1)


def test_shape_counts_and_ids(v1):
    assert v1["version"] == "1.1"
    qas = [qa for _, qa in _qas(v1)]
    assert len(qas) == N
    ids = [qa["id"] for qa in qas]
    assert len(set(ids)) == N and ids[0] == "demo-000000" and ids[-1] == f"demo-{N - 1:06d}"
    assert all(set(art) == {"title", "paragraphs"} and art["title"].startswith("demo_") for art in v1["data"])
    per_par = [len(p["qas"]) for p in _paragraphs(v1)]
    assert min(per_par[:-1]) >= 3, "several questions per paragraph"
    assert sum(1 for _ in generate_squad(7)["data"][0]["paragraphs"][0]["qas"]) <= 7


def test_offsets_exact(v1, v2):
    for ds in (v1, v2):
        for ctx, qa in _qas(ds):
            for a in qa["answers"]:
                assert ctx[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"], qa
                assert a["text"].strip() == a["text"] and a["text"]


def test_long_contexts_and_late_answers(v1):
    words = [len(p["context"].split()) for p in _paragraphs(v1)]
    assert sum(w > 384 for w in words) / len(words) > 0.9
    late = [a["answer_start"] > 0.6 * len(ctx) for ctx, qa in _qas(v1) for a in qa["answers"]]
    assert 0.25 < sum(late) / len(late) < 0.6, sum(late) / len(late)
    short = generate_squad(30, context_words=60)
    assert all(len(p["context"].split()) < 120 for p in _paragraphs(short))


def test_question_types_vary(v1):
    firsts = {qa["question"].split()[0] for _, qa in _qas(v1)}
    assert {"Who", "What", "How", "Which", "When", "In", "Where"} <= firsts
    answers = [qa["answers"][0]["text"] for _, qa in _qas(v1)]
    assert any(re.fullmatch(r"1\d\d\d", a) for a in answers)  # years
    assert any(a.endswith("metres") for a in answers) and any(" " in a and a[0].isupper() for a in answers)


def _names(question: str) -> list[str]:
    """Capitalised words of a question after its first word (entity names)."""
    words = re.findall(r"[A-Za-z]+", question)[1:]
    return [w for w in words if w[0].isupper() and w not in {"Mount", "Lake"}]


def test_impossible_share_and_entities(v1, v2):
    assert v2["version"] == "2.0"
    qas = list(_qas(v2))
    imp = [qa for _, qa in qas if qa["is_impossible"]]
    assert 0.25 < len(imp) / len(qas) < 0.42
    assert all(qa["answers"] == [] for qa in imp)
    assert all(qa["answers"] for _, qa in qas if not qa["is_impossible"])
    for ctx, qa in qas:
        names = _names(qa["question"])
        assert names, qa
        if qa["is_impossible"]:  # asks about someone or something the paragraph never mentions
            assert any(n not in ctx for n in names), qa
        else:  # the entity asked about is in the paragraph
            assert all(n in ctx for n in names), qa
    assert not any("is_impossible" in qa for _, qa in _qas(v1))


def test_loads_cleanly(tmp_path, v1, v2):
    for name, ds, flag in (("v1.json", v1, False), ("v2.json", v2, True)):
        p = tmp_path / name
        p.write_text(json.dumps(ds), encoding="utf-8")
        recs, rep = load_qa_records(p, version_2_with_negative=flag)
        assert (rep.fmt, rep.n_records, rep.skipped, rep.fixed) == ("squad-nested", N, {}, 0)
        assert rep.n_impossible == sum(bool(qa.get("is_impossible")) for _, qa in _qas(ds))
    with pytest.raises(ValueError):
        generate_squad(0)


def test_cli_writes_identical_files_atomically(tmp_path, capsys):
    args = ["--num_train", "60", "--num_eval", "20", "--seed", "3", "--context_words", "120"]
    assert mdd.main(["--output_dir", str(tmp_path / "a"), *args]) == 0
    out = capsys.readouterr().out
    assert mdd.main(["--output_dir", str(tmp_path / "b"), *args]) == 0
    names = ["train.json", "validation.json", "test.json"]
    assert sorted(os.listdir(tmp_path / "a")) == sorted(names), "no temp files left behind"
    for name in names:
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes()
        assert str(tmp_path / "a" / name) in out and hashlib.sha256(a).hexdigest()[:12] in out
    assert "questions=60" in out and "questions=20" in out
    # the bytes of this version: the README's demo figures were measured on data made by it
    assert "sha256=ae5435f13128" in out and "sha256=d72dc9814842" in out and "sha256=425eeed0f7d1" in out
    (train, rep), (val, _), (test, _) = (load_qa_records(tmp_path / "a" / f"{split}.json", split=split)
                                         for split in ("train", "validation", "test"))
    assert rep.n_records == 60 and len(val) == len(test) == 20
    assert [r["id"] for r in test] == [r["id"] for r in val]
    assert all(r["answers"]["text"] == [] for r in test)
    assert not {r["context"] for r in train} & {r["context"] for r in val}, "train and eval differ"
    with pytest.raises(Exception):
        load_qa_records(tmp_path / "a" / "test.json", split="validation")

    assert mdd.main(["--output_dir", str(tmp_path / "c"), *args, "--version_2_with_negative"]) == 0
    v2 = json.loads((tmp_path / "c" / "train.json").read_text())
    assert v2["version"] == "2.0"
    _, rep = load_qa_records(tmp_path / "c" / "train.json", version_2_with_negative=True)
    assert 0 < rep.n_impossible < 60


def test_contexts_exceed_384_wordpiece_tokens(v1, tokenizer):
    tok = tokenizer  # MiniLM's uncased WordPiece (tests/conftest.py)
    contexts = [p["context"] for p in _paragraphs(v1)][:60]
    lengths = [len(ids) for ids in tok(contexts, add_special_tokens=False)["input_ids"]]
    assert sum(n > 384 for n in lengths) / len(lengths) > 0.9, lengths
    # invented names split into a few known pieces, never [UNK]
    assert tok.unk_token_id not in {i for ids in tok(contexts)["input_ids"] for i in ids}
    # answers in later windows: the token position of the answer start passes the first window
    late = [len(tok(ctx[:qa["answers"][0]["answer_start"]], add_special_tokens=False)["input_ids"]) > 384 - 32
            for ctx, qa in list(_qas(v1))[:300]]
    assert sum(late) / len(late) > 0.25

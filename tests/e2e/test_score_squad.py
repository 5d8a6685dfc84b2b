"""score_squad.py as a real process: the exit code, stdout and stderr users see, for a good and a bad input;
and a hub metric that an earlier online run cached, loaded offline. (Every other case of its command line runs
in-process: tests/unit/test_metric.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures.procs import PYTHON, REPO, offline_env, ok, run


def score(tmp_path: Path, golds: dict[str, list[str]], preds: dict[str, object], *args: str):
    """score_squad.py on an official nested file of `golds` and a predictions file of `preds`."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in texts]}
           for qid, texts in golds.items()]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}
    files = [tmp_path / "dev.json", tmp_path / "preds.json"]
    for path, content in zip(files, (data, preds)):
        path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    return run([PYTHON, REPO / "score_squad.py", *files, *args], timeout=60, encoding="utf-8")


def test_v1_scores_and_warns_about_missing(tmp_path: Path) -> None:  # the scores' arithmetic: tests/unit
    proc = score(tmp_path, {"q1": ["the Broncos"], "q2": ["Paris"]}, {"q1": "Broncos"})
    ok(proc)
    (line,) = proc.stdout.splitlines()
    assert list(json.loads(line).items()) == [("exact_match", 50.0), ("f1", 50.0)]
    assert "1 of 2 question(s)" in proc.stderr and "'q2'" in proc.stderr and "score 0" in proc.stderr


def test_bad_dataset_is_exit_2_naming_file_record_and_field(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    proc = score(tmp_path, {"n0": [3]}, {"n0": "the river Quent"}, "--out_file", str(out))
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr
    assert (f"{tmp_path / 'dev.json'}: data[0].paragraphs[0].qas[0] (id 'n0'): field 'answers[0].text': must be a "
            "string, got int") in proc.stderr


def test_a_hub_metric_cached_earlier_loads_offline(tmp_path: Path) -> None:
    """What a run with internet leaves in $HF_HOME: evaluate's copy of the hub module (ours stands in). Offline,
    --squad_metric squad must find it there without trying the network (a process: HF_HOME is read at import)."""
    from qa_hpc.metric.squad import LOCAL_MODULES

    hf_home = tmp_path / "hf_home"
    cached = hf_home / "modules" / "evaluate_modules" / "metrics" / "evaluate-metric--squad" / ("0" * 64)
    cached.mkdir(parents=True)
    shutil.copy(LOCAL_MODULES[False] / "evaluate_squad_v1.py", cached / "squad.py")
    code = "from qa_hpc.metric.squad import load_squad_metric; print(load_squad_metric('squad', False).name)"
    proc = run([PYTHON, "-c", code], timeout=300, env=offline_env(HF_HOME=str(hf_home)))
    ok(proc)
    assert proc.stdout.strip().splitlines()[-1] == "evaluate_squad_v1"

"""score_squad.py as a real process: the exit code, stdout and stderr users see, for a good and a bad input;
and a hub metric that an earlier online run cached, loaded offline. (Every other case of its command line runs
in-process: tests/unit/test_metric.py.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from fixtures.runqa import qa_env

SCRIPT = REPO / "score_squad.py"
TOL = 1e-9


def run_process(*args: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          encoding="utf-8", timeout=60)


def dataset(questions: dict[str, list[str] | None]) -> dict:
    """Official nested layout; None -> unanswerable (v2 style)."""
    qas = []
    for qid, golds in questions.items():
        if golds is None:
            qas.append({"id": qid, "question": "?", "answers": [], "is_impossible": True})
        else:
            answers = [{"text": text, "answer_start": 0} for text in golds]
            qas.append({"id": qid, "question": "?", "answers": answers})
    paragraph = {"context": "c", "qas": qas}
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [paragraph]}]}


def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path


V1 = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California", "Levi's Stadium"],
    "q3": ["1914—1918"],
    "q4": ["Paris"],
}
V1_PREDS = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "1914-1918"}


@pytest.fixture()
def v1_files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "dev.json", dataset(V1)), write(tmp_path / "preds.json", V1_PREDS)


def test_v1_scores_and_warns_about_missing(v1_files) -> None:
    data, preds = v1_files
    proc = run_process(data, preds)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(25.0, abs=TOL)
    assert result["f1"] == pytest.approx(1100 / 28, abs=TOL)
    assert "1 of 4 question(s)" in proc.stderr
    assert "'q4'" in proc.stderr and "score 0" in proc.stderr


def test_bad_dataset_is_exit_2_naming_file_record_and_field(tmp_path: Path) -> None:
    data = dataset({"n0": ["the river Quent"]})
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = 3
    path, out = write(tmp_path / "dev.json", data), tmp_path / "eval.json"
    proc = run_process(path, write(tmp_path / "preds.json", {"n0": "the river Quent"}), "--out_file", out)
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr
    assert (f"{path}: data[0].paragraphs[0].qas[0] (id 'n0'): field 'answers[0].text': must be a string, "
            "got int") in proc.stderr


def test_a_hub_metric_cached_earlier_loads_offline(tmp_path: Path) -> None:
    """What a run with internet leaves in $HF_HOME: evaluate's copy of the hub module (ours stands in). Offline,
    --squad_metric squad must find it there without trying the network (a process: HF_HOME is read at import)."""
    from qa_hpc.metric.squad import LOCAL_MODULES

    hf_home = tmp_path / "hf_home"
    cached = hf_home / "modules" / "evaluate_modules" / "metrics" / "evaluate-metric--squad" / ("0" * 64)
    cached.mkdir(parents=True)
    shutil.copy(LOCAL_MODULES[False] / "evaluate_squad_v1.py", cached / "squad.py")
    code = "from qa_hpc.metric.squad import load_squad_metric; print(load_squad_metric('squad', False).name)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=qa_env(HF_HOME=str(hf_home)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "evaluate_squad_v1"

"""score_squad.py as a real process: a good run scores without loading torch, datasets or transformers (the
scorer must start in a second on a login node), and a bad input is exit 2 naming file, record and field. Every
other case of its command line runs in-process: tests/unit/test_metric.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.procs import PYTHON, REPO, ok, run

HEAVY = {"torch", "datasets", "transformers"}


def squad(*qas: dict) -> dict:
    """The official layout: one article, one paragraph, these questions."""
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": list(qas)}]}]}


def test_a_scoring_run_loads_no_torch_datasets_or_transformers(tmp_path: Path) -> None:
    """`python -X importtime` lists every module the run imported; q1 unanswered (0) and zz unknown (ignored):
    EM = F1 = 100 * 1/2."""
    dev = tmp_path / "dev.json"
    preds = tmp_path / "preds.json"
    dev.write_text(
        json.dumps(
            squad(*({"id": f"q{i}", "answers": [{"text": "Paris", "answer_start": 0}]} for i in (0, 1)))
        ),
        encoding="utf-8",
    )
    preds.write_text(json.dumps({"q0": "Paris", "zz": "Lyon"}), encoding="utf-8")
    proc = run([PYTHON, "-X", "importtime", REPO / "score_squad.py", dev, preds], timeout=120)
    ok(proc)
    assert json.loads(proc.stdout) == {"exact_match": 50.0, "f1": 50.0}
    assert "'zz'; ignored" in proc.stderr and "have no prediction" in proc.stderr
    # lines "import time: self | cumulative | module", the module indented by its depth
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "qa_hpc" in imported and imported & HEAVY == set(), sorted(imported & HEAVY)


def test_bad_dataset_is_exit_2_naming_file_record_and_field(tmp_path: Path) -> None:
    dev = tmp_path / "dev.json"
    preds = tmp_path / "preds.json"
    dev.write_text(
        json.dumps(squad({"id": "n0", "question": "?", "answers": [{"text": 3, "answer_start": 0}]})),
        encoding="utf-8",
    )
    preds.write_text(json.dumps({"n0": "the river Quent"}), encoding="utf-8")
    proc = run([PYTHON, REPO / "score_squad.py", dev, preds], timeout=60, encoding="utf-8")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert (
        f"{dev}: data[0].paragraphs[0].qas[0] (id 'n0'): field 'answers[0].text': must be a string, got int"
    ) in proc.stderr

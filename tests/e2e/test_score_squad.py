"""score_squad.py as a real process on a bad input (a good one: the scorer runs of tests/e2e/test_run_qa.py).
Every other case of its command line runs in-process: tests/unit/test_metric.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.procs import PYTHON, REPO, run


def test_bad_dataset_is_exit_2_naming_file_record_and_field(tmp_path: Path) -> None:
    data = {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "c",
                        "qas": [{"id": "n0", "question": "?", "answers": [{"text": 3, "answer_start": 0}]}],
                    }
                ],
            }
        ],
    }
    dev, preds, out = tmp_path / "dev.json", tmp_path / "preds.json", tmp_path / "eval.json"
    dev.write_text(json.dumps(data), encoding="utf-8")
    preds.write_text(json.dumps({"n0": "the river Quent"}), encoding="utf-8")
    proc = run([PYTHON, REPO / "score_squad.py", dev, preds, "--out_file", out], timeout=60, encoding="utf-8")
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stderr
    assert (
        f"{dev}: data[0].paragraphs[0].qas[0] (id 'n0'): field 'answers[0].text': must be a string, got int"
    ) in proc.stderr

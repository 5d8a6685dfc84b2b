"""score_squad.py as a real process on a bad input (a good one: the scorer runs of tests/e2e/test_run_qa.py), and a
hub metric that an earlier online run cached, loaded offline. Every other case of its command line runs in-process:
tests/unit/test_metric.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures.procs import PYTHON, REPO, offline_env, ok, run


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

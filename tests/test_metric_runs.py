"""run_qa.py's eval metrics come through `evaluate`, offline, and equal score_squad.py on the files the run wrote.

Real subprocesses with a tiny random BERT, offline (any hub request would go to a closed
local port), HF_HOME in a temporary directory so what evaluate writes can be looked at.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fixtures.runqa import PYTHON, REPO, files_under, qa_env, run_qa, tiny_flags

def _env(hf_home: Path) -> dict[str, str]:
    return qa_env(HF_HOME=str(hf_home))


@pytest.fixture(scope="module")
def runs(tiny_bert: Path, demo_files: dict, demo_files_v2: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """v1 eval, a hub metric asked for offline, and v2 eval at a threshold that splits the answers."""
    tmp = tmp_path_factory.mktemp("metric_runs")
    v2 = ["--do_eval", "--validation_file", str(demo_files_v2["validation"]), "--version_2_with_negative"]
    jobs = {
        "v1": ["--do_eval", "--validation_file", str(demo_files["validation"])],
        "hub_offline": ["--do_train", "--do_eval", "--train_file", str(demo_files["train"]),
                        "--validation_file", str(demo_files["validation"]), "--squad_metric", "squad"],
        "v2_probe": v2,
    }

    def go(item: tuple[str, list[str]]) -> tuple[str, dict]:
        name, extra = item
        out, hf_home, cwd = tmp / name / "out", tmp / name / "hf_home", tmp / name / "cwd"
        cwd.mkdir(parents=True)
        proc = run_qa([*tiny_flags(tiny_bert, out), *extra], env=_env(hf_home), cwd=str(cwd))
        return name, {"proc": proc, "out": out, "hf_home": hf_home, "cwd": cwd}

    with ThreadPoolExecutor(max_workers=2) as pool:  # each is a full interpreter start
        done = dict(pool.map(go, jobs.items()))
    # A random model's null odds all fall on one side of the default 0.0; their median as the
    # threshold gives both answers and abstentions, and is not a value the metric would default to.
    _ok(done["v2_probe"])
    odds = sorted(json.loads((done["v2_probe"]["out"] / "eval_null_odds.json").read_text(encoding="utf-8")).values())
    threshold = repr((odds[len(odds) // 2 - 1] + odds[len(odds) // 2]) / 2)
    done["v2"] = go(("v2", [*v2, "--null_score_diff_threshold", threshold]))[1]
    done["v2"]["threshold"] = threshold
    return done


def _score(*args: str) -> dict:
    proc = subprocess.run([PYTHON, str(REPO / "score_squad.py"), *args], capture_output=True, text=True,
                          timeout=120, env=qa_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ok(run: dict) -> dict:
    proc = run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((run["out"] / "eval_results.json").read_text(encoding="utf-8"))


def test_v1_metrics_equal_the_scorer(runs: dict, demo_files: dict) -> None:
    results = _ok(runs["v1"])
    scored = _score(str(demo_files["validation"]), str(runs["v1"]["out"] / "eval_predictions.json"))
    assert list(scored) == ["exact_match", "f1"]
    assert {k: results[f"eval_{k}"] for k in scored} == scored  # identical, not merely close


def test_v2_metrics_equal_the_scorer(runs: dict, demo_files_v2: dict) -> None:
    results, out = _ok(runs["v2"]), runs["v2"]["out"]
    answers = json.loads((out / "eval_predictions.json").read_text(encoding="utf-8"))
    assert "" in answers.values() and any(answers.values()), "want both answers and abstentions"
    scored = _score(str(demo_files_v2["validation"]), str(out / "eval_predictions.json"), "--version_2_with_negative",
                    "--na_prob_file", str(out / "eval_null_odds.json"), "--na_prob_thresh", runs["v2"]["threshold"])
    assert {"exact", "f1", "total", "HasAns_total", "NoAns_total", "best_f1", "best_f1_thresh"} <= set(scored)
    assert {k: results[f"eval_{k}"] for k in scored} == scored  # identical, not merely close


def test_evaluate_writes_only_into_hf_home(runs: dict) -> None:
    _ok(runs["v1"])
    hf_home, cwd = runs["v1"]["hf_home"], runs["v1"]["cwd"]
    copies = [p for p in files_under(hf_home / "modules") if p.endswith("evaluate_squad_v1.py")]
    assert len(copies) == 1, files_under(hf_home)  # evaluate imports its copy of the local module
    assert (hf_home / "metrics" / "evaluate_squad_v1" / "default").is_dir()
    assert files_under(hf_home / "metrics") == [], "keep_in_memory: no Arrow cache files"
    assert files_under(cwd) == [], "nothing lands in the working directory"


def test_hub_metric_offline_stops_before_training(runs: dict) -> None:
    run = runs["hub_offline"]
    proc = run["proc"]
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for piece in ("--squad_metric 'squad' could not be loaded", "HF_HUB_OFFLINE=1", "leave --squad_metric out",
                  "qa_hpc/metric/evaluate_squad_v1"):
        assert piece in errors[0], (piece, errors[0])
    assert "Traceback" not in proc.stderr
    assert "Running training" not in proc.stdout + proc.stderr
    assert not any(name.startswith(("checkpoint-", "train_results")) for name in files_under(run["out"]))

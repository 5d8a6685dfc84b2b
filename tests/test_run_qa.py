"""run_qa.py end to end as users run it: real subprocesses, tiny random BERT, generated data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

# Offline, and any hub request would go to a closed local port: the normal path must not need the hub.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_ENDPOINT": "http://127.0.0.1:9"}
SMALL = ["--max_seq_length", "128", "--doc_stride", "32", "--per_device_train_batch_size", "8",
         "--per_device_eval_batch_size", "16", "--num_train_epochs", "1", "--report_to", "none", "--seed", "7"]


def run_qa(*args: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_qa.py"), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def key_values(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum() and " " not in key:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def trained(tiny_bert, demo_files, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("run") / "out"
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--validation_file", str(demo_files["validation"]), "--test_file", str(demo_files["test"]),
                  "--do_train", "--do_eval", "--do_predict", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_train_eval_predict_writes_what_hf_users_expect(trained):
    out, _ = trained
    for name in ("train_results.json", "eval_results.json", "predict_results.json", "all_results.json",
                 "trainer_state.json", "run_summary.json", "eval_predictions.json",
                 "eval_nbest_predictions.json", "predict_predictions.json", "predict_nbest_predictions.json",
                 "config.json", "model.safetensors"):
        assert (out / name).is_file(), name
    assert not (out / "eval_null_odds.json").exists(), "v1 runs write no null odds"
    eval_results = json.loads((out / "eval_results.json").read_text())
    for key in ("eval_exact_match", "eval_f1", "eval_runtime", "eval_samples_per_second",
                "eval_postprocess_seconds", "eval_samples", "eval_examples"):
        assert key in eval_results, key
    assert eval_results["eval_examples"] == 16
    assert eval_results["eval_samples"] > 16, "long contexts give several windows per question"
    assert 0 <= eval_results["eval_f1"] <= 100
    assert eval_results["eval_runtime"] >= eval_results["eval_postprocess_seconds"]
    train_results = json.loads((out / "train_results.json").read_text())
    assert {"train_runtime", "train_samples_per_second", "train_loss", "train_samples"} <= set(train_results)
    all_results = json.loads((out / "all_results.json").read_text())
    assert {"train_loss", "eval_f1", "predict_runtime"} <= set(all_results)
    preds = json.loads((out / "eval_predictions.json").read_text())
    assert len(preds) == 16 and all(isinstance(v, str) for v in preds.values())
    nbest = json.loads((out / "eval_nbest_predictions.json").read_text())
    assert set(nbest) == set(preds)
    for qid, cands in nbest.items():
        assert 1 <= len(cands) <= 20
        assert cands[0]["text"] == preds[qid]
        assert [c["score"] for c in cands] == sorted((c["score"] for c in cands), reverse=True)


def test_run_summary_and_final_lines(trained, tiny_bert):
    out, proc = trained
    summary = json.loads((out / "run_summary.json").read_text())
    for key in ("timestamp", "gpu_available", "gpu_count", "gpu_name", "cuda_version", "torch_version",
                "transformers_version", "params", "results", "wall_clock_seconds"):
        assert key in summary, key
    params = summary["params"]
    assert params["model"] == str(tiny_bert)
    assert params["world_size"] == 1 and params["precision"] == "fp32"
    assert params["max_seq_length"] == 128 and params["doc_stride"] == 32
    assert params["per_device_train_batch_size"] == 8 and params["epochs"] == 1
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert summary["results"]["eval_f1"] == eval_results["eval_f1"]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("WALL_CLOCK_SECONDS=") and int(lines[-1].split("=")[1]) >= 0
    kv = key_values(proc.stdout)
    assert float(kv["eval_f1"]) == pytest.approx(eval_results["eval_f1"], abs=1e-4)
    assert float(kv["eval_exact_match"]) == pytest.approx(eval_results["eval_exact_match"], abs=1e-4)
    assert "TOKENS split=train" in proc.stdout + proc.stderr


def test_eval_predictions_match_the_standalone_scorer(trained, demo_files):
    out, _ = trained
    proc = subprocess.run([sys.executable, str(REPO / "score_squad.py"), str(demo_files["validation"]),
                           str(out / "eval_predictions.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    scored = json.loads(proc.stdout)
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert scored["exact_match"] == pytest.approx(eval_results["eval_exact_match"], abs=1e-9)
    assert scored["f1"] == pytest.approx(eval_results["eval_f1"], abs=1e-9)


def test_json_config_eval_only_reproduces_predictions(trained, demo_files, tmp_path):
    out, _ = trained
    config = {"model_name_or_path": str(out), "validation_file": str(demo_files["validation"]),
              "do_eval": True, "output_dir": str(tmp_path / "eval"), "max_seq_length": 128, "doc_stride": 32,
              "per_device_eval_batch_size": 16, "report_to": "none", "seed": 7}
    path = tmp_path / "args.json"
    path.write_text(json.dumps(config))
    proc = run_qa(str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((tmp_path / "eval" / "eval_predictions.json").read_text())
    assert again == json.loads((out / "eval_predictions.json").read_text())


def test_json_config_with_unknown_key_is_refused(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"do_eval": True, "learning_rat": 1e-4}))
    proc = run_qa(str(path))
    assert proc.returncode == 2
    assert "args.json" in proc.stderr and "learning_rat" in proc.stderr


def test_rerun_resumes_from_last_checkpoint(trained, tiny_bert, demo_files):
    out, _ = trained
    step = json.loads((out / "trainer_state.json").read_text())["global_step"]
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--do_train", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESUME_FROM=" in proc.stdout + proc.stderr
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step


def test_non_empty_output_dir_without_checkpoint_is_refused(tiny_bert, demo_files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--do_train", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 2
    assert "--overwrite_output_dir" in proc.stderr and "notes.txt" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_version_2_with_negative(tiny_bert, demo_files_v2, tmp_path):
    out = tmp_path / "v2"
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files_v2["train"]),
                  "--validation_file", str(demo_files_v2["validation"]), "--version_2_with_negative",
                  "--do_train", "--do_eval", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "eval_results.json").read_text())
    for key in ("eval_exact", "eval_f1", "eval_total", "eval_HasAns_exact", "eval_HasAns_f1",
                "eval_NoAns_exact", "eval_NoAns_f1", "eval_best_f1", "eval_best_f1_thresh"):
        assert key in results, key
    odds = json.loads((out / "eval_null_odds.json").read_text())
    preds = json.loads((out / "eval_predictions.json").read_text())
    assert set(odds) == set(preds)
    for qid, answer in preds.items():  # the threshold rule: '' exactly when null odds exceed 0.0
        assert (answer == "") == (odds[qid] > 0.0) or answer == ""

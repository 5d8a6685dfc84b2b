"""run_qa.py end to end as users run it: real subprocesses, tiny random BERT, generated data."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, build_tiny_bert
from fixtures import runqa
from fixtures.procs import offline_env
from fixtures.wall_clock import assert_wall_clock_is_bounded

# Offline, and any hub request would go to a closed local port: the normal path must not need the hub.
ENV = offline_env()
SMALL = ["--max_seq_length", "128", "--doc_stride", "32", "--per_device_train_batch_size", "8",
         "--per_device_eval_batch_size", "16", "--num_train_epochs", "1", "--report_to", "none", "--seed", "7"]


def run_qa(*args: str) -> subprocess.CompletedProcess:
    return runqa.run_qa(list(args), env=ENV)


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
    started = time.monotonic()
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--validation_file", str(demo_files["validation"]), "--test_file", str(demo_files["test"]),
                  "--do_train", "--do_eval", "--do_predict", "--output_dir", str(out), *SMALL)
    proc.measured_wall_seconds = time.monotonic() - started  # the process's whole life, seen from outside
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
    assert lines[-1].startswith("WALL_CLOCK_SECONDS="), lines[-3:]
    assert_wall_clock_is_bounded(int(lines[-1].split("=")[1]), summary, proc.measured_wall_seconds)
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


def test_rerun_resumes_from_last_checkpoint_and_trains_no_step_twice(trained, tiny_bert, demo_files):
    """The same command again after a finished run resumes at its last step: nothing is trained again.

    A rerun from scratch would reach the same global step (and, with the same seed, the same weights), so
    the proof is that no training step runs: with --logging_steps 1 every trained step would log a loss.
    """
    from safetensors.torch import load_file

    out, _ = trained
    before = json.loads((out / "trainer_state.json").read_text())
    step = before["global_step"]
    checkpoint = out / f"checkpoint-{step}"
    assert (checkpoint / "trainer_state.json").is_file(), sorted(p.name for p in out.iterdir())
    weights = load_file(out / "model.safetensors")
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--do_train", "--output_dir", str(out), *SMALL, "--logging_steps", "1")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f"RESUME_FROM={checkpoint} " in log
    assert "'loss'" not in log, "a step was trained again:\n" + log[-3000:]
    after = json.loads((out / "trainer_state.json").read_text())
    assert after["global_step"] == step
    trained_steps = lambda state: [h for h in state["log_history"] if "train_runtime" not in h]  # noqa: E731
    assert trained_steps(after) == trained_steps(before)
    again = load_file(out / "model.safetensors")
    assert all((again[k] == weights[k]).all() for k in weights)


def test_non_empty_output_dir_without_checkpoint_is_refused(tiny_bert, demo_files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = run_qa("--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
                  "--do_train", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 2
    assert "--overwrite_output_dir" in proc.stderr and "notes.txt" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def build_null_biased_bert(out_dir: Path, first_null_position: int) -> Path:
    """A tiny BERT for QA that abstains exactly on questions of `first_null_position` tokens or more.

    Its encoder's sublayers write nothing (their output projections are zero), so every token's final
    hidden state is the LayerNorm of its embeddings. Hidden unit 0 carries a position signal alone: 0 at
    [CLS] (position 0), +10 before `first_null_position`, -10 from there on; qa_outputs reads unit 0 alone.
    Start and end logits are then ~0 at [CLS], ~+7.9 before that position and ~-7.9 from it on. A question of
    n tokens ([CLS] and [SEP] counted) puts its context at positions n and later: for n < first_null_position
    a context span scores ~+15.9 against a null score of ~0 (answer; null score difference ~-15.9), otherwise
    every span scores ~-15.9 (abstain; difference ~+15.9). No short fine-tune moves logits by that much.
    """
    import torch
    from transformers import BertForQuestionAnswering

    build_tiny_bert(out_dir)
    model = BertForQuestionAnswering.from_pretrained(str(out_dir))
    with torch.no_grad():
        emb = model.bert.embeddings
        emb.word_embeddings.weight[:, 0] = 0.0
        emb.token_type_embeddings.weight[:, 0] = 0.0
        emb.position_embeddings.weight[:, 0] = 10.0
        emb.position_embeddings.weight[0, 0] = 0.0
        emb.position_embeddings.weight[first_null_position:, 0] = -10.0
        for layer in model.bert.encoder.layer:
            for dense in (layer.attention.output.dense, layer.output.dense):
                dense.weight.zero_()
                dense.bias.zero_()
        model.qa_outputs.weight.zero_()
        model.qa_outputs.weight[:, 0] = 1.0
        model.qa_outputs.bias.zero_()
    model.save_pretrained(out_dir)
    return out_dir


def _questions(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {qa["id"]: qa for art in data["data"] for par in art["paragraphs"] for qa in par["qas"]}


# eval_* keys that are not scores (timing and counts): everything else must be the scorer's
EVAL_BOOKKEEPING = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_postprocess_seconds",
                    "eval_samples", "eval_examples", "eval_model_preparation_time", "eval_loss"}


def test_version_2_with_negative_abstains_and_answers(tokenizer, demo_files_v2, tmp_path):
    """v2 train + eval where the null path runs both ways: empty answer <=> null score difference > threshold."""
    questions = _questions(demo_files_v2["validation"])
    n_tokens = {qid: len(tokenizer(qa["question"])["input_ids"]) for qid, qa in questions.items()}
    # the question length that splits the questions most evenly into abstentions and answers
    first_null = min(sorted(set(n_tokens.values()))[1:],
                     key=lambda n: abs(2 * sum(v >= n for v in n_tokens.values()) - len(n_tokens)))
    expected_empty = {qid for qid, n in n_tokens.items() if n >= first_null}  # from the model's design alone
    impossible = {qid for qid, qa in questions.items() if not qa["answers"]}
    assert 0 < len(expected_empty) < len(questions) and 0 < len(impossible) < len(questions)
    assert impossible & expected_empty and impossible - expected_empty, "want right and wrong abstentions"

    model = build_null_biased_bert(tmp_path / "model", first_null)
    out = tmp_path / "v2"
    proc = run_qa("--model_name_or_path", str(model), "--train_file", str(demo_files_v2["train"]),
                  "--validation_file", str(demo_files_v2["validation"]), "--version_2_with_negative",
                  "--max_train_samples", "16", "--do_train", "--do_eval", "--output_dir", str(out), *SMALL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    preds = json.loads((out / "eval_predictions.json").read_text())
    odds = json.loads((out / "eval_null_odds.json").read_text())
    assert set(preds) == set(odds) == set(questions)

    threshold = 0.0  # --null_score_diff_threshold's default
    for qid in questions:  # both directions, every question
        assert (preds[qid] == "") == (odds[qid] > threshold), (qid, preds[qid], odds[qid])
    assert {qid for qid, text in preds.items() if text == ""} == expected_empty
    assert all(abs(odds[qid]) > 10 for qid in questions), odds  # the designed margins, not a near tie

    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval_total"] == len(questions)
    assert results["eval_NoAns_total"] == len(impossible)
    assert results["eval_HasAns_total"] == len(questions) - len(impossible)
    # an unanswerable question scores 1 exactly when abstained on (EM and F1 alike)
    no_ans = 100.0 * len(impossible & expected_empty) / len(impossible)
    assert results["eval_NoAns_exact"] == pytest.approx(no_ans) and results["eval_NoAns_f1"] == pytest.approx(no_ans)
    assert 0 < no_ans < 100

    # every score equals the standalone scorer's on the files the run wrote (its default --na_prob_thresh 1.0
    # marks as abstentions only questions whose difference exceeds 0.0, which were answered '' already)
    scorer = subprocess.run([sys.executable, str(REPO / "score_squad.py"), str(demo_files_v2["validation"]),
                             str(out / "eval_predictions.json"), "--version_2_with_negative",
                             "--na_prob_file", str(out / "eval_null_odds.json")],
                            capture_output=True, text=True, timeout=120, env=ENV)
    assert scorer.returncode == 0, scorer.stderr
    scored = {f"eval_{k}": v for k, v in json.loads(scorer.stdout).items()}
    assert {k: results[k] for k in scored} == scored
    assert set(results) - set(scored) - {"epoch"} <= EVAL_BOOKKEEPING, set(results) - set(scored)

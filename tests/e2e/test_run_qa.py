"""run_qa.py end to end as users run it (real processes, tiny random BERT, generated data): mostly what the
shared plain run (tests/fixtures/shared_runs.py) wrote, printed and recorded; runs of their own where a case
needs its own command (eval-only from a JSON config; a rerun, SQuAD v2 and an fp16 checkpoint, these side by
side).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_bert
from fixtures.outputs import temp_files
from fixtures.procs import (
    PYTHON,
    REPO,
    RUN_QA,
    files_under,
    offline_env,
    ok,
    one_error_line,
    run,
    run_qa,
    tiny_flags,
)
from fixtures.runs import (
    PROBE,
    SECRET,
    Run,
    assert_closing_line_is_wall_clock_and_bounded,
    flat,
    plain_flags,
    read,
    windows,
)
from safetensors.torch import load_file

from qa_hpc.tools.collect_results import run_row

# the plain run's --num_train_epochs and --max_train_samples
EPOCHS = 2
TRAIN_QUESTIONS = 8
OUTPUTS = {
    "train_results.json",
    "eval_results.json",
    "predict_results.json",
    "all_results.json",
    "trainer_state.json",
    "run_summary.json",
    "eval_predictions.json",
    "eval_nbest_predictions.json",
    "predict_predictions.json",
    "predict_nbest_predictions.json",
    "config.json",
    "model.safetensors",
}


def score_squad(*args: str) -> dict:
    proc = run([PYTHON, REPO / "score_squad.py", *args], timeout=120)
    ok(proc)
    return json.loads(proc.stdout)


def assert_effective_is_the_plan(summary: dict) -> None:
    """What really ran (read back from the Trainer, the model and torch) is what was planned, field by
    field."""
    plan = summary["plan"]
    effective = summary["effective"]
    shared = set(plan) & set(effective)
    assert {"device", "precision", "tf32", "threads", "dataloader_num_workers", "world_size"} <= shared
    assert {k: effective[k] for k in shared} == {k: plan[k] for k in shared}
    assert effective["param_dtype"] == "float32"


def test_train_eval_predict_writes_what_hf_users_expect(plain: Run, demo_files: dict[str, Path]) -> None:
    out = plain.ok().out
    assert OUTPUTS <= set(files_under(out)) and not (out / "eval_null_odds.json").exists()  # v1: no null odds
    # the model as readable as every other output under the umask (safetensors alone writes it 0600)
    umask = os.umask(0o077)
    os.umask(umask)
    for weights in (out / "model.safetensors", *out.glob("checkpoint-*/model.safetensors")):
        assert weights.stat().st_mode & 0o777 == 0o666 & ~umask, weights
    eval_results = read(out / "eval_results.json")
    assert {"eval_exact_match", "eval_f1", "eval_runtime", "eval_samples_per_second"} <= set(eval_results)
    # long contexts: several windows
    assert eval_results["eval_examples"] == 16 and eval_results["eval_samples"] > 16
    assert eval_results["eval_runtime"] >= eval_results["eval_postprocess_seconds"]
    assert {"train_runtime", "train_samples_per_second", "train_loss"} <= set(
        read(out / "train_results.json")
    )
    assert {"train_loss", "eval_f1", "predict_runtime"} <= set(read(out / "all_results.json"))
    preds, nbest = read(out / "eval_predictions.json"), read(out / "eval_nbest_predictions.json")
    assert len(preds) == 16 and set(nbest) == set(preds)
    for qid, cands in nbest.items():
        assert 1 <= len(cands) <= 20 and cands[0]["text"] == preds[qid]
        assert [c["score"] for c in cands] == sorted((c["score"] for c in cands), reverse=True)
    scored = score_squad(str(demo_files["validation"]), str(out / "eval_predictions.json"))
    assert list(scored) == ["exact_match", "f1"]
    assert {k: eval_results[f"eval_{k}"] for k in scored} == scored  # the standalone scorer's: identical


def test_run_summary_and_final_lines(plain: Run, tiny_bert: Path) -> None:
    out = plain.ok().out
    log = plain.text
    summary = read(out / "run_summary.json")
    eval_results = read(out / "eval_results.json")
    assert {
        "timestamp",
        "gpu_available",
        "gpu_count",
        "gpu_name",
        "cuda_version",
        "torch_version",
        "transformers_version",
        "params",
        "results",
        "wall_clock_seconds",
    } <= set(summary)
    assert (summary["status"], summary["exit_code"]) == ("ok", 0)
    assert summary["results"]["eval_f1"] == eval_results["eval_f1"]
    params = {
        "model": str(tiny_bert),
        "world_size": 1,
        "precision": "fp32",
        "max_seq_length": 128,
        "doc_stride": 32,
        "per_device_train_batch_size": 8,
        "epochs": EPOCHS,
    }
    assert {k: summary["params"][k] for k in params} == params
    assert_closing_line_is_wall_clock_and_bounded(log, summary, plain.measured)
    kv = plain.kv()
    for key in ("eval_f1", "eval_exact_match"):
        assert float(kv[key]) == pytest.approx(eval_results[key], abs=1e-4)
    assert "PLAN device=cpu precision=fp32 (--precision fp32)" in log
    assert "FEATURES_CACHE split=train computed" in log
    # the global batch, and the optimizer steps as the Trainer counted them:
    # 2 epochs of ceil(features / 8) batches
    steps = read(out / "trainer_state.json")["max_steps"]
    assert (
        re.search(
            rf"run_qa: PLAN_BATCH global_batch=8 \(8 per device x 1 processes x 1 accumulation\) "
            rf"optimizer_steps={steps} learning_rate=5e-05$",
            log,
            re.M,
        )
        and "PLAN_SCALING" not in log
    )
    assert re.search(rf"run_qa: PLAN .* threads={summary['plan']['threads']} ", log)
    assert "EFFECTIVE rank=0 precision=fp32 tf32=off param_dtype=float32" in log
    assert_effective_is_the_plan(summary)


def test_efficiency_counts_real_tokens(plain: Run, demo_files: dict[str, Path]) -> None:
    results = read(plain.ok().out / "run_summary.json")["results"]
    kv = plain.kv()
    assert float(kv["TRAIN_TOKENS_PER_SECOND"]) == pytest.approx(results["train_tokens_per_second"], rel=1e-3)
    assert kv["MFU"].startswith("n/a") and results["train_achieved_tflops"] > 0  # CPU: achieved FLOP/s only
    # real tokens: every window's attention mask summed (tokenized here), times the epochs trained
    enc = windows(flat(read(demo_files["train"]))[:TRAIN_QUESTIONS])
    features = len(enc["input_ids"])
    real_tokens = sum(map(sum, enc["attention_mask"]))
    assert results["train_samples"] == features and results["train_real_tokens"] == real_tokens * EPOCHS
    assert f"TOKENS split=train features={features} real_tokens={real_tokens}" in plain.text
    runtime = results["train_runtime"]
    assert results["train_tokens_per_second"] == pytest.approx(real_tokens * EPOCHS / runtime, rel=1e-6)
    assert results["train_samples_per_second"] == pytest.approx(features * EPOCHS / runtime, rel=1e-3)


def test_token_is_never_printed_or_written(plain: Run) -> None:
    assert SECRET not in plain.ok().text  # --log_level debug, stdout and stderr
    written = [p for p in plain.out.rglob("*") if p.is_file()]
    assert any(p.name == "run_summary.json" for p in written)
    assert [str(p) for p in written if SECRET.encode() in p.read_bytes()] == []


def test_eval_only_from_a_json_config_reuses_features_and_writes_identical_files(
    plain: Run, demo_files: dict[str, Path], features_cache: Path, tmp_path: Path
) -> None:
    """The trained model, from an args.json: features come from the cache, the prediction files are the
    training run's byte for byte, and `evaluate` writes only into HF_HOME (nothing in the cwd). A SIGTERM
    while it evaluates: the evaluation finishes, and the log says the signal came."""
    out = tmp_path / "eval"
    hf_home = tmp_path / "hf_home"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    config = {
        "model_name_or_path": str(plain.ok().out),
        "validation_file": str(demo_files["validation"]),
        "do_eval": True,
        "output_dir": str(out),
        "max_seq_length": 128,
        "doc_stride": 32,
        "per_device_eval_batch_size": 16,
        "report_to": "none",
        "features_cache_dir": str(features_cache),
        "precision": "fp32",
    }  # as the plain run
    (tmp_path / "args.json").write_text(json.dumps(config))
    env = offline_env(HF_HOME=str(hf_home), PYTHONPATH=str(REPO), QA_PROBE_SIGNAL_IN_EVAL="SIGTERM")
    log = ok(run([PYTHON, PROBE, str(tmp_path / "args.json")], env=env, cwd=str(cwd)))
    assert log.count("STOP_REQUESTED") == 1
    assert "STOP_REQUESTED signal=SIGTERM outside training: finishing the run" in log
    assert "FEATURES_CACHE split=eval reused" in log
    for name in ("eval_predictions.json", "eval_nbest_predictions.json"):
        assert (out / name).read_bytes() == (plain.out / name).read_bytes(), name
    copies = [p for p in files_under(hf_home / "modules") if p.endswith("evaluate_squad_v1.py")]
    assert len(copies) == 1, files_under(hf_home)  # evaluate imports its copy of the local module
    assert (hf_home / "metrics" / "evaluate_squad_v1" / "default").is_dir()
    assert files_under(hf_home / "metrics") == [], "keep_in_memory: no Arrow cache files"
    assert files_under(cwd) == [], "nothing lands in the working directory"
    # an evaluation-only run has no training estimate; its peak is still the table's peak memory
    row = run_row(out)
    memory = json.loads((out / "memory.json").read_text())
    assert row["peak_memory_mb"] == memory["max_over_ranks"]["cpu_peak_rss_mb"] > 0
    assert row["peak_memory_source"] == "rss" and memory["estimate"] is None


# own_runs builds models in this process one at a time: build_tiny_bert seeds torch's global generator
BUILDING = threading.Lock()
RESULTS = ("trainer_state.json", "train_results.json", "eval_results.json", "all_results.json")


def rerun_into_a_copy(
    plain: Run, tiny_bert: Path, demo_files: dict[str, Path], tmp: Path
) -> tuple[str, str, Path, Path]:
    """The plain run's command again, into a copy of its output dir whose RESULTS have hard links in
    tmp/old_inodes; then with a third epoch: the two logs, the copy, the links' folder."""
    out = tmp / "out"
    keep = tmp / "old_inodes"
    shutil.copytree(plain.ok().out, out)
    keep.mkdir()
    for name in RESULTS:
        os.link(out / name, keep / name)
    flags = [*plain_flags(tiny_bert, demo_files, out), "--report_to", "none"]
    same = ok(run_qa(flags), 2)
    # as if the run had been stopped at its last step, or killed in its evaluation: no record of an end
    (out / "run_summary.json").unlink()
    (out / "eval_results.json").unlink()
    after_last_step = ok(run_qa(flags))
    ok(run_qa(flags), 2)  # its record ends ok: the same command again is the run repeated
    longer = ok(run_qa([*flags, "--num_train_epochs", str(EPOCHS + 1)]))
    return same, after_last_step, longer, out, keep


def test_a_finished_run_is_not_trained_again_and_a_longer_one_resumes_replacing_its_files(
    plain: Run, own_runs: dict[str, Future]
) -> None:
    """The same command again after a finished training finds nothing left to train: it stops (exit 2)
    before writing anything (it used to train no step, or one past --max_steps, and replace the results
    with that launch's). Without the record of that end (stopped at its last step, or killed in its
    evaluation) it trains nothing and evaluates the last checkpoint's model. With one more epoch it resumes:
    no step is trained twice. Hard links keep the old files' inodes, so a write in place (which a crash
    truncates) would show through them."""
    same, after_last_step, longer, out, keep = own_runs["rerun"].result()
    before = read(plain.out / "trainer_state.json")
    steps = before["global_step"]
    checkpoint = out / f"checkpoint-{steps}"
    assert one_error_line(same) == (
        f"ERROR: --output_dir {out} holds a finished training (run_summary.json: status ok) and its last "
        f"checkpoint {checkpoint} leaves nothing to train. To evaluate the trained model: "
        f"--model_name_or_path {out} --do_eval without --do_train, into another --output_dir; to train "
        "again: --overwrite_output_dir or another --output_dir"
    )
    assert "RESUME_FROM" not in same  # nothing was resumed
    assert f"TRAINED_BEFORE checkpoint={checkpoint} " in after_last_step
    assert "'loss'" not in after_last_step and "RESUME_FROM" not in after_last_step
    # evaluated as at the training's end, not at step 0: the epoch is the checkpoint's
    evaluated = re.search(r"^\{'eval_.*'epoch': '?([\d.]+)'?\}$", after_last_step, re.M)
    assert evaluated and float(evaluated.group(1)) == EPOCHS, after_last_step[-3000:]
    assert read(out / "eval_results.json")["eval_f1"] == read(plain.out / "eval_results.json")["eval_f1"]
    assert f"RESUME_FROM={checkpoint} " in longer
    epochs = [float(e) for e in re.findall(r"^\{'loss'.*'epoch': '?([\d.]+)", longer, re.M)]
    assert epochs and all(epoch > EPOCHS for epoch in epochs), longer[-3000:]  # the third epoch's steps only
    trained_steps = lambda state: [h for h in state["log_history"] if "train_runtime" not in h]  # noqa: E731
    assert trained_steps(read(out / "trainer_state.json"))[: len(trained_steps(before))] == trained_steps(
        before
    )
    assert read(out / "trainer_state.json")["global_step"] > steps
    for name in RESULTS:
        assert (keep / name).read_bytes() == (plain.out / name).read_bytes(), f"{name} was written in place"
        assert (out / name).stat().st_ino != (keep / name).stat().st_ino, name
    assert temp_files(out) == []


def build_null_biased_bert(out_dir: Path, first_null_position: int) -> Path:
    """A tiny BERT for QA that abstains exactly on questions of `first_null_position` tokens or more.

    Zeroed sublayer outputs leave each token's hidden state the LayerNorm of its embeddings; hidden unit 0,
    the only one qa_outputs reads, is 0 at [CLS], +10 before `first_null_position` and -10 from it. A question
    of n tokens puts its context at positions >= n: spans score ~+15.9 against a null ~0 when n <
    first_null_position, else ~-15.9 (abstain). No short fine-tune moves logits by that much.
    """
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


# eval_* keys that are not scores (timing and counts): everything else must be the scorer's
EVAL_BOOKKEEPING = {
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
    "eval_postprocess_seconds",
    "eval_samples",
    "eval_examples",
    "eval_model_preparation_time",
    "eval_loss",
}
# --null_score_diff_threshold: not the default 0.0, so the run must pass its own to the metric
THRESHOLD = "5.0"


def null_design(tokenizer, demo_files_v2: dict[str, Path]) -> tuple[dict, dict[str, int], int]:
    """The v2 validation questions by id, their lengths in tokens, and the question length that splits them
    most evenly into abstentions and answers (build_null_biased_bert's first_null_position)."""
    questions = {qa["id"]: qa for qa in flat(read(demo_files_v2["validation"]))}
    n_tokens = {qid: len(tokenizer(qa["question"])["input_ids"]) for qid, qa in questions.items()}
    first_null = min(
        sorted(set(n_tokens.values()))[1:],
        key=lambda n: abs(2 * sum(v >= n for v in n_tokens.values()) - len(n_tokens)),
    )
    return questions, n_tokens, first_null


def v2_run(tokenizer, demo_files_v2: dict[str, Path], tmp: Path) -> Path:
    """v2 train + eval of the null-biased BERT, at --null_score_diff_threshold THRESHOLD: its output dir."""
    with BUILDING:
        model = build_null_biased_bert(tmp / "model", null_design(tokenizer, demo_files_v2)[2])
    out = tmp / "v2"
    ok(
        run_qa(
            tiny_flags(
                model,
                out,
                "--train_file",
                str(demo_files_v2["train"]),
                "--validation_file",
                str(demo_files_v2["validation"]),
                "--version_2_with_negative",
                "--null_score_diff_threshold",
                THRESHOLD,
                "--max_train_samples",
                "16",
                "--do_train",
                "--do_eval",
                "--per_device_train_batch_size",
                "8",
                "--num_train_epochs",
                "1",
                "--seed",
                "7",
            )
        )
    )
    return out


def test_version_2_with_negative_abstains_and_answers(
    tokenizer, demo_files_v2: dict[str, Path], own_runs: dict[str, Future]
):
    """v2 train + eval where the null path runs both ways:
    empty answer <=> null score difference > threshold."""
    questions, n_tokens, first_null = null_design(tokenizer, demo_files_v2)
    expected_empty = {qid for qid, n in n_tokens.items() if n >= first_null}  # from the model's design alone
    impossible = {qid for qid, qa in questions.items() if not qa["answers"]}
    assert 0 < len(expected_empty) < len(questions) and 0 < len(impossible) < len(questions)
    assert impossible & expected_empty and impossible - expected_empty, "want right and wrong abstentions"

    out = own_runs["v2"].result()
    preds, odds = read(out / "eval_predictions.json"), read(out / "eval_null_odds.json")
    assert set(preds) == set(odds) == set(questions)
    for qid in questions:  # both directions, every question
        assert (preds[qid] == "") == (odds[qid] > float(THRESHOLD)), (qid, preds[qid], odds[qid])
    assert {qid for qid, text in preds.items() if text == ""} == expected_empty
    assert all(abs(odds[qid]) > 10 for qid in questions), odds  # the designed margins, not a near tie

    results = read(out / "eval_results.json")
    assert [results[f"eval_{k}total"] for k in ("", "NoAns_", "HasAns_")] == [
        len(questions),
        len(impossible),
        len(questions) - len(impossible),
    ]
    # an unanswerable question scores 1 exactly when abstained on (EM and F1 alike)
    no_ans = 100.0 * len(impossible & expected_empty) / len(impossible)
    assert results["eval_NoAns_exact"] == pytest.approx(no_ans) and results["eval_NoAns_f1"] == pytest.approx(
        no_ans
    )
    # every score equals the standalone scorer's on the files the run wrote, at the run's threshold
    scored = score_squad(
        str(demo_files_v2["validation"]),
        str(out / "eval_predictions.json"),
        "--version_2_with_negative",
        "--na_prob_file",
        str(out / "eval_null_odds.json"),
        "--na_prob_thresh",
        THRESHOLD,
    )
    assert {"exact", "f1", "total", "HasAns_total", "NoAns_total", "best_f1", "best_f1_thresh"} <= set(scored)
    assert {k: results[f"eval_{k}"] for k in scored} == scored  # identical, not merely close
    assert set(results) - {f"eval_{k}" for k in scored} - {"epoch"} <= EVAL_BOOKKEEPING


def fp16_run(tiny_bert: Path, demo_files: dict[str, Path], tmp: Path) -> tuple[str, Path, Path]:
    """Two training steps from tiny_bert saved in fp16: the run's output, the fp16 model's dir, its output
    dir."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    half = tmp / "half"
    out = tmp / "out"
    with BUILDING:
        AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert)).half().save_pretrained(half)
        AutoTokenizer.from_pretrained(str(tiny_bert)).save_pretrained(half)
    args = tiny_flags(half, out, "--do_train", "--train_file", str(demo_files["train"]), "--max_steps", "2")
    return ok(run_qa(args)), half, out


def test_fp16_checkpoint_trains_with_fp32_weights_as_planned(own_runs: dict[str, Future]):
    from transformers import AutoModelForQuestionAnswering

    log, half, out = own_runs["fp16"].result()
    # what "auto" would give
    assert AutoModelForQuestionAnswering.from_pretrained(str(half)).dtype == torch.float16
    assert re.search(r"^EFFECTIVE rank=0 precision=fp32 tf32=off param_dtype=float32 ", log, re.M)
    assert_effective_is_the_plan(read(out / "run_summary.json"))
    assert load_file(out / "model.safetensors")["qa_outputs.weight"].dtype == torch.float32


def test_a_run_of_max_steps_reports_the_trainers_features_per_second_everywhere(own_runs: dict[str, Future]):
    """--max_steps 2 over features that two batches do not divide evenly: the Trainer counts 2 whole batches
    (as HF's own script does); the closing line, the record and the results files say that one figure (the
    record and the log had the features trained in an epoch's share, another)."""
    log, _, out = own_runs["fp16"].result()
    trainer = read(out / "train_results.json")["train_samples_per_second"]
    recorded = read(out / "run_summary.json")["results"]["train_samples_per_second"]
    logged = float(re.search(r"^TRAIN_SAMPLES_PER_SECOND=(\S+)$", log, re.M).group(1))
    assert recorded == pytest.approx(trainer, abs=1e-3) and logged == pytest.approx(trainer, abs=1e-3)
    assert read(out / "all_results.json")["train_samples_per_second"] == trainer


@pytest.fixture(scope="module")
def own_runs(
    plain: Run, tiny_bert: Path, demo_files, demo_files_v2, tokenizer, tmp_path_factory
) -> dict[str, Future]:
    """The runs of the module's own that need nothing but the shared plain run (a rerun of it, SQuAD v2, an
    fp16 checkpoint), all side by side (each is mostly python's start-up): by name, what each returned (or
    raised) for its test to collect."""
    starts = {
        "rerun": partial(rerun_into_a_copy, plain, tiny_bert, demo_files),
        "v2": partial(v2_run, tokenizer, demo_files_v2),
        "fp16": partial(fp16_run, tiny_bert, demo_files),
    }
    with ThreadPoolExecutor(max_workers=len(starts)) as pool:  # leaving it waits for every run
        return {name: pool.submit(start, tmp_path_factory.mktemp(name)) for name, start in starts.items()}


def test_persistent_workers_answer_as_the_plain_run(
    plain: Run, tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """The plain run with a dataloader worker, kept from pass to pass (the plan's default wherever there are
    workers): the same answers for the eval and the test split, each read from its own split's loader (the
    Trainer hands its one cached evaluation loader out again whatever dataset is asked for)."""
    out = tmp_path / "workers"
    flags = plain_flags(tiny_bert, demo_files, out)
    log = ok(
        run_qa(
            [*flags, "--do_predict", "--test_file", str(demo_files["test"]), "--dataloader_num_workers", "1"]
        )
    )
    assert "persistent_workers=on (auto: workers forked once per split, not once per pass)" in log
    assert re.search(r"^EFFECTIVE rank=0 .*dataloader_workers=1 .*persistent_workers=True", log, re.M)
    plain_out = plain.ok().out
    for name in ("eval_predictions.json", "predict_predictions.json"):
        assert read(out / name) == read(plain_out / name), name


def test_a_test_file_without_answers_is_predicted_not_scored(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """--test_file's records may leave 'answers' out (unlabelled questions): the run writes the predictions
    and no score (it used to stop after them, exit 1, finding no gold answers; under
    --version_2_with_negative, which takes the same path, it scored every question as unanswerable)."""
    from qa_hpc.squad_io import load_qa_records

    records, _ = load_qa_records(demo_files["test"], split="test")
    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "answers"}) + "\n" for r in records)
    )
    out = tmp_path / "out"
    ok(run_qa(tiny_flags(tiny_bert, out, "--do_predict", "--test_file", str(unlabelled))))
    results = read(out / "predict_results.json")
    assert results["predict_examples"] == len(records)
    assert not [key for key in results if "f1" in key or "exact" in key], results
    assert set(read(out / "predict_predictions.json")) == {r["id"] for r in records}


def test_help_is_the_usage_text_alone() -> None:
    """--help prints argparse's usage and nothing before it (the RANK_PID line came first)."""
    proc = run([PYTHON, RUN_QA, "--help"], timeout=120, env=offline_env())
    assert proc.returncode == 0 and proc.stdout.startswith("usage: run_qa.py "), proc.stdout[:500]

"""Speed flags through real run_qa.py processes: the plan and what really ran, efficiency lines, feature cache
reuse, vectorized and loop postprocessing writing identical prediction files, clear refusals.
(The plan's decisions for every device: tests/unit/test_plan.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fixtures.procs import offline_env
from fixtures.runqa import run_qa

EPOCHS = 2


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_qa(args, timeout=900, env=offline_env(), cwd=str(cwd))


def _common(tiny_bert, demo_files, cache, epochs: int = 1) -> list[str]:
    return ["--model_name_or_path", str(tiny_bert), "--train_file", str(demo_files["train"]),
            "--validation_file", str(demo_files["validation"]), "--max_seq_length", "128", "--doc_stride", "32",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--num_train_epochs", str(epochs),
            "--report_to", "none", "--features_cache_dir", str(cache), "--seed", "0"]


def _real_tokens_by_hand(tiny_bert: Path, train_file: Path) -> tuple[int, int]:
    """(features, real tokens) of the train split at 128/32, tokenized here as the HF recipe does.

    Windows of question + context (question stripped of leading spaces, context truncated, stride 32),
    no padding: every token of a window is real, so its length is its attention mask's sum.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    data = json.loads(train_file.read_text(encoding="utf-8"))["data"]
    pairs = [(qa["question"].lstrip(), p["context"]) for a in data for p in a["paragraphs"] for qa in p["qas"]]
    enc = tokenizer([q for q, _ in pairs], [c for _, c in pairs], truncation="only_second", max_length=128,
                    stride=32, return_overflowing_tokens=True)
    return len(enc["input_ids"]), sum(sum(mask) for mask in enc["attention_mask"])


@pytest.fixture(scope="module")
def trained(tiny_bert, demo_files, tmp_path_factory):
    """One default training + eval run (train features computed), shared by the tests below."""
    tmp = tmp_path_factory.mktemp("speed")
    out = tmp / "train"
    proc = _run(_common(tiny_bert, demo_files, tmp / "cache", EPOCHS) + ["--do_train", "--do_eval", "--output_dir",
                                                                        str(out)], tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, out, proc


@pytest.mark.e2e
def test_default_run_reports_speed_plan_and_efficiency(trained, tiny_bert, demo_files):
    tmp, out, proc = trained
    log = proc.stdout + proc.stderr
    assert "PLAN device=cpu precision=fp32 (auto: CPU)" in log
    assert "EFFECTIVE rank=0 precision=fp32 tf32=off param_dtype=float32" in log and "postprocess=vectorized" in log
    assert "FEATURES_CACHE split=train computed" in log
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("WALL_CLOCK_SECONDS=")
    kv = dict(line.split("=", 1) for line in lines if "=" in line and line.split("=", 1)[0].isupper())
    summary = json.loads((out / "run_summary.json").read_text())
    results = summary["results"]
    assert float(kv["TRAIN_TOKENS_PER_SECOND"]) == pytest.approx(results["train_tokens_per_second"], rel=1e-3)
    assert kv["MFU"].startswith("n/a")  # CPU: achieved FLOP/s only
    assert results["train_achieved_tflops"] > 0
    # real tokens: every window's attention mask summed, tokenized here, times the epochs trained
    features, real_tokens = _real_tokens_by_hand(tiny_bert, demo_files["train"])
    assert results["train_samples"] == features
    assert results["train_real_tokens"] == real_tokens * EPOCHS
    assert results["train_tokens_per_second"] == pytest.approx(real_tokens * EPOCHS / results["train_runtime"],
                                                               rel=1e-6)
    assert results["train_samples_per_second"] == pytest.approx(features * EPOCHS / results["train_runtime"],
                                                                rel=1e-3)
    assert summary["plan"]["precision"] == summary["effective"]["precision"] == "fp32"
    assert summary["params"]["precision"] == "fp32" and summary["status"] == "ok" and summary["exit_code"] == 0


@pytest.mark.e2e
def test_second_run_reuses_features_and_loop_postprocess_gives_identical_files(trained, tiny_bert, demo_files):
    tmp, out, _ = trained
    loop_out = tmp / "eval_loop"
    args = _common(out, demo_files, tmp / "cache")  # the trained model, same data and settings
    proc = _run(args + ["--do_eval", "--postprocess", "loop", "--output_dir", str(loop_out)], tmp)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "FEATURES_CACHE split=eval reused" in log
    assert "postprocess=loop" in log
    for name in ("eval_predictions.json", "eval_nbest_predictions.json"):
        assert (loop_out / name).read_bytes() == (out / name).read_bytes(), name


@pytest.mark.e2e
def test_fp16_on_cpu_is_refused_clearly(tiny_bert, demo_files, tmp_path):
    proc = _run(_common(tiny_bert, demo_files, tmp_path / "cache")
                + ["--do_eval", "--precision", "fp16", "--output_dir", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2
    assert "ERROR: fp16 (--precision fp16) is not supported on CPU" in proc.stdout + proc.stderr
    assert not (tmp_path / "o" / "eval_predictions.json").exists()


@pytest.mark.parametrize("precision, want", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_precision_applies_to_evaluation(tiny_bert, tmp_path, precision, want):
    """--precision bf16 is autocast in the eval forward too (matmuls run in bf16), fp32 stays fp32."""
    import datasets
    from transformers import AutoModelForQuestionAnswering, Trainer

    from qa_hpc.flags import decide_and_build, read_flags

    plan, flags = decide_and_build(read_flags(["--output_dir", str(tmp_path / "o"), "--report_to", "none",
                                               "--precision", precision]))
    args = flags.training
    assert plan.precision == precision and args.bf16 == (precision == "bf16")
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert))
    seen = []
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    trainer = Trainer(model=model, args=args)
    trainer.predict(datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102] * 4], "attention_mask": [[1] * 12]}))
    assert seen == [f"torch.{want}"]

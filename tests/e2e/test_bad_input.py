"""Bad input ends with exit 2 (74 for an unwritable output dir), one ERROR line naming the file, the record
and the field, no traceback and nothing written; code inside a model directory never runs unasked (pickled
weights: here, and the loader in tests/unit/test_model.py). Most cases run run_qa.cli(argv) in-process (the
exit code and stderr a user sees); the shared failed run and the missing-model cases meet bad input in real
processes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from unittest import mock

import datasets
import pytest
import torch
import transformers
from fixtures.procs import (
    PYTHON,
    RUN_QA,
    offline_env,
    ok,
    one_error_line,
    output,
    run,
    side_by_side,
    tiny_flags,
)
from fixtures.runs import Run
from fixtures.shared_runs import missing_cases

# the libraries' log handlers keep the stderr they were created with: create them now (the session's stderr),
# not inside a test's capture, whose stream closes with the test
transformers.utils.logging.get_verbosity()
datasets.utils.logging.get_verbosity()


def _rec(i: int, **over) -> dict:
    ctx = f"Record {i} is about the city of Zorbal, which lies on the river Quent."
    return {
        "id": f"q{i}",
        "title": "t",
        "context": ctx,
        "question": f"Where does Zorbal lie ({i})?",
        "answers": {"text": ["the river Quent"], "answer_start": [ctx.index("the river Quent")]},
        **over,
    }


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


# a record whose context is zero-width spaces, and its answer one of them
ZERO_WIDTH_CONTEXT = _j(
    [_rec(0), _rec(1, context="\u200b\u200b \u200b", answers={"text": ["\u200b"], "answer_start": [0]})]
)

# One case per way into run_qa's checks: the reader on the train file, on a later split, the features (each
# message of the reader itself, a missing file and a file of another format too: tests/unit/test_squad_io.py;
# a record's answer: the shared failed run below). Each: the file, which flag gets it, what the error names.
CASES = [
    pytest.param(
        "trunc.json",
        _j([_rec(0), _rec(1)])[:-7],
        "train",
        ["trunc.json", "not valid JSON", "line 1", "truncated"],
        id="truncated_json",
    ),
    pytest.param(
        "emptyctx.json",
        _j([_rec(0), _rec(1, context="")]),
        "validation",
        ["emptyctx.json", "[1]", "'q1'", "field 'context'", "empty"],
        id="empty_context_in_validation",
    ),
    pytest.param(
        "longq.json",
        _j([_rec(0), _rec(1, question=" ".join(["why"] * 120))]),
        "train",
        [
            "longq.json: [1] (id 'q1'): field 'question': has 120 tokens",
            "--max_seq_length 128",
            "--doc_stride",
        ],
        id="question_too_long",
    ),
    # characters the tokenizer drops pass the reader's checks (they are not whitespace to Python)
    pytest.param(
        "zwsp.json",
        ZERO_WIDTH_CONTEXT,
        "train",
        ["zwsp.json: [1] (id 'q1'): field 'context': has no tokens once tokenized", "zero-width"],
        id="context_without_tokens_in_train",
    ),
    pytest.param(
        "zwsp_eval.json",
        ZERO_WIDTH_CONTEXT,
        "validation",
        ["zwsp_eval.json: [1] (id 'q1'): field 'context': has no tokens once tokenized"],
        id="context_without_tokens_in_validation",
    ),
]


def run_qa_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`python run_qa.py ARGV` in this process: (exit code, stdout + stderr, stderr). run_qa.main sets up the
    process it runs in (environment, signals, threads, logging): undone after."""
    import run_qa

    threads = torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    root = logging.getLogger()
    root_handlers = root.handlers[:]
    root_level = root.level
    try:
        with mock.patch.dict(os.environ), mock.patch.object(sys, "argv", ["run_qa.py", *argv]):
            code = run_qa.cli()
    finally:
        torch.set_num_threads(threads)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        transformers.utils.logging.set_verbosity_warning()
        datasets.utils.logging.set_verbosity_warning()
    out, err = capsys.readouterr()
    return code, out + err, err


def _check(argv: list[str], tmp_path: Path, capsys, expect: list[str], code: int = 2) -> str:
    """run_qa ARGV exits `code` with one ERROR line holding each piece of `expect`, no traceback, no file."""
    before = sorted(tmp_path.rglob("*"))  # files and folders
    got, output, stderr = run_qa_cli(argv, capsys)
    assert got == code, f"exit {got}, expected {code}:\n{output[-3000:]}"
    error = one_error_line(stderr)
    for piece in expect:
        assert piece in error, f"{piece!r} not in {error!r}"
    assert "Traceback" not in output  # not on stdout either
    assert sorted(tmp_path.rglob("*")) == before, "files written despite bad input"
    return error


@pytest.mark.parametrize("filename, content, split, expect", CASES)
def test_run_qa_rejects(
    filename: str, content: bytes, split: str, expect: list[str], tiny_bert: Path, tmp_path: Path, capsys
) -> None:
    path = tmp_path / filename
    path.write_bytes(content)
    if split == "train":
        data = ["--do_train", "--train_file", str(path)]
    else:  # a good train file first: its features are built, then the bad validation file stops the run
        train_ok = tmp_path / "train_ok.json"
        train_ok.write_bytes(_j([_rec(i) for i in range(4)]))
        data = ["--do_train", "--do_eval", "--train_file", str(train_ok), "--validation_file", str(path)]
    line = _check(tiny_flags(tiny_bert, tmp_path / "out", *data), tmp_path, capsys, expect)
    assert "'q0'" not in line  # a good record wherever it is (question_too_long: q0 passed, q1 is named)


@pytest.mark.parametrize(
    "flags, expect, code",
    [
        (
            ["--output_dir", "/dev/null/out"],
            ["cannot create --output_dir /dev/null/out: Not a directory"],
            74,
        ),
        (
            ["--output_dir", "TMP", "--do_train", "--train_file", "TRAIN"],
            ["--overwrite_output_dir", "notes.txt"],
            2,
        ),
        (["--precision", "fp16"], ["fp16 (--precision fp16) is not supported on CPU"], 2),
        (
            ["--report_to", "tensorboard", "--logging_dir", "/dev/null/tb"],
            ["cannot create --logging_dir /dev/null/tb: Not a directory"],
            74,
        ),
        (
            ["--profile", "--profile_dir", "/dev/null/profile", "--do_train", "--train_file", "TRAIN"],
            ["cannot create --profile_dir /dev/null/profile: Not a directory"],
            74,
        ),
        (
            ["--features_cache_dir", "/dev/null/features"],
            ["cannot create --features_cache_dir /dev/null/features: Not a directory"],
            74,
        ),
        (["--seed", "-1"], ["--seed -1: give a number from 0 to 2**32 - 1"], 2),
        (
            ["--do_train", "--train_file", "TRAIN", "--num_train_epochs", "0"],
            ["--num_train_epochs 0 trains no step: give a number above 0, or --max_steps N"],
            2,
        ),
        (["--attn_implementation", "foo"], ["--attn_implementation foo: give one of sdpa, eager, "], 2),
        (
            ["--attn_implementation", "flash_attention_2"],
            ["flash_attention_2 needs a GPU of compute capability 8.0 or newer; this run is on a CPU"],
            2,
        ),
        (
            ["--model_name_or_path", "TMP"],
            ["model 'TMP' (a local path) cannot be loaded: ValueError: Unrecognized model in TMP"],
            2,
        ),
        (["--do_train", "--dataset_name", "MISSING"], ["dataset 'MISSING': no such file or folder"], 2),
        (["--null_score_diff_threshold", "nan"], ["--null_score_diff_threshold nan: give a number"], 2),
        (
            ["--max_seq_length", "600"],
            ["--max_seq_length 600: ", "takes at most 512 tokens (model_max_length of its tokenizer)"],
            2,
        ),
    ],
    ids=[
        "unwritable-output-dir",
        "non-empty-output-dir-without-checkpoint",
        "fp16-on-cpu",
        "unwritable-logging-dir",
        "unwritable-profile-dir",
        "unwritable-features-cache",
        "negative-seed",
        "no-epochs",
        "unknown-attention",
        "flash-attention-on-cpu",
        "model-folder-without-config",
        "no-such-dataset-folder",
        "nan-threshold",
        "longer-than-the-model-takes",
    ],
)
def test_settings_that_cannot_work_are_refused_before_training(
    flags, expect, code, tiny_bert, demo_files, tmp_path, capsys
) -> None:
    (tmp_path / "notes.txt").write_text("mine")  # the user's file: TMP is not empty
    named = {"TRAIN": str(demo_files["train"]), "TMP": str(tmp_path), "MISSING": str(tmp_path / "none")}
    flags = [named.get(flag, flag) for flag in flags]
    expect = [named["TMP"].join(piece.split("TMP")) for piece in expect]
    expect = [named["MISSING"].join(piece.split("MISSING")) for piece in expect]
    _check(evaluate_two(tiny_bert, demo_files, tmp_path / "out", *flags), tmp_path, capsys, expect, code)


def evaluate_two(tiny_bert: Path, demo_files: dict[str, Path], out: Path, *flags: str) -> list[str]:
    """run_qa.py's flags to evaluate the tiny model on 2 demo questions into `out`, then `flags`."""
    return tiny_flags(
        tiny_bert,
        out,
        "--do_eval",
        "--validation_file",
        str(demo_files["validation"]),
        "--max_eval_samples",
        "2",
        *flags,
    )


def test_an_unwritable_module_cache_is_exit_74_naming_it(tiny_bert, demo_files, tmp_path) -> None:
    """evaluate copies the SQuAD metric into its module cache (HF_HOME/modules): a read-only shared HF_HOME
    is one line naming it, exit 74, before any output folder is made (it was a traceback, exit 1). A process
    of its own: evaluate reads HF_MODULES_CACHE when it is imported."""
    argv = evaluate_two(tiny_bert, demo_files, tmp_path / "out")
    proc = run([PYTHON, RUN_QA, *argv], env=offline_env(HF_MODULES_CACHE="/dev/null/modules"))
    error = one_error_line(ok(proc, 74))
    assert error == (
        "ERROR: cannot create evaluate's module cache (HF_MODULES_CACHE, else HF_HOME/modules) "
        "/dev/null/modules: Not a directory"
    ), error
    assert not (tmp_path / "out").exists()


def test_a_diverged_model_at_eval_is_one_error_and_a_failed_record(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """Weights holding NaN, as a training run that diverged leaves them: the evaluation stops with exit 2 and
    one ERROR line saying so, writes no predictions, and run_summary.json records the failed run."""
    model_dir = tmp_path / "diverged"
    shutil.copytree(tiny_bert, model_dir)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert))
    with torch.no_grad():
        model.qa_outputs.weight.fill_(float("nan"))
    model.save_pretrained(model_dir)
    out = tmp_path / "out"
    validation = ["--validation_file", str(demo_files["validation"]), "--max_eval_samples", "2"]
    code, output, stderr = run_qa_cli(tiny_flags(model_dir, out, "--do_eval", *validation), capsys)
    assert code == 2, output[-3000:]
    error = one_error_line(stderr)
    assert error.startswith("ERROR: eval logits have ") and "NaN values" in error, error
    assert "the model diverged, so no answers were written" in error and "Traceback" not in output
    summary = json.loads((out / "run_summary.json").read_text(encoding="utf-8"))
    assert (summary["status"], summary["exit_code"]) == ("failed", 2)
    assert summary["error"] == "DivergedModel: " + error.removeprefix("ERROR: ")
    assert not (out / "eval_predictions.json").exists()


# ----------------------------------------------------------------- real processes


def test_a_real_run_on_bad_input_exits_2_naming_file_record_and_field(failed: Run) -> None:
    """The shared failed run: its first answer_start is 3 characters off; it stops before the model loads."""
    error = one_error_line(failed.text)
    assert failed.returncode == 2, failed.text[-3000:]
    for piece in (
        "broken_train.json",
        "data[0].paragraphs[0].qas[0]",
        "answers[0].text",
        "not found at answer_start",
    ):
        assert piece in error, (piece, error)
    assert "WALL_CLOCK_SECONDS" not in failed.text and not failed.out.exists()
    assert "Loading weights" not in failed.text


@pytest.mark.parametrize("offline", [True, False])
def test_missing_model_or_dataset_is_one_clear_error(
    missing_runs: dict[bool, tuple[Path, list]], tiny_bert: Path, offline: bool
) -> None:
    """A compute node where setup_bert.sh never ran; offline=False: the hub is asked and cannot be reached.
    Real processes (the hub's settings are read once per process), started with the session
    (tests/fixtures/shared_runs.py: the online ones mostly wait)."""
    folder, procs = missing_runs[offline]
    why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the hub could not be reached"
    for proc, (_, what, alternative) in zip(procs, missing_cases(tiny_bert, folder / "empty_cache")):
        error = one_error_line(ok(proc, 2))
        assert (
            error.startswith(f"ERROR: {what}, and {why}: get it with 'bash setup_bert.sh'")
            and alternative in error
        )
        assert not (folder / "out").exists()


def model_with_code(tiny_bert: Path, model: Path, marker: Path) -> Path:
    """A copy of tiny_bert whose config asks to run its own Python code, which creates `marker` if it runs."""
    shutil.copytree(tiny_bert, model)
    (model / "custom_bert.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig, BertForQuestionAnswering\n"
        "class CustomConfig(BertConfig):\n    model_type = 'bert'\n"
        "class CustomQA(BertForQuestionAnswering):\n    config_class = CustomConfig\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "custom_bert.CustomConfig",
        "AutoModelForQuestionAnswering": "custom_bert.CustomQA",
    }
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_remote_code_runs_only_with_the_flag(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path
) -> None:
    """Without --trust_remote_code the model's own code does not run; the control, with it, shows it would."""
    markers = {}
    runs = []
    # each its own model and cache
    for name, flags in (("plain", []), ("trusted", ["--trust_remote_code", "true"])):
        markers[name] = tmp_path / f"REMOTE_CODE_RAN_{name}"
        model = model_with_code(tiny_bert, tmp_path / f"model_{name}", markers[name])
        args = tiny_flags(
            model,
            tmp_path / f"out_{name}",
            "--do_eval",
            "--validation_file",
            str(demo_files["validation"]),
            "--max_eval_samples",
            "2",
            *flags,
        )
        runs.append(([PYTHON, RUN_QA, *args], offline_env(HF_HOME=str(tmp_path / f"hf_home_{name}"))))
    plain, trusted = side_by_side(*runs)
    assert not markers["plain"].exists(), "model code ran without --trust_remote_code"
    ok(plain)  # the built-in BERT code is used
    assert markers["trusted"].exists(), output(trusted)[-3000:]


class _CallsPrint:
    """Unpickled, this calls print: weights that run code when loaded (weights_only refuses them)."""

    def __reduce__(self):
        return (print, ("PICKLED_CODE_RAN",))


def test_pickled_weights_are_one_error_and_nothing_loaded(
    tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """A model folder whose weights are a pickle holding more than tensors: exit 2, one ERROR line naming
    the folder, the pickle never run, no output files."""
    model = tmp_path / "model_bin"
    shutil.copytree(tiny_bert, model, ignore=shutil.ignore_patterns("model.safetensors"))
    torch.save({"bert.pooler.dense.bias": _CallsPrint()}, model / "pytorch_model.bin")
    out = tmp_path / "out"
    validation = ["--validation_file", str(demo_files["validation"]), "--max_eval_samples", "2"]
    code, output, stderr = run_qa_cli(tiny_flags(model, out, "--do_eval", *validation), capsys)
    assert code == 2, output[-3000:]
    error = one_error_line(stderr)
    assert error.startswith(f"ERROR: {model}: refusing to load the pickled weights file"), error
    assert "PICKLED_CODE_RAN" not in output and "Traceback" not in output
    assert not out.exists(), "nothing written, no folder made"

"""Security basics: no remote code unless asked, no pickle code execution, the hub token never leaks.

Each check runs the real run_qa.py on a local model directory built to tempt it:
custom code behind `auto_map`, a pickled weights file that runs a command when
unpickled, and a token that must not appear in any log line or output file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from fixtures.runqa import qa_env, run_qa, tiny_flags
from qa_hpc.flags import ModelArguments

SECRET = "hf_SECRET123"


def test_token_is_never_printed_or_written(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [*tiny_flags(tiny_bert, out), "--do_train", "--do_eval", "--train_file", str(demo_files["train"]),
            "--validation_file", str(demo_files["validation"]), "--max_train_samples", "4",
            "--max_eval_samples", "4", "--max_steps", "2", "--logging_steps", "1", "--token", SECRET,
            "--log_level", "debug"]
    proc = run_qa(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "run_summary.json" for p in written)
    leaks = [str(p) for p in written if SECRET.encode() in p.read_bytes()]
    assert leaks == [], f"token found in {leaks}"


def test_trust_remote_code_is_off_by_default() -> None:
    assert ModelArguments().trust_remote_code is False


def _model_with_remote_code(tiny_bert: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A local model whose config asks to run its own Python code; running it creates `marker`."""
    model = tmp_path / "model_with_code"
    shutil.copytree(tiny_bert, model)
    marker = tmp_path / "REMOTE_CODE_RAN"
    (model / "custom_bert.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig, BertForQuestionAnswering\n"
        "class CustomConfig(BertConfig):\n    model_type = 'bert'\n"
        "class CustomQA(BertForQuestionAnswering):\n    config_class = CustomConfig\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom_bert.CustomConfig",
                          "AutoModelForQuestionAnswering": "custom_bert.CustomQA"}
    (model / "config.json").write_text(json.dumps(config))
    return model, marker


def test_remote_code_runs_only_with_the_flag(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    model, marker = _model_with_remote_code(tiny_bert, tmp_path)
    env = qa_env(HF_HOME=str(tmp_path / "hf_home"))
    base = [*tiny_flags(model, tmp_path / "out"), "--do_eval", "--validation_file", str(demo_files["validation"]),
            "--max_eval_samples", "2"]
    proc = run_qa(base, env=env)
    assert not marker.exists(), "model code ran without --trust_remote_code"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # the built-in BERT code is used
    # the control: asked for, the same directory's code does run (so the check above can see it)
    proc = run_qa([*base, "--trust_remote_code", "true", "--output_dir", str(tmp_path / "out2")], env=env)
    assert marker.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]


class _RunsACommand:
    """Unpickling this runs a shell command: what a malicious .bin checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_pickled_weights_are_loaded_weights_only(tiny_bert: Path, demo_files: dict[str, Path], tmp_path: Path) -> None:
    model = tmp_path / "model_bin"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_bert / name, model / name)
    marker = tmp_path / "PICKLE_CODE_RAN"
    torch.save({"bert.pooler.dense.bias": _RunsACommand(marker)}, model / "pytorch_model.bin")
    proc = run_qa([*tiny_flags(model, tmp_path / "out"), "--do_eval", "--validation_file",
                   str(demo_files["validation"]), "--max_eval_samples", "2"])
    assert not marker.exists(), "a pickled weights file ran code"
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ERROR: {model}: refusing to load the pickled weights file" in proc.stderr
    assert "posix.system" in proc.stderr and "Traceback" not in proc.stderr

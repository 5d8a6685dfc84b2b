"""Remote code runs only when asked: a local model directory whose config asks to run its own Python code.

(The hub token never printed or written: tests/e2e/test_run_qa.py; pickled weights refused: test_bad_input.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures.procs import offline_env, output, run_qa, tiny_flags


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
    env = offline_env(HF_HOME=str(tmp_path / "hf_home"))
    base = tiny_flags(model, tmp_path / "out", "--do_eval", "--validation_file", str(demo_files["validation"]),
                      "--max_eval_samples", "2")
    proc = run_qa(base, env=env)
    assert not marker.exists(), "model code ran without --trust_remote_code"
    assert proc.returncode == 0, output(proc)[-3000:]  # the built-in BERT code is used
    # the control: asked for, the same directory's code does run (so the check above can see it)
    proc = run_qa([*base, "--trust_remote_code", "true", "--output_dir", str(tmp_path / "out2")], env=env)
    assert marker.exists(), output(proc)[-3000:]

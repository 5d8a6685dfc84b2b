"""The reference-comparison helpers in bench/, in-process: flat copies, answer agreement, the learning-curve
plot. (Their command lines and scripts: tests/e2e/test_bench.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.outputs import temp_files

from bench import compare_predictions, flatten_squad, plot_learning_curve
from qa_hpc.squad_io import load_qa_records


def test_flat_copy_holds_the_same_first_records(demo_files: dict, tmp_path: Path):
    dst = tmp_path / "dev.flat.json"
    assert flatten_squad.flatten(str(demo_files["validation"]), str(dst), first=5) == 5
    flat = json.loads(dst.read_text())
    original, _ = load_qa_records(demo_files["validation"], split="validation")
    assert list(flat) == ["version", "data"] and temp_files(tmp_path) == []
    assert flat["data"] == [{k: r[k] for k in flatten_squad.FIELDS} for r in original[:5]]
    again, _ = load_qa_records(dst, split="validation")  # our reader takes the flat form back
    assert [r["id"] for r in again] == [r["id"] for r in original[:5]]


def _eval_dir(path: Path, answers: dict, em: float, f1: float) -> Path:
    path.mkdir()
    (path / "eval_predictions.json").write_text(json.dumps(answers))
    (path / "eval_results.json").write_text(json.dumps({"eval_exact_match": em, "eval_f1": f1}))
    return path


def test_compare_predictions_counts_agreement_and_checks_the_difference(tmp_path: Path, capsys):
    ref = _eval_dir(tmp_path / "ref", {"a": "x", "b": "y", "c": "z"}, 50.0, 60.0)
    close = _eval_dir(tmp_path / "close", {"a": "x", "b": "y", "c": "other"}, 50.0, 60.04)
    far = _eval_dir(tmp_path / "far", {"a": "q", "b": "y", "c": "r"}, 49.0, 60.0)
    assert compare_predictions.main([f"ref={ref}", f"close={close}", "--max_diff", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "PREDICTIONS name=close ref=ref same=2 of=3" in out
    assert "AGREEMENT name=close" in out and "ok=1" in out
    assert compare_predictions.main([f"ref={ref}", f"far={far}", "--max_diff", "0.05"]) == 1
    assert "same=1 of=3" in capsys.readouterr().out


def test_learning_curve_png(tmp_path: Path):
    history = [{"step": s, "loss": 6.0 - s / 10, "learning_rate": 1e-4} for s in (10, 20, 30)]
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": history + [{"step": 30, "train_runtime": 5.0}]}))
    assert plot_learning_curve.main([str(state), str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"

"""The reference-comparison helpers in bench/: flat copies, answer agreement, side-by-side figures from
HF's result files, FLOP/s against the CPU peak, the learning-curve plot, and clear refusals without ../shared.

Small and offline: no HF script and no training here (bench/reference_comparison.sh and
bench/hf_eval_scramble.sh are run by hand, see docs/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import compare_predictions, flatten_squad, side_by_side
from qa_hpc.squad_io import load_qa_records

REPO = Path(__file__).resolve().parents[1]


def test_flat_copy_holds_the_same_first_records(demo_files: dict, tmp_path: Path):
    dst = tmp_path / "dev.flat.json"
    n = flatten_squad.flatten(str(demo_files["validation"]), str(dst), first=5)
    flat = json.loads(dst.read_text())
    assert n == 5 and list(flat) == ["version", "data"]
    original, _ = load_qa_records(demo_files["validation"], split="validation")
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
    assert "PREDICTIONS name=close ref=ref same=2 of=3" in out and "AGREEMENT name=close" in out and "ok=1" in out
    assert compare_predictions.main([f"ref={ref}", f"far={far}", "--max_diff", "0.05"]) == 1
    assert "same=1 of=3" in capsys.readouterr().out


def test_side_by_side_reads_hf_result_files_and_reports_fraction_of_peak(tmp_path: Path, capsys):
    # "ours" prints KEY=value lines; "hf" prints a table and writes all_results.json, like HF's script
    ours = (f"{sys.executable} -c \"print('train_runtime=10'); print('TRAIN_MODEL_TFLOP=2.0'); "
            f"print('ACHIEVED_TFLOPS=0.2'); print('eval_f1=40.0')\" # {{out}}")
    hf = (f"mkdir -p {{out}} && {sys.executable} -c \"import json,sys; json.dump({{'train_runtime': 20.0, "
          f"'eval_f1': 41.0, 'eval_exact_match': 30.0}}, open(sys.argv[1] + '/all_results.json', 'w'))\" {{out}}")
    rc = side_by_side.main(["--repeats", "1", "--workdir", str(tmp_path), "--peak_tflops", "0.5",
                            "--cmd", f"ours={ours}", "--cmd", f"hf={hf}"])
    assert rc == 0
    runs = json.loads((tmp_path / "side_by_side.json").read_text())["runs"]
    assert runs["hf"][0]["eval_f1"] == 41.0 and runs["hf"][0]["train_runtime"] == 20.0
    assert runs["hf"][0]["ACHIEVED_TFLOPS"] == pytest.approx(0.1)  # ours' useful work / hf's train time
    assert runs["ours"][0]["peak_fraction"] == pytest.approx(0.4)
    assert runs["hf"][0]["peak_fraction"] == pytest.approx(0.2)
    assert "| fraction of CPU fp32 peak | 0.4 | 0.2 | 2.00x |" in capsys.readouterr().out


def test_learning_curve_png(tmp_path: Path):
    from bench import plot_learning_curve

    state = tmp_path / "trainer_state.json"
    history = [{"step": s, "loss": 6.0 - s / 10, "learning_rate": 1e-4} for s in (10, 20, 30)]
    state.write_text(json.dumps({"log_history": history + [{"step": 30, "train_runtime": 5.0}]}))
    assert plot_learning_curve.main([str(state), str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_cpu_peak_prints_a_positive_figure(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "bench.cpu_peak", "--size", "128", "--repeats", "2", "--warmup", "1",
                           "--json_out", str(tmp_path / "peak.json")], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("CPU_PEAK_TFLOPS=")]
    assert line and float(line[0].split("=")[1]) > 0
    assert json.loads((tmp_path / "peak.json").read_text())["size"] == 128


SCRIPTS = ["reference_comparison.sh", "hf_eval_scramble.sh", "accuracy_full.sh", "cpu_levers.sh",
           "profile_train_step.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_name_the_missing_data(script: str, tmp_path: Path):
    out_arg = [str(tmp_path / "out")] if script == "accuracy_full.sh" else []
    proc = subprocess.run(["bash", str(REPO / "bench" / script), *out_arg], capture_output=True, text=True, cwd=REPO,
                          timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SQUAD_DIR": str(tmp_path / "nowhere")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"ERROR: no {tmp_path / 'nowhere'}/" in proc.stderr and "../shared/data/squad-v1.1" in proc.stderr

"""The bench/ tools as a user runs them, on the CPU (smoke tests: no timing asserted); the scripts that need a
GPU or the real data refuse clearly where it is missing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from fixtures import procs
from fixtures.procs import PYTHON, REPO, offline_env, ok, run
from fixtures.runs import plain_flags, read

from bench import side_by_side


def test_postprocess_bench_reports_identical_outputs(demo_files, tmp_path):
    """SQuAD v1 and v2 (--version_2_with_negative), side by side: each run is mostly python's start-up."""
    v2s = ([], ["--version_2_with_negative"])
    runs = procs.side_by_side(
        *(
            (
                [
                    PYTHON,
                    "-m",
                    "bench.postprocess_bench",
                    "--validation_file",
                    demo_files["validation"],
                    "--random_logits",
                    "--cache_dir",
                    tmp_path / f"cache{len(v2)}",
                    "--repeats",
                    "1",
                    "--sizes",
                    "5,16",
                    "--json_out",
                    tmp_path / f"bench{len(v2)}.json",
                    *v2,
                ],
                offline_env(),
            )
            for v2 in v2s
        )
    )
    for v2, proc in zip(v2s, runs):
        log = ok(proc)
        for key in ("POSTPROCESS ", "POSTPROCESS_DATASET ", "POSTPROCESS_WRITE "):
            rows = [line for line in log.splitlines() if line.startswith(key)]
            assert len(rows) == 2 and all("identical=True" in line for line in rows), log
        report = json.loads((tmp_path / f"bench{len(v2)}.json").read_text())
        assert [r["examples"] for r in report["rows"]] == [5, 16]
        assert all(r["nbest_file_bytes"] > 0 and r["v2"] == bool(v2) for r in report["rows"])


TRAIN_STEP = [PYTHON, "-m", "bench.train_step", "--device", "cpu"]
REFUSED = [("fp16", "fp16 and tf32 need a CUDA GPU"), ("fp32+turbo", "'fp32+turbo'")]  # variant, what it says


@pytest.fixture(scope="module")
def train_steps(tiny_bert: Path, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, list]:
    """bench.train_step with three variants that run, and once with each of REFUSED, side by side (each is
    mostly python's start-up): the first process, its JSON file, then the refused ones' processes."""
    out = tmp_path_factory.mktemp("train_step") / "steps.json"
    variants = [
        *TRAIN_STEP,
        "--model",
        tiny_bert,
        "--variants",
        "fp32,fp32+fused,fp32+eager_attn",
        "--batch",
        "2",
        "--widths",
        "16,24",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "2",
        "--json_out",
        out,
    ]
    refused = [
        [*TRAIN_STEP, "--model", tiny_bert, "--variants", variant, "--steps", "1"] for variant, _ in REFUSED
    ]
    first, *others = procs.side_by_side(*((cmd, offline_env()) for cmd in (variants, *refused)))
    return first, out, others


def test_variants_report_steps_and_json(train_steps) -> None:
    proc, out, _ = train_steps
    log = ok(proc)
    step_lines = [line for line in log.splitlines() if line.startswith("STEP ")]
    assert [line.split()[1] for line in step_lines] == [
        "variant=fp32",
        "variant=fp32+fused",
        "variant=fp32+eager_attn",
    ]
    assert all("mfu=n/a" in line for line in step_lines), "no peak on a CPU"
    data = json.loads(out.read_text())
    assert data["meta"]["widths"] == [16, 24] and data["meta"]["device"]
    for row in data["rows"]:
        assert row["median_step_s"] > 0 and row["mfu"] is None and row["achieved_tflops"] > 0
        assert row["samples_per_s"] == pytest.approx(2 / row["median_step_s"], rel=1e-6)
        assert row["tokens_per_s"] == pytest.approx(20 * 2 / row["median_step_s"], rel=1e-6)  # mean width 20
    assert data["rows"][0]["speedup_vs_first"] == 1.0


@pytest.mark.parametrize("variant, says", REFUSED)
def test_a_variant_that_cannot_run_is_refused_naming_it(variant: str, says: str, train_steps) -> None:
    proc = train_steps[2][REFUSED.index((variant, says))]
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr[-3000:]


def test_side_by_side_reads_hf_result_files_and_reports_fraction_of_peak(tmp_path: Path, capsys):
    # "ours" prints KEY=value lines; "hf" prints a table and writes all_results.json, like HF's script
    ours = (
        f"{PYTHON} -c \"print('train_runtime=10'); print('TRAIN_MODEL_TFLOP=2.0'); "
        f"print('ACHIEVED_TFLOPS=0.2'); print('eval_f1=40.0')\" # {{out}}"
    )
    hf = (
        f"mkdir -p {{out}} && {PYTHON} -c \"import json,sys; json.dump({{'train_runtime': 20.0, "
        f"'eval_f1': 41.0, 'eval_exact_match': 30.0}}, open(sys.argv[1] + '/all_results.json', 'w'))\" "
        "{out} --bf16"
    )
    rc = side_by_side.main(
        [
            "--repeats",
            "1",
            "--workdir",
            str(tmp_path),
            "--peak_tflops",
            "0.5",
            "--peak_bf16_tflops",
            "1.0",
            "--cmd",
            f"ours={ours}",
            "--cmd",
            f"hf={hf}",
        ]
    )
    assert rc == 0
    runs = json.loads((tmp_path / "side_by_side.json").read_text())["runs"]
    assert runs["hf"][0]["eval_f1"] == 41.0 and runs["hf"][0]["train_runtime"] == 20.0
    assert runs["hf"][0]["ACHIEVED_TFLOPS"] == pytest.approx(0.1)  # ours' useful work / hf's train time
    assert runs["ours"][0]["peak_fraction"] == pytest.approx(0.4)
    assert runs["hf"][0]["peak_fraction"] == pytest.approx(0.1)  # a --bf16 command: against the bf16 peak
    assert (
        "| fraction of CPU GEMM peak at the run's precision | 0.4 | 0.1 | 4.00x |" in capsys.readouterr().out
    )


def test_cpu_peak_prints_a_positive_figure(tmp_path: Path):
    log = ok(
        run(
            [
                PYTHON,
                "-m",
                "bench.cpu_peak",
                "--size",
                "128",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--json_out",
                tmp_path / "peak.json",
            ],
            timeout=120,
        )
    )
    line = [x for x in log.splitlines() if x.startswith("CPU_PEAK_TFLOPS=")]
    assert line and float(line[0].split("=")[1]) > 0
    peak = json.loads((tmp_path / "peak.json").read_text())
    assert peak["size"] == 128 and peak["cpu_flags"] and peak["cpu_model"]
    # the bf16 peak where the CPU does bf16 in hardware (where run_qa.py's auto picks bf16), none elsewhere
    bf16 = [x for x in log.splitlines() if x.startswith("CPU_PEAK_BF16_TFLOPS=")]
    assert bool(bf16) == any(torch.cpu.get_capabilities().get(f) for f in ("amx_bf16", "avx512_bf16"))


@pytest.mark.parametrize(
    "script",
    [
        "gpu_smoke.sh",
        "reference_comparison.sh",
        "hf_eval_scramble.sh",
        "accuracy_full.sh",
        "cpu_levers.sh",
        "profile_train_step.sh",
    ],
)
def test_scripts_name_the_missing_gpu_or_data(script: str, tmp_path: Path):
    nowhere = tmp_path / "nowhere"
    out_arg = [str(tmp_path / "out")] if script == "accuracy_full.sh" else []
    env = offline_env(
        CUDA_VISIBLE_DEVICES="", SQUAD_DIR=str(nowhere), PY=PYTHON, QA_VENV=str(Path(PYTHON).parents[1])
    )  # this python
    proc = run(["bash", REPO / "bench" / script, *out_arg], timeout=120, env=env)
    ok(proc, 2)
    if script == "gpu_smoke.sh":  # one line, on stderr
        assert proc.stdout == "" and proc.stderr.strip().splitlines() == [
            "GPU_SMOKE=not_run: no GPU here (torch sees none); run bench/gpu_smoke.sh on a GPU node"
        ], proc.stderr
    else:
        assert f"ERROR: no {nowhere}/" in proc.stderr and "../shared/data/squad-v1.1" in proc.stderr


SLOW_FIRST_STEP = """import sys, time
from transformers import TrainerCallback
sys.path.insert(0, "bench")
import gpu_smoke

class SlowFirstStep(TrainerCallback):  # as CUDA/cuBLAS start-up and the first batch make step 1 slow on a GPU
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            time.sleep(3.0)

sys.exit(gpu_smoke.train(sys.argv[1:], (SlowFirstStep(),)))
"""


def test_gpu_smoke_steady_state_leaves_the_slow_first_step_out(
    tiny_bert: Path, demo_files: dict, tmp_path: Path
):
    out, results = tmp_path / "out", tmp_path / "results"
    train = [
        *plain_flags(tiny_bert, demo_files, out),
        "--report_to",
        "none",
        "--max_steps",
        "8",
        "--per_device_train_batch_size",
        "4",
    ]
    ok(run([PYTHON, "-c", SLOW_FIRST_STEP, *train]))
    log = ok(
        run(
            [
                PYTHON,
                "bench/gpu_smoke.py",
                "record",
                out,
                "--label",
                "cpu",
                "--warmup",
                "1",
                "--results_dir",
                results,
            ]
        )
    )
    assert re.search(r"^SMOKE label=cpu device=cpu gpus=1 precision=fp32 median_step_seconds=", log, re.M)
    steps = read(out / "step_times.json")["step_seconds"]
    (record,) = [read(p) for p in results.glob("gpu_smoke_*_cpu.json")]
    assert len(steps) == 8 and steps[0] >= 3.0 and max(steps[1:]) < 3.0
    assert record["median_step_seconds"] == pytest.approx(sorted(steps[1:])[3]) and record["steps_timed"] == 7
    assert (
        record["whole_run_step_seconds"] > record["median_step_seconds"] + 3.0 / 8
    )  # the whole run holds it
    assert record["samples_per_second"] == pytest.approx(4 / record["median_step_seconds"])
    assert record["projected_2_epochs_seconds"] == pytest.approx(2 * 88524 / record["samples_per_second"])
    assert record["learned"] is True and record["mfu"] is None and record["torch"]

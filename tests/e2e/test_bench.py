"""The bench/ tools as a user runs them, on the CPU (smoke tests: no timing asserted); the scripts that need a
GPU or the real data refuse clearly where it is missing; a branch for one kind of CPU runs for each kind.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from conftest import shared_squad_file, skip_or_fail
from fixtures import procs
from fixtures.ahead import started_ahead
from fixtures.machines import AVX2_AMD, AVX512_BF16_AMD
from fixtures.procs import PYTHON, REPO, offline_env, ok, run
from fixtures.runs import plain_flags, read

from bench import side_by_side
from bench.pack_weights import MAX_RELATIVE_CHANGE
from qa_hpc.device import parse_test_machine


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


def test_cpu_peak_prints_a_positive_figure_and_a_bf16_one_only_on_bf16_cpus(tmp_path: Path):
    """The bf16 peak only where the CPU does bf16 in hardware (where run_qa.py's auto picks bf16): an
    AVX2-only and an AVX512-BF16 CPU made up with QA_TEST_MACHINE, side by side (each is mostly interpreter
    start-up)."""
    kinds = (AVX2_AMD, AVX512_BF16_AMD)
    peak = [PYTHON, "-m", "bench.cpu_peak", "--size", "128", "--repeats", "2", "--warmup", "1", "--json_out"]
    runs = procs.side_by_side(
        *(
            ([*peak, tmp_path / f"{kind.name}.json"], offline_env(QA_TEST_MACHINE=kind.test_machine))
            for kind in kinds
        )
    )
    not_measured = (
        "CPU_PEAK bf16 not measured: this CPU has no avx512_bf16 or amx_bf16 (bf16 is emulated there), "
        "as QA_TEST_MACHINE says"
    )
    for kind, proc in zip(kinds, runs):
        lines = ok(proc).splitlines()
        line = [x for x in lines if x.startswith("CPU_PEAK_TFLOPS=")]
        assert line and float(line[0].split("=")[1]) > 0
        result = json.loads((tmp_path / f"{kind.name}.json").read_text())
        assert result["size"] == 128 and result["cpu_source"] == "QA_TEST_MACHINE"
        assert result["cpu_flags"] == list(parse_test_machine(kind.test_machine).flags)
        bf16 = [x for x in lines if x.startswith("CPU_PEAK_BF16_TFLOPS=")]
        assert bool(bf16) == kind.has_bf16 == (result["cpu_peak_bf16_tflops"] is not None), lines
        assert (not_measured in lines) == (not kind.has_bf16), lines


def missing_data_env(nowhere: Path, **extra: str) -> dict[str, str]:
    """A bench script's environment with the real SQuAD data looked for where there is none, and this
    python."""
    return offline_env(
        CUDA_VISIBLE_DEVICES="",
        SQUAD_DIR=str(nowhere),
        PY=PYTHON,
        QA_VENV=str(Path(PYTHON).parents[1]),
        **extra,
    )


def names_the_missing_data(proc: subprocess.CompletedProcess, nowhere: Path) -> None:
    """Exit 2 and one ERROR naming where the data was looked for and where it belongs."""
    ok(proc, 2)
    assert f"ERROR: no {nowhere}/" in proc.stderr and "../shared/data/squad-v1.1" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "script",
    [
        "gpu_smoke.sh",
        "hf_eval_scramble.sh",
        "accuracy_full.sh",
        "accuracy_seeds.sh",
        "accuracy_minilm.sh",
        "scaling.sh",
        "cpu_levers.sh",
        "profile_train_step.sh",
    ],
)
def test_scripts_name_the_missing_gpu_or_data(script: str, tmp_path: Path):
    nowhere = tmp_path / "nowhere"
    out_arg = [str(tmp_path / "out")] if script.startswith("accuracy_") else []
    workdir = {"WORKDIR": str(tmp_path / "out")} if script == "scaling.sh" else {}
    env = missing_data_env(nowhere, **workdir)
    proc = run(["bash", REPO / "bench" / script, *out_arg], timeout=120, env=env)
    if script == "gpu_smoke.sh":  # one line, on stderr
        ok(proc, 2)
        assert proc.stdout == "" and proc.stderr.strip().splitlines() == [
            "GPU_SMOKE=not_run: no GPU here (torch sees none); run bench/gpu_smoke.sh on a GPU node"
        ], proc.stderr
    else:
        names_the_missing_data(proc, nowhere)
        assert not (tmp_path / "out").exists()  # nothing written before the data is found


@pytest.mark.parametrize(
    "script, says",
    [
        ("accuracy_minilm.sh", "the untrained run failed: see {out}/untrained.log"),
        ("scaling.sh", "the run of 100 train questions failed: see {out}/train_100.log"),
    ],
)
def test_a_bench_run_that_fails_stops_the_script_naming_its_log(script: str, says: str, tmp_path: Path):
    """run_qa.py failing (a stand-in python that fails it, and runs everything else): exit 2 and one ERROR
    naming the failed run's log, which holds what it printed."""
    squad = shared_squad_file("dev-v1.1.json").parent
    failing = tmp_path / "python"
    failing.write_text(
        f'#!/bin/bash\n[ "$1" = run_qa.py ] && {{ echo "ERROR: made up"; exit 1; }}\nexec {PYTHON} "$@"\n'
    )
    failing.chmod(0o755)
    out = tmp_path / "out"
    env = offline_env(SQUAD_DIR=str(squad), PY=str(failing), WORKDIR=str(out))
    proc = run(["bash", REPO / "bench" / script, str(out)], timeout=120, env=env)
    ok(proc, 2)
    log = says.format(out=out).rsplit("see ", 1)[1]
    assert proc.stderr.strip().splitlines()[-1] == f"ERROR: {says.format(out=out)}", proc.stderr
    assert Path(log).read_text() == "ERROR: made up\n"


def test_reference_comparison_says_its_commands_for_each_kind_of_cpu_then_names_the_missing_data(
    tmp_path: Path,
):
    """HF at bf16 only on a CPU that does bf16 in hardware: its default COMMANDS, first line, on an AVX2-only
    and on an AVX512-BF16 CPU made up with QA_TEST_MACHINE (side by side: each is mostly python's start-up to
    read the MACHINE line); then exit 2 naming the missing data, never a silent exit 1."""
    nowhere = tmp_path / "nowhere"
    kinds = (AVX2_AMD, AVX512_BF16_AMD)
    script = ["bash", REPO / "bench" / "reference_comparison.sh"]
    runs = procs.side_by_side(
        *((script, missing_data_env(nowhere, QA_TEST_MACHINE=kind.test_machine)) for kind in kinds)
    )
    for kind, proc in zip(kinds, runs):
        names_the_missing_data(proc, nowhere)
        bf16_rows = " hf_no_pad_bf16 hf_grouped_bf16" if kind.has_bf16 else ""
        assert proc.stdout.splitlines()[0] == f"COMMANDS=ours hf_defaults hf_no_pad hf_grouped{bf16_rows}", (
            kind.name,
            proc.stdout,
        )


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
    assert record["mfu"] is None and record["torch"]
    # learned: its eval F1 at least --min_f1 (exit 0), else not (exit 1)
    for above, code in ((-0.01, 0), (0.01, 1)):
        floor = str(record["eval_f1"] + above)
        judged = run(
            [PYTHON, "bench/gpu_smoke.py", "record", out, "--label", "cpu", "--min_f1", floor]
            + ["--warmup", "1", "--results_dir", tmp_path / "judged"]
        )
        assert judged.returncode == code, judged.stdout[-2000:] + judged.stderr[-2000:]
        assert re.search(rf"learned={code == 0}\b", judged.stdout + judged.stderr), judged.stdout[-2000:]


GPU_SPEED = REPO / "bench" / "gpu_speed.sh"


def gpu_speed_dry_run(tiny_bert: Path, tmp: Path) -> tuple[subprocess.CompletedProcess, Path, Path, dict]:
    """bench/gpu_speed.sh --dry_run_cpu on three variants: (its process, its work and --copy_to folders, its
    environment)."""
    squad = shared_squad_file("dev-v1.1.json").parent
    hf_dir = REPO.parent / "shared" / "peers" / "hf_run_qa"
    if not (hf_dir / "run_qa.py").is_file():
        skip_or_fail(f"HF's run_qa.py not found in {hf_dir} (expected ../shared/peers/hf_run_qa)")
    work, out = tmp / "work", tmp / "out"
    env = offline_env(
        VARIANTS="ours_today,hf_best,minilm_full",
        GPU_SPEED_BUDGET_S="900",  # the budget's skipping is not under test: every variant runs
        MINILM_DIR=str(tiny_bert),
        SQUAD_DIR=str(squad),
        HF_DIR=str(hf_dir),
        PY=PYTHON,
    )
    proc = run(["bash", GPU_SPEED, "--dry_run_cpu", "--copy_to", out, work], timeout=600, env=env)
    return proc, work, out, env


@pytest.fixture(scope="module", autouse=True)
def dry_run(request, tiny_bert: Path, tmp_path_factory) -> Iterator[Future | None]:
    """gpu_speed_dry_run, started with the module: its variants run one after another, each a process that
    mostly starts up on one thread, while the module's other tests run beside them."""
    test = "test_gpu_speed_dry_run_records_each_variant_and_the_table"
    tmp = tmp_path_factory.mktemp("gpu_speed")
    with started_ahead(request, [test], gpu_speed_dry_run, tiny_bert, tmp) as job:
        yield job


def test_gpu_speed_dry_run_records_each_variant_and_the_table(dry_run: Future):
    """bench/gpu_speed.sh --dry_run_cpu end to end on three variants (today's default, HF's script at its best
    flags, MiniLM's recipe on the tiny BERT): one JSON record each, figures from the same probe, the table
    with its ratios, the copies made for the GPU node's output folder; without a GPU the real sitting
    refuses."""
    proc, work, out, env = dry_run.result()
    log = ok(proc)
    assert re.search(r"^GPU_SPEED_DONE .* ran=3 not_run=0 failed=none ", log, re.M), log[-3000:]
    (results,) = (work / "results").iterdir()
    records = {name: read(results / f"{name}.json") for name in ("ours_today", "hf_best", "minilm_full")}
    today, hf, minilm = records.values()
    assert [r["status"] for r in records.values()] == ["ok"] * 3
    assert today["script"] == "ours" and today["plan_line"].startswith("PLAN device=cpu precision=bf16")
    assert (
        hf["script"] == "hf" and hf["flags"] == ["--no_pad_to_max_length", "--bf16"] and not hf["plan_line"]
    )
    assert today["speed"]["dataloader_num_workers"] == 4 and hf["speed"]["dataloader_num_workers"] == 0
    for record in (today, hf):  # 2 warm-up steps + 4 steady steps of 4 features, bf16, by the same probe
        speed = record["speed"]
        probe = read(work / "probes" / f"{record['name']}.json")
        seconds, lengths = probe["step_seconds"], probe["step_lengths"]
        median = statistics.median(seconds[2:])
        regular = [i for i in range(2, 6) if seconds[i] <= 4 * median]  # one-time costs left out
        regular_seconds = sum(seconds[i] for i in regular)
        assert speed["steps"] == 6 and speed["global_batch"] == 4 and speed["precision"] == "bf16"
        assert [len(step) for step in lengths] == [4] * 6 and all(0 < n <= 128 for s in lengths for n in s)
        assert any(
            len(set(step)) > 1 for step in lengths
        )  # each feature's real length, not the batch's width
        tokens = sum(sum(lengths[i]) for i in regular)
        assert speed["real_tokens_per_second"] == pytest.approx(tokens / regular_seconds)
        assert speed["projected_2_epochs_seconds"] == pytest.approx(
            sum(seconds) + (44262 - 6) * regular_seconds / len(regular)
        )
        assert speed["median_samples_per_second"] == pytest.approx(4000 / speed["median_step_ms"])
        assert speed["mfu"] is None and record["environment"]["device"] == "cpu"
    assert minilm["accuracy"]["eval_examples"] == 8 and minilm["accuracy"]["eval_f1"] is not None
    assert minilm["accuracy"]["f1_diff_vs_reference"] is None  # the reference holds for all 10,570 questions
    table = (results / "table.md").read_text(encoding="utf-8")
    gain = today["speed"]["projected_2_epochs_seconds"] / hf["speed"]["projected_2_epochs_seconds"]
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["| ours_today"].endswith("| 1.00x | – | " + f"{1 / gain:.2f}x |"), table
    assert rows["| hf_best"].endswith(f"| {gain:.2f}x | – | 1.00x |"), table
    assert "MiniLM's full recipe" in table and "Method: one sitting" in table
    assert (out / "gpu_speed_table.md").read_text(encoding="utf-8") == table
    with tarfile.open(out / "gpu_speed_results.tgz") as bundle:
        assert {Path(name).name for name in bundle.getnames()} >= {"ours_today.json", "table.md"}
    refused = run(["bash", GPU_SPEED], timeout=120, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "GPU_SPEED=not_run: no GPU here (torch sees none); run it on a GPU node, or --dry_run_cpu here"
    ]


def test_packed_weights_travel_within_16_significant_bits(tiny_bert: Path, tmp_path: Path):
    """bench/pack_weights.py, as --prepare packs MiniLM for the GPU node and gpu_speed.sh unpacks it there:
    every tensor back with its name, dtype and shape, fp32 values within 2^-16, the small files as they
    were."""
    from safetensors.numpy import load_file

    packed, unpacked = tmp_path / "packed", tmp_path / "model"
    ok(run([PYTHON, "bench/pack_weights.py", "pack", tiny_bert, packed]))
    ok(run([PYTHON, "bench/pack_weights.py", "unpack", packed, unpacked]))
    before = load_file(str(tiny_bert / "model.safetensors"))
    after = load_file(str(unpacked / "model.safetensors"))
    assert {k: (v.dtype, v.shape) for k, v in after.items()} == {
        k: (v.dtype, v.shape) for k, v in before.items()
    }
    for name, value in before.items():
        change = abs(after[name].astype("float64") - value) / abs(value).clip(min=1e-30)
        assert change.max() <= MAX_RELATIVE_CHANGE, name
    assert (unpacked / "tokenizer.json").read_bytes() == (tiny_bert / "tokenizer.json").read_bytes()


def test_gpu_speed_names_what_its_carried_folder_lacks_before_it_unpacks_anything(tmp_path: Path):
    """--carry with a folder --prepare did not finish (a copy cut short, a part deleted): exit 2 and one
    ERROR naming every missing part and the command that makes it again, before a wheel is installed or a
    file unpacked; an empty folder lacks them all."""
    carry, work = tmp_path / "carry", tmp_path / "work"
    parts = [
        "wheels/datasets-5.2.0-py3-none-any.whl",
        "wheels/evaluate-0.4.6-py3-none-any.whl",
        "wheels/dill-0.4.1-py3-none-any.whl",
        "wheels/multiprocess-0.70.19-py312-none-any.whl",
        "wheels/orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl",
        "squad/train-v1.1.first44articles.json.gz",
        "squad/dev-v1.1.json.gz",
        "hf_run_qa/run_qa.py",
        "minilm/packed_weights.json",
    ]
    for part in parts:
        (carry / part).parent.mkdir(parents=True, exist_ok=True)
        (carry / part).write_text("made up")
    (carry / parts[3]).unlink()
    (carry / "squad/dev-v1.1.json.gz").write_text("")  # cut short: empty
    command = ["bash", GPU_SPEED, "--carry", carry, work]
    proc = run(command, timeout=60, env=offline_env())
    ok(proc, 2)
    assert proc.stderr.strip().splitlines() == [
        f"ERROR: --carry {carry}: missing wheels/multiprocess squad/dev-v1.1.json.gz; make it again where "
        f"pip and ../shared are at hand: bash bench/gpu_speed.sh --prepare {carry}"
    ], proc.stderr
    assert not work.exists()
    for part in parts:
        (carry / part).unlink(missing_ok=True)
    proc = run(command, timeout=60, env=offline_env())
    ok(proc, 2)
    missing = "wheels/datasets wheels/evaluate wheels/dill wheels/multiprocess wheels/orjson squad/train"
    assert f"missing {missing}" in proc.stderr and not work.exists(), proc.stderr


def test_gpu_speed_names_the_python_its_carried_wheels_need_before_pip_refuses_them(tmp_path: Path):
    """The carried wheels are built for one CPython (CARRY_PYTHON, the GPU image's 3.12): where the python
    that runs lacks one of them and is another version, pip would refuse each wheel in its own words; the
    script stops first (exit 2), naming both versions and the two ways out, before anything is installed."""
    carry, work = tmp_path / "carry", tmp_path / "work"
    wheels = ["datasets-5.2.0", "evaluate-0.4.6", "dill-0.4.1", "multiprocess-0.70.19", "orjson-3.13.0"]
    parts = [f"wheels/{name}-py3-none-any.whl" for name in wheels]
    parts += ["wheels/qa_not_installed-1.0-py3-none-any.whl"]  # one this python cannot import
    parts += ["squad/train-v1.1.first44articles.json.gz", "squad/dev-v1.1.json.gz", "hf_run_qa/run_qa.py"]
    parts += ["minilm/packed_weights.json"]
    for part in parts:
        (carry / part).parent.mkdir(parents=True, exist_ok=True)
        (carry / part).write_text("made up")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    proc = run(["bash", GPU_SPEED, "--carry", carry, work], timeout=60, env=offline_env(CARRY_PYTHON="3.99"))
    ok(proc, 2)
    assert proc.stderr.strip().splitlines() == [
        f"ERROR: --carry {carry}: its wheels are for CPython 3.99, {PYTHON} is {version}; give "
        f"PY=python3.99, or --prepare again with CARRY_PYTHON={version}"
    ], proc.stderr
    assert not (work / "site").exists()

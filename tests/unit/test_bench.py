"""The reference-comparison helpers in bench/, in-process: flat copies, answer agreement, the learning-curve
plot. (Their command lines and scripts: tests/e2e/test_bench.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fixtures.machines import one_h200
from fixtures.outputs import temp_files

from bench import (
    compare_predictions,
    compile_shapes,
    flatten_squad,
    gpu_speed,
    gpu_speed_probe,
    gpu_speed_records,
    plot_learning_curve,
    suite_profile,
)
from qa_hpc.flags import read_flags
from qa_hpc.plan import decide
from qa_hpc.squad_io import load_qa_records

REPO = Path(__file__).resolve().parents[2]


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


def test_gpu_speed_join_makes_one_table_of_a_sitting_split_over_calls(tmp_path: Path):
    """bench/gpu_speed.py join on the H200 records in bench/results: the first call's folder with two
    variants not run (as its budget left them), the second call's with those two; the joined table has every
    row the recorded one has, each record its call, and a later record that did not run never replaces one
    that did."""
    measured = REPO / "bench" / "results" / "2026-11-27_h200_gpu_speed"
    first, second, out = tmp_path / "call1", tmp_path / "call2", tmp_path / "joined"
    first.mkdir()
    second.mkdir()
    recorded = [v.name for v in gpu_speed.VARIANTS if (measured / f"{v.name}.json").is_file()]
    names = recorded + ["minilm_full"]
    for name in names:
        record = json.loads((measured / f"{name}.json").read_text())
        record.pop("call")
        if name in ("workers0", "compile"):
            (second / f"{name}.json").write_text(json.dumps(record))
            record = {**record, "status": "not_run", "reason": "budget", "speed": None}
        (first / f"{name}.json").write_text(json.dumps(record))
    skipped_later = {**json.loads((first / "buckets.json").read_text()), "status": "not_run", "speed": None}
    (second / "buckets.json").write_text(json.dumps(skipped_later))

    assert gpu_speed.main(["join", "--out", str(out), str(first), str(second)]) == 0

    def rows(table: Path) -> list[list[str]]:
        lines = table.read_text().splitlines()
        return [line.split(" | ") for line in lines if line.startswith(("| ", "- GPU_SPEED"))]

    # the same rows, but for the compile cell, which now gives the graphs beside the seconds (the sitting's
    # table was written before it did; its records hold them)
    compile_cell = 9
    joined, recorded_rows = rows(out / "table.md"), rows(measured / "table.md")
    assert len(joined) == len(recorded_rows)
    for new_row, old_row in zip(joined, recorded_rows):
        if new_row[0] == "| variant":
            assert new_row.pop(compile_cell).startswith(old_row.pop(compile_cell) + " (graphs; ")
        elif (record := measured / f"{new_row[0][2:]}.json").is_file():
            speed = json.loads(record.read_text())["speed"]
            if speed and speed["compile_seconds"] is not None:
                cell = old_row.pop(compile_cell)
                assert new_row.pop(compile_cell) == f"{cell} ({speed['compiled_graphs']})"
        assert new_row == old_row
    calls = {name: json.loads((out / f"{name}.json").read_text())["call"] for name in names}
    assert calls == {name: 2 if name in ("workers0", "compile") else 1 for name in names}
    assert "call 2: workers0, compile)" in (out / "table.md").read_text()


def sitting_here(tmp_path: Path) -> gpu_speed.Measurement:
    """A dry-run sitting that has run nothing yet, its folders under tmp_path."""
    sitting = gpu_speed.SITTINGS["dry_run_cpu"]
    folders = ("model", "minilm", "train", "dev", "hf_train", "hf")
    inputs = gpu_speed.Inputs(*(tmp_path / name for name in folders))
    results = tmp_path / "results"
    results.mkdir()
    return gpu_speed.Measurement(
        sitting,
        inputs,
        tmp_path / "work",
        results,
        None,
        {"--torch_compile"},
        900,
        time.time(),
        dict(sitting.estimate_s),
    )


def test_compile_warm_compiles_in_the_caches_compile_filled_and_never_cold(tmp_path: Path):
    """compile_warm's process gets compile's inductor and Triton caches (every other variant its own); in a
    sitting where compile did not run before it, it is not run, saying why, rather than measured cold."""
    m = sitting_here(tmp_path)
    (warm,) = [variant for variant in gpu_speed.VARIANTS if variant.name == "compile_warm"]
    names = [variant.name for variant in gpu_speed.VARIANTS]
    assert warm.caches_of == "compile" and names.index("compile") < names.index("compile_warm")
    assert warm.lever is None  # a first job compiles cold: only compile's own figure chooses the lever
    assert {variant.lever for variant in gpu_speed.VARIANTS} == {*gpu_speed.LEVERS, None}
    env = m.child_env(warm.name, warm.caches_of)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "work" / "compile_cache" / "compile")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "work" / "compile_cache" / "compile" / "triton")
    assert m.child_env("buckets")["TORCHINDUCTOR_CACHE_DIR"].endswith("compile_cache/buckets")

    m.run_variant(warm, 0)
    record = json.loads((m.results / "compile_warm.json").read_text())
    assert record["status"] == "not_run" and record["speed"] is None
    assert record["reason"] == "compile did not run before it in this sitting: its caches would be cold"


def test_each_warm_variant_follows_its_cold_one_and_is_budgeted_as_warm():
    """Every variant compiling in another's caches runs after it, with the same flags, and the budget
    expects a warm compile of it (its own estimate, in both sittings), not a cold one's."""
    names = [variant.name for variant in gpu_speed.VARIANTS]
    by_name = {variant.name: variant for variant in gpu_speed.VARIANTS}
    warm = [variant for variant in gpu_speed.VARIANTS if variant.caches_of]
    expected = {"compile_warm", "buckets_graphs_dynamic_warm", "buckets_graphs_regions_warm"}
    assert {variant.name for variant in warm} == expected
    for variant in warm:
        cold = by_name[variant.caches_of]
        assert names.index(cold.name) < names.index(variant.name) and cold.flags == variant.flags
        assert (cold.kind, variant.kind) == ("compiled", "warm")
    for sitting in gpu_speed.SITTINGS.values():
        assert sitting.estimate_s["warm"] < sitting.estimate_s["compiled"]


def test_the_cudagraphs_backend_is_budgeted_as_a_trace_not_a_compile():
    """dynamo's cudagraphs backend generates no kernels (torch's own are recorded in CUDA graphs): its
    variants get the budget of a trace, their own estimate, shorter than a cold compile's in both sittings,
    and no warm variant (no inductor caches to fill); they measure the compile lever."""
    traced = [variant for variant in gpu_speed.VARIANTS if variant.kind == "traced"]
    assert {variant.name for variant in traced} == {"buckets_cudagraphs", "buckets_cudagraphs_regions"}
    warm_sources = {variant.caches_of for variant in gpu_speed.VARIANTS}
    for variant in traced:
        assert " ".join(gpu_speed.CUDAGRAPHS_BACKEND) in " ".join(variant.flags)
        assert variant.lever == "compile" and variant.name not in warm_sources
    # the backend's name alone, elsewhere in the flags, is not a cudagraphs backend
    named = gpu_speed.Variant("named", "ours", ("--torch_compile", "--output_dir", "cudagraphs"))
    assert named.kind == "compiled"
    for sitting in gpu_speed.SITTINGS.values():
        assert sitting.estimate_s["eager"] < sitting.estimate_s["traced"] < sitting.estimate_s["compiled"]


def test_every_variant_of_ours_is_a_plan_one_h200_takes():
    """What the GPU will decide, decided here on an H200's made-up facts: no variant of ours is refused
    there, and dynamo's cudagraphs backend gets a static graph per batch shape (with symbolic sizes its one
    recording would be replayed for every width, and fail at the second)."""
    h200 = one_h200()
    known = gpu_speed.known_run_qa_flags()
    sitting = ["--output_dir", "/tmp/unused", "--do_train", "--do_eval", "--precision", "bf16"]
    for variant in gpu_speed.VARIANTS:
        if variant.script == "hf":
            continue
        flags, _ = gpu_speed.command_flags(variant, known)
        plan = decide(read_flags([*sitting, *flags]), h200, train_batches=7377)
        if variant.kind == "traced":
            assert (plan.compile_backend, plan.cuda_graphs, plan.compile_dynamic) == (
                "cudagraphs",
                True,
                False,
            ), variant.name


def test_a_variant_that_ends_before_its_steady_steps_fails_and_the_sitting_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A process that exits 0 with no more steps timed than the warm-up (a --max_steps its data cannot fill)
    gets a failed record that says why; the next variant still runs."""
    m = sitting_here(tmp_path)
    warmup = m.sitting.warmup_steps
    ran: list[str] = []

    def ends_early(name: str, script: Path, argv: list[str], timeout: float, caches_of=None):
        ran.append(name)
        probe = {"step_seconds": [0.1] * warmup, "environment": gpu_speed_probe.environment()}
        return gpu_speed.ChildRun(0, 1.0, "", probe, timeout)

    monkeypatch.setattr(m, "run_child", ends_early)
    first, second = gpu_speed.VARIANTS[:2]
    m.run_variant(first, 0)
    m.run_variant(second, 0)

    assert ran == [first.name, second.name]
    record = json.loads((m.results / f"{first.name}.json").read_text())
    assert record["status"] == "failed" and record["speed"] is None
    reason = f"no steady state: {warmup} steps timed, need more than the {warmup} warm-up steps"
    assert record["reason"] == reason
    assert f"| {first.name} |" in (m.results / "table.md").read_text()


def made_up_probe(step_seconds: list[float]) -> dict:
    """What bench/gpu_speed_probe.py writes for a compiled run of these steps (made up: a 2-layer model)."""
    return {
        "step_seconds": step_seconds,
        "step_lengths": [[100, 80]] * len(step_seconds),
        "train_wall_seconds": sum(step_seconds) + 0.05,
        "global_batch": 2,
        "precision": "bf16",
        "tf32": True,
        "dataloader_num_workers": 4,
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
        "compile_seconds": 130.37,
        "compiled_graphs": 3,
        "compile_cache_hits": 0,
        "compile_cache_misses": 6,
        "cuda_graph_skips": 1,
        "peak_memory_mb": None,
        "model_shape": {"non_embedding_params": 1000, "layers": 2, "hidden": 8},
        "environment": gpu_speed_probe.environment(),
    }


def test_a_compiled_variants_record_and_row_say_its_graphs_cache_and_cuda_graph_skips():
    """What the probe reads after a compile is dynamo's and inductor's own count (one graph more for one
    compile; dynamo's eager backend: no cache lookup, no CUDA graph), and the table's compile cell gives it:
    seconds (graphs; cache hits/misses; CUDA graph skips), the graphs alone where an older record lacks the
    rest. (With inductor, cold, warm and without CUDA graphs: tests/e2e/test_compile.py.)"""
    import torch

    torch.compiler.reset()  # which also sets dynamo's account of seconds back to none
    before = gpu_speed_probe.compile_figures()
    torch.compile(lambda x: x * 3, backend="eager", dynamic=False)(torch.ones(2))
    after = gpu_speed_probe.compile_figures()
    torch.compiler.reset()
    assert after["compiled_graphs"] == (before["compiled_graphs"] or 0) + 1
    lookups = ("compile_cache_hits", "compile_cache_misses", "cuda_graph_skips")
    assert [after[key] for key in lookups] == [before[key] or 0 for key in lookups]
    assert after["compile_seconds"] > (before["compile_seconds"] or 0)

    probe = made_up_probe([3.0, 0.02, 0.01, 0.01, 0.01])
    speed = gpu_speed_records.speed_from_probe(probe, warmup=1)
    record = gpu_speed_records.Record("compiled", "ours", [], "ok", speed=speed)
    assert " | 130.4 (3; 0/6; 1) | " in gpu_speed_records.table_row(record, {})
    older = {key: value for key, value in probe.items() if key not in lookups}  # a record of the sittings
    speed = gpu_speed_records.speed_from_probe(older, warmup=1)
    assert (speed.compile_cache_hits, speed.cuda_graph_skips) == (None, None)
    record = gpu_speed_records.Record("compiled", "ours", [], "ok", speed=speed)
    assert " | 130.4 (3) | " in gpu_speed_records.table_row(record, {})


def test_compile_shapes_builds_a_graph_per_shape_static_and_one_dynamic(tiny_bert: Path):
    """bench/compile_shapes.py's shapes are a pass's under --pad_to_buckets on (as many as the plan counts);
    with dynamo's own eager backend, static builds one graph per shape and dynamic one for all, and in
    regions one per region (the embeddings, both layers, the QA head), static one per region and shape. No
    inductor: no cache lookups."""
    shapes = compile_shapes.batch_shapes(128, 4)
    assert shapes == [(4, 48), (4, 64), (4, 88), (4, 112), (4, 128), (2, 48)]
    static = compile_shapes.compile_over_shapes(str(tiny_bert), shapes[:2], "eager", dynamic=False)
    dynamic = compile_shapes.compile_over_shapes(str(tiny_bert), shapes[:2], "eager", dynamic=True)
    regions = compile_shapes.compile_over_shapes(str(tiny_bert), shapes[:2], "eager", True, "regions")
    static_regions = compile_shapes.compile_over_shapes(str(tiny_bert), shapes[:2], "eager", False, "regions")
    assert (static["graphs"], dynamic["graphs"], regions["graphs"]) == (2, 1, 3)
    assert static_regions["graphs"] == 6  # each region's graph for each shape
    assert len(dynamic["first_steps_s"]) == 2
    assert (regions["cache_hits"], regions["cache_misses"]) == (0, 0)


def test_suite_profile_sums_each_files_tests_and_the_cores_busy_meanwhile():
    """Two tests of one file and one of another; a sample counts for the test it was taken in."""
    assert suite_profile.busy_cores((100, 40), (200, 90), cores=2) == 1.0  # half the jiffies idle
    spans = [
        suite_profile.Span("tests/e2e/test_a.py::one", 0.0, 4.0),
        suite_profile.Span("tests/e2e/test_a.py::two", 4.0, 6.0),
        suite_profile.Span("tests/unit/test_b.py::three", 6.0, 7.0),
    ]
    samples = [(1.0, 2.0), (3.0, 1.0), (5.0, 0.5), (6.5, 1.0)]
    rows = suite_profile.per_file(spans, samples)
    file_a = ("tests/e2e/test_a.py", 6.0, pytest.approx((4 * 1.5 + 2 * 0.5) / 6))
    assert rows == [file_a, ("tests/unit/test_b.py", 1.0, 1.0)]


def test_the_baseline_and_each_lever_alone_run_eagerly_unless_the_lever_compiles():
    """run_qa.py compiles by default on one GPU, so the baseline (`ours_today`) pins the eager default it
    measured before (--torch_compile false); a lever's variant keeps that pin unless compiling is its lever;
    `ours_default` pins nothing: the defaults of the run_qa.py that runs, for a run long enough to compile
    (its --torch_compile, which the plan turns on itself from COMPILE_PAYS_FROM_BATCHES batches)."""
    known = gpu_speed.known_run_qa_flags()
    by_name = {variant.name: variant for variant in gpu_speed.VARIANTS}
    baseline, _ = gpu_speed.command_flags(by_name["ours_today"], known)
    assert " ".join(baseline).startswith("--attn_backend all --pad_to_buckets off --torch_compile false")
    for variant in gpu_speed.VARIANTS:
        if variant.script == "hf" or not variant.today_pinned:
            continue
        flags, unknown = gpu_speed.command_flags(variant, known)
        pinned_eager = "--torch_compile false" in " ".join(flags)
        assert not unknown and pinned_eager == ("--torch_compile" not in variant.flags), variant.name
    # and TensorBoard on, as users run it (the levers' variants report to nothing)
    default_flags = ["--torch_compile", "--report_to", "tensorboard"]
    assert gpu_speed.command_flags(by_name["ours_default"], known) == (default_flags, [])
    assert by_name["ours_default"].kind == "compiled"  # the budget expects a cold compile


def test_a_cold_variant_finds_its_caches_empty_and_every_process_has_a_limit_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A second call or a rerun on the same machine would find a cold variant's caches filled and measure a
    warm compile as a cold one: they are emptied before it runs, never those a warm variant compiles in. Each
    process is stopped at LIMIT_PER_ESTIMATE times its kind's estimate (the sitting's, or the last one's where
    longer), so that one that hangs leaves the budget to the rest."""
    m = sitting_here(tmp_path)
    m.known_flags = gpu_speed.known_run_qa_flags()
    by_name = {variant.name: variant for variant in gpu_speed.VARIANTS}
    timeouts: dict[str, float] = {}
    # seconds each process takes: a cold compile far shorter than its estimate, then one far longer
    took = {"buckets_graphs_dynamic": 30.0, "buckets_graphs_regions": 300.0}

    def finishes(name: str, script: Path, argv: list[str], timeout: float, caches_of=None):
        timeouts[name] = timeout
        assert not (m.compile_cache(name) / "stale").exists() or caches_of is not None
        probe = made_up_probe([0.1] * (m.sitting.warmup_steps + 3))
        return gpu_speed.ChildRun(0, took.get(name, 1.0), "", probe, timeout)

    monkeypatch.setattr(m, "run_child", finishes)
    for name in ("buckets_graphs_dynamic", "buckets_graphs_dynamic_warm"):
        m.compile_cache(name).mkdir(parents=True)
        (m.compile_cache(name) / "stale").write_text("an earlier call's kernels")
    m.run_variant(by_name["buckets_graphs_dynamic"], 0)
    assert not m.compile_cache("buckets_graphs_dynamic").exists()
    (m.compile_cache("buckets_graphs_dynamic") / "filled").parent.mkdir(parents=True)
    (m.compile_cache("buckets_graphs_dynamic") / "filled").write_text("its own kernels")
    m.run_variant(by_name["buckets_graphs_dynamic_warm"], 0)
    assert (m.compile_cache("buckets_graphs_dynamic") / "filled").exists()  # the warm one compiles in these

    estimates = m.sitting.estimate_s
    assert timeouts["buckets_graphs_dynamic"] == gpu_speed.LIMIT_PER_ESTIMATE * estimates["compiled"]
    assert timeouts["buckets_graphs_dynamic_warm"] == gpu_speed.LIMIT_PER_ESTIMATE * estimates["warm"]
    m.run_variant(by_name["buckets_graphs_regions"], 0)  # after one of 30 s: the sitting's estimate
    assert timeouts["buckets_graphs_regions"] == gpu_speed.LIMIT_PER_ESTIMATE * estimates["compiled"]
    m.run_variant(by_name["compile"], 0)  # after one of 300 s: its limit follows
    assert timeouts["compile"] == pytest.approx(gpu_speed.LIMIT_PER_ESTIMATE * 300.0)

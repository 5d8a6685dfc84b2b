"""torch.compile over fixed batch shapes in real processes: a compiled run stops on a signal, checkpoints and
resumes, and equals the same run uncompiled; one graph per batch shape, or one for all of them, for the
whole model or each of its regions. (Backend aot_eager: what inductor traces, forward and backward, without
inductor's C++ compiles, which take minutes on 2 cores.) Inductor's cache, kept between runs, found warm."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from fixtures.procs import PYTHON, RUN_QA, LoggedProcess, ok, run_qa, tiny_flags
from fixtures.runs import assert_resumed_exactly, read

from bench.gpu_speed_probe import compile_figures
from qa_hpc.compile import CompiledSteps
from qa_hpc.errors import EXIT_PREEMPTED

BUCKETS_AT_128 = 5  # --pad_to_buckets on at --max_seq_length 128: 48,64,88,112,128


def _flags(model: Path, data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """Short contexts (one window each, of lengths over several buckets), 8 steps, then evaluation."""
    return tiny_flags(
        model,
        out,
        "--do_train",
        "--do_eval",
        "--train_file",
        str(data["train"]),
        "--validation_file",
        str(data["validation"]),
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "8",
        "--num_train_epochs",
        "1",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--pad_to_buckets",
        "on",
        *extra,
    )


def test_compiled_in_buckets_stops_resumes_and_equals_eager(
    tiny_bert: Path, ddp_data: dict[str, Path], tmp_path: Path
) -> None:
    """A SIGTERM checkpoints a compiled run (exit 75) and the same command resumes it; the resumed run's
    per-step losses, weights and answers are those of the same run uncompiled and uninterrupted (run beside
    it). The first process, with --compile_shapes dynamic and --compile_scope regions, builds three graphs
    whatever the shapes it saw: the embeddings, one for both layers, the QA head (the padding mask built for
    every batch, so no batch without padding compiles the layers again without one); the resumed one, static
    and whole, one graph per batch shape its compiled steps saw, at most one per bucket and a short last batch
    (a checkpoint holds no graphs: any setting resumes it). (Evaluation after training runs the plain model:
    transformers 5.23 evaluates self.model.)"""
    out = tmp_path / "compiled"
    reference = tmp_path / "eager"
    cache = tmp_path / "compile_cache"
    compiled = [*_flags(tiny_bert, ddp_data, out), "--torch_compile_backend", "aot_eager"]
    compiled += ["--compile_cache_dir", str(cache)]
    # torch's dropout masks, as the compiled run's plan chooses (uncompiled, some CPUs would draw bulk ones)
    uncompiled = [*_flags(tiny_bert, ddp_data, reference), "--dropout_mask", "torch"]
    eager = LoggedProcess([PYTHON, RUN_QA, *uncompiled], tmp_path / "eager.log")
    dynamic = [*compiled, "--compile_shapes", "dynamic", "--compile_scope", "regions"]
    first = LoggedProcess([PYTHON, RUN_QA, *dynamic], tmp_path / "first.log")
    try:
        # signalled once it has a plan (its handler is installed before): it stops at the end of its first
        # step, whichever moment the signal lands before then, so that the resumed run has steps over
        # several batch shapes left (compiled steps take milliseconds: a signal after the first logged loss
        # may land near the end)
        first.wait_for(r"\[rank0\] INFO \S+: PLAN device=")
        os.kill(first.proc.pid, signal.SIGTERM)
        assert first.proc.wait(timeout=300) == EXIT_PREEMPTED, first.text()[-3000:]
        assert eager.proc.wait(timeout=300) == 0, eager.text()[-3000:]
    finally:
        first.kill_all()
        eager.kill_all()
    log = first.text()
    step = int(re.search(r"PREEMPTED signal=SIGTERM global_step=(\d+) ", log).group(1))
    assert step == 1, log[-3000:]

    compiled_line = r"COMPILE graphs=(\d+) batch_shapes=(\d+) cache_hits=0 cache_misses=0"  # no inductor
    graphs, shapes = map(int, re.search(compiled_line, log).groups())
    assert graphs == 3 and 1 <= shapes <= BUCKETS_AT_128 + 1, log[-3000:]
    assert re.search(r"^EFFECTIVE rank=0 .* attn=sdpa_always_masked ", log, re.M), log[-3000:]
    planned_dynamic = (
        f"dynamic=True recompile_limit=torch scope=regions cache={cache}: --compile_shapes dynamic: one "
        "graph, its sizes symbolic over 6 batch shapes per pass"
    )
    assert planned_dynamic in log, log[-3000:]
    assert re.search(r"compile_dynamic=True recompile_limit=\d+ compile_scope=regions ", log)
    # TensorBoard on, as users run: its batch counts stay out of the graphs (a hook on the model was traced
    # into them, one recompile per step)
    again = ok(run_qa([*compiled, "--report_to", "tensorboard"]))
    graphs, shapes = map(int, re.search(compiled_line, again).groups())
    assert graphs == shapes and 2 <= shapes <= BUCKETS_AT_128 + 1, f"stopped at {step}: {again[-3000:]}"
    assert_resumed_exactly(out, reference, log, again, step)
    assert read(out / "eval_predictions.json") == read(reference / "eval_predictions.json")
    planned = (
        "dropout_mask=torch (auto: compiled: the graphs draw their own masks) "
        "pad_to_buckets=48,64,88,112,128 (on: 5 widths from 128/3 to 128, multiples of 8) "
        "attn_backend=all (auto: CPU: torch's own choice (flash or math)) "
        "compile=on (backend=aot_eager mode=default dynamic=False recompile_limit=14 scope=model "
        f"cache={cache}: 6 batch shapes per pass, one graph each) cuda_graphs=off (CPU: CUDA graphs need "
        "a GPU)"
    )
    assert planned in again, again[-3000:]
    effective = "compile_backend=aot_eager compile_mode=default compile_dynamic=False recompile_limit=14 "
    assert f"{effective}compile_scope=model " in again


def test_a_compile_cache_kept_between_runs_is_found_warm(tmp_path: Path, monkeypatch) -> None:
    """Inductor's graph cache in the folder a run keeps (--compile_cache_dir): the first compile of a graph
    misses and fills it; once dynamo has forgotten the graph, as a later process has, the same compile finds
    its kernels there. The COMPILE line's cache_hits / cache_misses count exactly these lookups. Asked for
    CUDA graphs (reduce-overhead), a graph that runs without them is counted too: on a CPU inductor leaves
    them out of every graph, cold or warm (cuda_graph_skips, on the line only when the plan has CUDA graphs).
    bench/gpu_speed_probe.py's figures count the same. (A matrix product: inductor calls torch's own kernel
    and compiles no C++: 4 s here, 16 for a pointwise op.)"""
    import torch

    def squared(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x)

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))
    lines = []
    before = compile_figures()
    for cuda_graphs in (True, True, False):
        torch.compiler.reset()
        steps = CompiledSteps(torch_compile=True, cuda_graphs=cuda_graphs)
        mode = "reduce-overhead" if cuda_graphs else "default"
        torch.compile(squared, backend="inductor", mode=mode, dynamic=False)(torch.ones(8, 8))
        lines.append(steps.summary())
    torch.compiler.reset()
    assert lines == [
        "COMPILE graphs=1 batch_shapes=0 cache_hits=0 cache_misses=1 cuda_graph_skips=1",  # cold
        "COMPILE graphs=1 batch_shapes=0 cache_hits=1 cache_misses=0 cuda_graph_skips=1",  # warm
        # another mode is another cache entry; no CUDA graphs planned, none to count
        "COMPILE graphs=1 batch_shapes=0 cache_hits=0 cache_misses=1",
    ]
    after = compile_figures()
    counted = {key: after[key] - (before[key] or 0) for key in after if key != "compile_seconds"}
    assert counted == {
        "compiled_graphs": 3,
        "compile_cache_hits": 1,
        "compile_cache_misses": 2,
        "cuda_graph_skips": 2,
    }

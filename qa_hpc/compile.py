"""torch.compile as the plan decided it, around the Trainer's own --torch_compile path.

transformers hands torch.compile to accelerate (TorchDynamoPlugin: backend, mode, and `dynamic` and regional
compilation through ACCELERATE_DYNAMO_* variables, RunPlan.environment); what that path lacks is here: where
the compiled kernels are kept between runs (`cache_dir_for`, `make_cache_dir`); a compiler that cannot work
on this machine found before training (`compile_failure`: the run then takes the eager plan,
qa_hpc.plan.decide_after_compile_failed); the recompile limit over the fixed batch shapes
(`apply_recompile_limit`); and in the Trainer's steps (`CompiledSteps`) the CUDA graph step boundaries
marked, outputs kept out of the graphs' memory, and the graphs built counted against the batch shapes seen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from accelerate.utils import has_compiled_regions, is_compiled_module

from qa_hpc.errors import UsageError
from qa_hpc.plan import RunPlan

logger = logging.getLogger(__name__)


def _probe(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 + 1.0)


def compile_failure(plan: RunPlan, gpu_index: int | None) -> str | None:
    """Why the plan's compiler cannot work here (one line), or None when it works or compile is off. A
    two-op function is compiled and run with the plan's backend and mode on its device (on a GPU this rank's,
    `gpu_index`: before the Trainer picks it, torch's current GPU is the first for every rank, each of which
    would leave a context there): what a missing C++ compiler (inductor on a CPU), a missing Triton (on a
    GPU) or an unsupported Python would make the model's first step raise is found before anything is
    written."""
    if not plan.torch_compile:
        return None
    on_gpu = plan.device == "cuda"
    device = f"cuda:{gpu_index}" if on_gpu else plan.device
    try:
        # the current GPU too: CUDA graphs' recording synchronizes and takes streams on it
        with torch.cuda.device(gpu_index) if on_gpu else contextlib.nullcontext():
            compiled = torch.compile(
                _probe, backend=plan.compile_backend, mode=plan.compile_mode, dynamic=False
            )
            compiled(torch.ones(8, device=device))
    except Exception as err:  # noqa: BLE001 - any failure to compile: the run goes eager, saying why
        return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    return None


def cache_dir_for(given: str | None, env: Mapping[str, str]) -> str:
    """Where torch.compile keeps what it compiled: --compile_cache_dir, else TORCHINDUCTOR_CACHE_DIR, else
    beside the Hugging Face cache. Torch's own default, /tmp/torchinductor_<user>, is on the node and often
    emptied after each job on clusters: every job, a requeued one too, would compile cold (~130 s for
    bert-base on one H200; a warm compile of its shape took a quarter of the cold one on a CPU)."""
    from huggingface_hub import constants
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    set_by_user = env.get("TORCHINDUCTOR_CACHE_DIR")
    # importing transformers' model code imports torch._dynamo, which writes torch's own default into the
    # environment: that value is torch's choice, not the user's
    if set_by_user and os.path.abspath(set_by_user) == os.path.abspath(default_cache_dir()):
        set_by_user = None
    chosen = given or set_by_user or os.path.join(constants.HF_HOME, "qa_hpc_compile")
    return os.path.abspath(chosen)


def make_cache_dir(folder: str) -> None:
    """A compiled run's cache folder, made and written to before anything compiles: where it cannot be,
    torch would fail inside its first compile, with some of its modules half imported (a later import then
    fails too), so the run stops here naming the folder (exit 2)."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UsageError(
            f"--compile_cache_dir {folder}: cannot write there ({err.strerror}); give a folder this run can "
            "write (default: TORCHINDUCTOR_CACHE_DIR, else <HF_HOME>/qa_hpc_compile)"
        ) from err


def apply_recompile_limit(plan: RunPlan) -> None:
    """The process-wide compile setting the plan owns: the recompile limit (each fixed batch shape is one
    cache entry of the model's forward; past the limit torch would run that shape eagerly)."""
    if plan.recompile_limit is not None:
        torch.compiler.config.recompile_limit = plan.recompile_limit


class CompileCounts(NamedTuple):
    """What dynamo and inductor compiled in this process so far, by their own counters (torch has no public
    ones); `since` gives one run's share."""

    graphs: int  # graphs dynamo built
    cache_hits: int  # inductor's graph cache: kernels an earlier run left in the cache folder (compiled warm)
    cache_misses: int
    # graphs inductor ran without the CUDA graphs asked for (a CPU tensor in the graph, an input mutated, too
    # many re-recordings, ...): those steps launch kernel by kernel, with only a warning in the log
    cuda_graph_skips: int

    @classmethod
    def now(cls) -> CompileCounts:
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        return cls(
            graphs=int(counters["stats"]["unique_graphs"]),
            cache_hits=int(inductor["fxgraph_cache_hit"]),
            cache_misses=int(inductor["fxgraph_cache_miss"]),
            cuda_graph_skips=int(inductor["cudagraph_skips"]),
        )

    def since(self, before: CompileCounts) -> CompileCounts:
        return CompileCounts(*(now - then for now, then in zip(self, before, strict=True)))


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether `model` runs compiled code: compiled whole, or its regions (--compile_scope regions)."""
    return is_compiled_module(model) or has_compiled_regions(model)


class CompiledSteps:
    """What the Trainer's steps need under torch.compile; with compile off, or a step that runs the model
    uncompiled (transformers 5.23 evaluates after training with the plain model), it does nothing. Each batch
    shape a compiled step sees is noted, by pass (training, evaluation), to compare with the graphs built
    (`summary`). With CUDA graphs, every compiled step starts a new graph iteration
    (torch.compiler.cudagraph_mark_step_begin), and the outputs a prediction step hands on are copied out of
    the graphs' memory, which the next replay overwrites while the evaluation loop still holds them."""

    def __init__(self, torch_compile: bool, cuda_graphs: bool) -> None:
        self.torch_compile = torch_compile
        self.cuda_graphs = cuda_graphs
        self.shapes: set[tuple[bool, tuple[int, ...]]] = set()
        self.counts_before = CompileCounts.now() if torch_compile else None

    def begin(self, model: torch.nn.Module, inputs: dict[str, Any], training: bool) -> None:
        """Before a step of `model` (training: a training step, which itself puts the model in train mode)."""
        if not (self.torch_compile and is_compiled(model)):
            return
        self.shapes.add((training, tuple(inputs["input_ids"].shape)))
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def own(self, model: torch.nn.Module, outputs: Any) -> Any:
        """`outputs` (a tensor, tuples of them, or None) in memory of their own when CUDA graphs made them."""
        if not (self.cuda_graphs and is_compiled(model)):
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs.clone()
        if isinstance(outputs, tuple):
            return tuple(self.own(model, item) for item in outputs)
        return outputs

    def summary(self) -> str | None:
        """`COMPILE graphs=N batch_shapes=M cache_hits=H cache_misses=K`: under dynamic=False, one graph per
        shape and pass (and region) when nothing breaks a graph or recompiles; inductor's cache lookups
        (none with a backend other than inductor; hits: compiled warm); with CUDA graphs, then
        `cuda_graph_skips=S`: graphs that run without them (0 when every step is captured). None with
        compile off."""
        if self.counts_before is None:
            return None
        counts = CompileCounts.now().since(self.counts_before)
        line = (
            f"COMPILE graphs={counts.graphs} batch_shapes={len(self.shapes)} cache_hits={counts.cache_hits} "
            f"cache_misses={counts.cache_misses}"
        )
        if self.cuda_graphs:
            line += f" cuda_graph_skips={counts.cuda_graph_skips}"
        return line

"""The settings path of run_qa.setup with buckets, an attention list and torch.compile, in process and without
training: each reaches the Trainer, accelerate or torch before the model runs, is read back and checked
against the plan; a compiler that cannot work here makes the run eager, saying so in one line. What the
Trainer's steps call around a compiled model, CUDA graphs' part included (made up here)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import tempfile
from collections.abc import Callable

import pytest
import torch
from fixtures.machines import one_h200
from fixtures.procs import tiny_flags

from qa_hpc import attention
from qa_hpc.batching import BucketCollator
from qa_hpc.compile import CompiledSteps, cache_dir_for, compile_failure
from qa_hpc.device import read_device_facts
from qa_hpc.errors import UsageError
from qa_hpc.flags import decide_and_build, read_flags
from qa_hpc.plan import decide
from qa_hpc.preemption import StopRequest


def _argv(tiny_bert, demo_files, tmp_path, *extra: str) -> list[str]:
    train = ("--do_train", "--train_file", str(demo_files["train"]), "--num_threads", "1")
    return tiny_flags(tiny_bert, tmp_path / "out", *train, *extra)


def test_buckets_kernels_and_compile_reach_the_trainer_and_read_back(
    tiny_bert, demo_files, tmp_path, process_settings
):
    import run_qa

    argv = _argv(
        tiny_bert,
        demo_files,
        tmp_path,
        "--attn_backend",
        "math,flash",
        "--pad_to_buckets",
        "64,128",
        "--torch_compile_backend",
        "eager",
    )
    facts = read_device_facts()
    values = read_flags(argv)
    plan, flags = decide_and_build(values, facts)
    # not torch's default, 8, which the planned limit equals here: the read-back must see the plan's
    torch.compiler.config.recompile_limit = 1
    run = run_qa.setup(values, flags, plan, facts, StopRequest())
    effective = run.effective
    effective.check(plan)  # every setting as planned (run_qa.main stops the run otherwise)
    assert isinstance(run.trainer.data_collator, BucketCollator)
    assert (effective.pad_to_buckets, effective.attn_backend) == ((64, 128), "flash,math")
    assert (effective.torch_compile, effective.compile_backend, effective.compile_mode) == (
        True,
        "eager",
        "default",
    )
    # 2 widths: 3 shapes a pass; training's, evaluation's, prediction's short batch, one spare
    assert (effective.compile_dynamic, effective.recompile_limit, effective.cuda_graphs) == (False, 8, False)
    torch.backends.cuda.enable_cudnn_sdp(True)  # a kernel the plan left off, turned on behind its back
    with pytest.raises(RuntimeError, match="attn_backend: planned flash,math, effective flash,cudnn,math"):
        dataclasses.replace(effective, attn_backend=attention.enabled("sdpa")).check(plan)


def test_dynamic_compile_shapes_reach_accelerate_and_read_back(
    tiny_bert, demo_files, tmp_path, process_settings
):
    """--compile_shapes dynamic: accelerate's dynamo plugin gets dynamic=True (through the one variable it
    reads), no recompile limit is set, and the run reads both back."""
    import run_qa

    argv = _argv(
        tiny_bert,
        demo_files,
        tmp_path,
        "--pad_to_buckets",
        "64,128",
        "--torch_compile_backend",
        "eager",
        "--compile_shapes",
        "dynamic",
    )
    facts = read_device_facts()
    limit = torch.compiler.config.recompile_limit
    values = read_flags(argv)
    plan, flags = decide_and_build(values, facts)
    effective = run_qa.setup(values, flags, plan, facts, StopRequest()).effective
    effective.check(plan)
    assert (plan.compile_dynamic, effective.compile_dynamic) == (True, True)
    assert plan.recompile_limit is None and effective.recompile_limit == limit  # torch's own, untouched
    cache = tmp_path / "compile_cache"
    reason = (
        f"dynamic=True recompile_limit=torch scope=model cache={cache}: --compile_shapes dynamic: one graph"
    )
    assert f"{reason}, its sizes symbolic over 3 batch shapes per pass)" in plan.log_line()
    assert (effective.compile_scope, effective.compile_cache_dir) == ("model", str(cache))


@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is not None,
    reason="onnxruntime is installed: the onnxrt backend works here",
)
def test_a_compiler_that_cannot_work_here_falls_back_to_eager_saying_so(
    tiny_bert, demo_files, tmp_path, capsys, process_settings
):
    """onnxrt is a backend accelerate passes on, which torch cannot use without onnxruntime: as a missing
    C++ compiler or Triton, found before anything is written."""
    argv = _argv(tiny_bert, demo_files, tmp_path, "--torch_compile_backend", "onnxrt")
    plan, flags = decide_and_build(read_flags(argv), read_device_facts())
    assert capsys.readouterr().out == (
        "COMPILE fallback=eager reason=InvalidBackend: Invalid backend: 'onnxrt', see "
        "`torch._dynamo.list_backends()` for available backends.\n"
    )
    assert not plan.torch_compile and not flags.training.torch_compile
    assert flags.training.torch_compile_backend is None and plan.compile_dynamic is None
    assert "compile=off (fallback=eager: --torch_compile_backend onnxrt failed here)" in plan.log_line()


def test_the_compiler_is_tried_on_this_ranks_gpu(tmp_path, monkeypatch, process_settings):
    """On a GPU node every rank tries the compiler on its own GPU, not on the first one, where each rank
    would leave a CUDA context (made up here: torch's compile and tensor factory stand in)."""
    values = {**read_flags(["--output_dir", str(tmp_path), "--torch_compile"]), "compile_cache_dir": "c"}
    plan = decide(values, read_device_facts())  # the plan alone: decide_and_build tries the compiler
    gpu_plan = dataclasses.replace(plan, device="cuda")
    tried_on, current = [], []

    @contextlib.contextmanager
    def current_gpu(index):
        current.append(index)
        yield

    monkeypatch.setattr(torch, "compile", lambda fn, **settings: fn)
    monkeypatch.setattr(torch, "ones", lambda n, device: tried_on.append(device) or torch.zeros(n))
    monkeypatch.setattr(torch.cuda, "device", current_gpu)
    assert compile_failure(gpu_plan, gpu_index=3) is None and (tried_on, current) == (["cuda:3"], [3])
    # a CPU run on a GPU node (--use_cpu) touches no GPU
    assert compile_failure(plan, gpu_index=0) is None and (tried_on[-1], current) == ("cpu", [3])


def test_regions_reach_accelerate_and_read_back(tiny_bert, demo_files, tmp_path, process_settings):
    """--compile_scope regions: accelerate's dynamo plugin gets use_regional_compilation (through the one
    variable it reads; its compile_regions then compiles each repeated layer), and the run reads it back."""
    import run_qa

    argv = _argv(
        tiny_bert, demo_files, tmp_path, "--torch_compile_backend", "eager", "--compile_scope", "regions"
    )
    facts = read_device_facts()
    values = read_flags(argv)
    plan, flags = decide_and_build(values, facts)
    effective = run_qa.setup(values, flags, plan, facts, StopRequest()).effective
    effective.check(plan)
    assert (plan.compile_scope, effective.compile_scope) == ("regions", "regions")
    assert "recompile_limit=torch scope=regions cache=" in plan.log_line()


def test_the_compile_cache_is_the_flags_else_torchs_variable_else_beside_the_hf_cache(monkeypatch, tmp_path):
    """A folder kept between jobs, unlike torch's own in /tmp: --compile_cache_dir, else
    TORCHINDUCTOR_CACHE_DIR as the user set it, else <HF_HOME>/qa_hpc_compile; made absolute, as torch makes
    it (ranks started in other directories agree)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that it is restored, whatever torch writes below
    kept = {"TORCHINDUCTOR_CACHE_DIR": "/scratch/inductor"}
    assert cache_dir_for("given", kept) == str(tmp_path / "given")
    assert cache_dir_for(None, kept) == "/scratch/inductor"
    assert cache_dir_for(None, {}) == str(tmp_path / "hf_home" / "qa_hpc_compile")
    # torch writes its own default into the environment when transformers' BERT imports torch._dynamo (as
    # run_qa.py's imports do, before the flags are read; torch._dynamo.package calls this): still beside
    # the HF cache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    torch_default = cache_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == torch_default
    assert torch_default.startswith(os.path.join(tempfile.gettempdir(), "torchinductor_"))
    assert cache_dir_for(None, os.environ) == str(tmp_path / "hf_home" / "qa_hpc_compile")


def test_a_cache_folder_the_run_cannot_write_stops_it_naming_the_folder(
    tiny_bert, demo_files, tmp_path, process_settings
):
    """Found before anything compiles (inside a compile, torch would fail with its modules half imported):
    exit 2 with the folder and the way out."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cache = blocker / "compile"
    argv = _argv(
        tiny_bert, demo_files, tmp_path, "--torch_compile_backend", "eager", "--compile_cache_dir", str(cache)
    )
    with pytest.raises(
        UsageError, match=f"--compile_cache_dir {cache}: cannot write there \\(Not a directory\\)"
    ):
        decide_and_build(read_flags(argv), read_device_facts())
    # compile off: the folder is not needed, nor made
    eager = _argv(tiny_bert, demo_files, tmp_path, "--compile_cache_dir", str(cache))
    plan, _ = decide_and_build(read_flags(eager), read_device_facts())
    assert plan.compile_cache_dir is None
    # one GPU process (made up), its compile waiting for the batch count: found now, before the data is read
    bf16 = read_flags([*eager, "--precision", "bf16"])  # as the compile was measured
    with pytest.raises(UsageError, match=f"--compile_cache_dir {cache}: cannot write there"):
        decide_and_build(bf16, one_h200())


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["cuda_graphs", "no_cuda_graphs"])
def test_compiled_steps_note_shapes_start_graph_steps_and_copy_outputs_out_of_graph_memory(
    monkeypatch, cuda_graphs: bool
):
    """CompiledSteps, the calls QuestionAnsweringTrainer's training and prediction steps make around a
    compiled model (made here, not compiled: torch compiles on the first call; the steps themselves,
    compiled, in tests/e2e/test_compile.py): each shape noted by pass; with CUDA graphs a graph step begun
    per step and a prediction step's outputs copied (the next replay overwrites graph memory), else handed on
    as they are. A model that runs uncompiled (evaluation after training) is left alone."""
    begun = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: begun.append(True))
    plain = torch.nn.Linear(4, 2)
    compiled = torch.compile(plain)
    steps = CompiledSteps(torch_compile=True, cuda_graphs=cuda_graphs)
    batch = {"input_ids": torch.zeros(8, 128, dtype=torch.long)}
    steps.begin(compiled, batch, training=True)
    steps.begin(compiled, batch, training=False)
    steps.begin(plain, {"input_ids": torch.zeros(8, 64, dtype=torch.long)}, training=False)
    assert steps.shapes == {(True, (8, 128)), (False, (8, 128))}
    assert len(begun) == (2 if cuda_graphs else 0)
    loss, logits = torch.tensor(1.5), (torch.ones(8, 128), torch.zeros(8, 128))
    owned_loss, owned_logits = steps.own(compiled, loss), steps.own(compiled, logits)
    assert steps.own(compiled, None) is None
    assert torch.equal(owned_loss, loss) and all(map(torch.equal, owned_logits, logits))
    copied = [owned_loss.data_ptr() != loss.data_ptr()]
    copied += [new.data_ptr() != old.data_ptr() for new, old in zip(owned_logits, logits, strict=True)]
    assert copied == [cuda_graphs] * 3
    assert steps.own(plain, loss) is loss  # uncompiled: its outputs are its own


def _step_graphs(model: torch.nn.Module, scope: str) -> list[torch.fx.GraphModule]:
    """The forward and backward graphs AOT autograd makes of `model`'s training step compiled whole or in
    regions (as --compile_scope sets it), over two batch widths with a padded row, in the model's device."""
    from accelerate.utils import compile_regions
    from functorch.compile import aot_module_simplified, make_boxed_func

    graphs: list[torch.fx.GraphModule] = []

    def keep(graph: torch.fx.GraphModule, _inputs: list) -> Callable:
        graphs.append(graph)
        return make_boxed_func(graph.forward)

    def backend(graph: torch.fx.GraphModule, inputs: list) -> Callable:
        return aot_module_simplified(graph, inputs, fw_compiler=keep, bw_compiler=keep)

    compile_with = compile_regions if scope == "regions" else torch.compile
    compiled = compile_with(model, backend=backend, dynamic=True)
    device = next(model.parameters()).device
    for width in (48, 64):
        ids = torch.randint(1000, 2000, (4, width), device=device)
        mask = torch.ones_like(ids)
        mask[0, width // 2 :] = 0
        positions = torch.zeros(4, dtype=torch.long, device=device)
        out = compiled(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=torch.zeros_like(ids),
            start_positions=positions,
            end_positions=positions + 1,
        )
        out.loss.backward()
    return graphs


def _what_keeps_cuda_graphs_out(graph: torch.fx.GraphModule) -> list[str]:
    """What in `graph` would make torch run it kernel by kernel rather than record it in a CUDA graph (the
    checks of its cudagraph trees, which inductor's reduce-overhead and dynamo's cudagraphs backend share):
    a tensor on the CPU, an input it writes to, an op CUDA graphs cannot hold (one that reads a value back to
    the host, one whose output size depends on the data)."""
    from torch._dynamo.backends.cudagraphs import find_input_mutations
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    found = [
        f"a tensor on the CPU: {node.name}"
        for node in graph.graph.nodes
        if isinstance(value := node.meta.get("val"), torch.Tensor) and value.device.type == "cpu"
    ]
    if mutated := find_input_mutations(graph.graph):
        found.append(f"inputs written to: {sorted(mutated)}")
    if (node := get_first_incompatible_cudagraph_node(graph)) is not None:
        found.append(f"an op CUDA graphs cannot hold: {node.name}")
    return found


def _bert_on_meta(tiny_bert, scope: str) -> torch.nn.Module:
    """The tiny BERT as run_qa.py compiles it (under --compile_scope regions, the padding mask built for every
    batch), on the meta device, which stands in for a GPU: it runs no kernel, so a tensor found on the CPU is
    one the code made there."""
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert), attn_implementation="sdpa")
    if scope == "regions":
        assert attention.mask_every_batch(model)
    return model.to("meta").train()


# backward through cross-entropy on the meta device: torch warns that it has no autograd kernel there
META_LOSS = pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered:UserWarning")


@META_LOSS
@pytest.mark.parametrize("scope", ["model", "regions"])
def test_a_compiled_training_step_holds_nothing_that_keeps_cuda_graphs_from_recording_it(
    tiny_bert, scope: str
):
    """On a GPU, CUDA graphs (the plan's cuda_graphs=on) record a compiled graph only where it reads no tensor
    on the CPU, writes to none of its inputs and holds no op that reads a value back to the host or sizes its
    output by the data; a graph that does runs kernel by kernel, with one warning in the log. The training
    step's forward and backward graphs, compiled whole or in regions over two widths, hold none of these:
    one forward and one backward graph for both widths, per region (embeddings, layers, QA head)."""
    torch.compiler.reset()
    graphs = _step_graphs(_bert_on_meta(tiny_bert, scope), scope)
    assert len(graphs) == (6 if scope == "regions" else 2)
    assert [_what_keeps_cuda_graphs_out(graph) for graph in graphs] == [[]] * len(graphs)


@META_LOSS
def test_the_cuda_graph_checks_find_a_tensor_made_on_the_cpu(tiny_bert):
    """The check above can fail: a QA head that adds a tensor made on the CPU to its logits is found."""
    model = _bert_on_meta(tiny_bert, "model")
    head = model.qa_outputs
    head.forward = lambda hidden, linear=head.forward: linear(hidden) + torch.tensor(0.0)
    torch.compiler.reset()
    found = [
        reason for graph in _step_graphs(model, "model") for reason in _what_keeps_cuda_graphs_out(graph)
    ]
    assert any(reason.startswith("a tensor on the CPU") for reason in found), found

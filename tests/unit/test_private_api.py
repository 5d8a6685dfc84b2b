"""qa_hpc/private_api.py, the one list of private and undocumented library API the project uses: each entry
is still there and shaped as its files use it, its library is the version it was written against (an
upgrade fails here until someone re-checks the entry), every entry has a check, and every listed file still
uses its name."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import inspect
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

import pytest
import torch
from conftest import REPO

from qa_hpc.private_api import PRIVATE_API, PrivateUse


def parameters(function: Callable) -> list[str]:
    return list(inspect.signature(function).parameters)


def check_set_pg_timeout(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    assert parameters(distributed_c10d._set_pg_timeout) == ["timeout", "group"]
    # on a real gloo group of one process, as a CPU job has it
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        distributed_c10d._set_pg_timeout(timedelta(seconds=7))
    finally:
        dist.destroy_process_group()


def check_profiler_step_state(tmp_path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    steps = schedule(wait=0, warmup=1, active=1, skip_first=4)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=steps)
    assert prof.step_num == 0
    assert prof.current_action == steps(0)
    # as qa_hpc/observe/profiler.py starts it: at step 5, in the schedule's action for step 5
    prof.step_num = 5
    prof.current_action = steps(5)
    prof.start()
    torch.ones(4, 4).matmul(torch.ones(4, 4))
    prof.stop()
    # the trace keeps the step names (the tables group them as ProfilerStep*)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert '"ProfilerStep#5"' in trace.read_text(encoding="utf-8")


def check_summary_writer_file_writer(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    writer = SummaryWriter(log_dir=str(tmp_path))
    for summary in hparams({"lr": 0.1}, {"hparam/f1": 50.0}):
        writer.file_writer.add_summary(summary)
    writer.close()
    (event_file,) = tmp_path.rglob("events.out.tfevents.*")
    assert b"hparams" in event_file.read_bytes()


def check_dataset_fingerprint(tmp_path: Path) -> None:
    import datasets

    examples = datasets.Dataset.from_dict({"id": ["a", "b"]})
    assert isinstance(examples._fingerprint, str)
    assert examples.select([0])._fingerprint != examples._fingerprint


def check_get_eval_sampler(tmp_path: Path) -> None:
    from transformers import Trainer

    assert parameters(Trainer._get_eval_sampler) == ["self", "eval_dataset"]
    # an override nothing calls would change nothing, silently
    assert "sampler_fn=self._get_eval_sampler" in inspect.getsource(Trainer.get_eval_dataloader)


def check_memory_tracker(tmp_path: Path) -> None:
    from transformers import Trainer
    from transformers.trainer_utils import TrainerMemoryTracker

    assert "self._memory_tracker = TrainerMemoryTracker(" in inspect.getsource(Trainer.__init__)
    assert parameters(TrainerMemoryTracker.start) == ["self"]
    assert parameters(TrainerMemoryTracker.stop_and_update_metrics) == ["self", "metrics"]


def check_loss_filter_rule(tmp_path: Path) -> None:
    """The rule QuestionAnsweringTrainer.training_step keeps on the device, as the Trainer applies it."""
    from transformers import Trainer

    loop = inspect.getsource(Trainer._run_epoch)
    assert "self.args.logging_nan_inf_filter" in loop
    assert (
        "self._tr_loss += self._tr_loss / (1 + self.state.global_step - self._globalstep_last_logged)" in loop
    )
    assert "self._tr_loss += tr_loss_step" in loop
    assert "self._globalstep_last_logged = self.state.global_step" in inspect.getsource(Trainer)


def check_speed_metrics(tmp_path: Path) -> None:
    from transformers.trainer_utils import speed_metrics

    metrics = speed_metrics("eval", time.time() - 2, num_samples=10, num_steps=5)
    assert set(metrics) == {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def check_prediction_output(tmp_path: Path) -> None:
    from transformers.trainer_utils import PredictionOutput

    assert PredictionOutput._fields == ("predictions", "label_ids", "metrics")


def check_default_logdir(tmp_path: Path) -> None:
    from transformers.integrations.integration_utils import default_logdir

    logdir = default_logdir()
    assert logdir.startswith("runs" + os.sep)
    assert logdir.endswith("_" + socket.gethostname())


def check_tensorboard_logging_dir(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    callback = TensorBoardCallback()
    callback.logging_dir = str(tmp_path / "planned")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    callback.on_train_begin(args, TrainerState(is_world_process_zero=True), TrainerControl())
    callback.on_train_end(args, TrainerState(is_world_process_zero=True), TrainerControl())
    assert [*(tmp_path / "planned").glob("events.out.tfevents.*")] and not (tmp_path / "out").exists()


def check_attn_implementation(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForQuestionAnswering

    config = BertConfig(
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        vocab_size=10,
        attn_implementation="eager",
    )
    assert config._attn_implementation == "eager"
    model = BertForQuestionAnswering(config)
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"


def check_validate_launch_command(tmp_path: Path) -> None:
    from accelerate.commands.launch import _validate_launch_command

    assert parameters(_validate_launch_command) == ["args"]


def check_filter_args(tmp_path: Path) -> None:
    from accelerate.commands.launch import _filter_args

    assert parameters(_filter_args) == ["args", "parser", "default_args"]


def check_argparse_actions(tmp_path: Path) -> None:
    from transformers import HfArgumentParser

    @dataclass
    class Flags:
        backend: Literal["gloo", "nccl"] = field(default="gloo")

    parser = HfArgumentParser(Flags)
    assert isinstance(parser, argparse.ArgumentParser)
    choices = {action.dest: action.choices for action in parser._actions}
    assert list(choices["backend"]) == ["gloo", "nccl"]


def check_execute_child(tmp_path: Path) -> None:
    assert inspect.isfunction(subprocess.Popen._execute_child)
    assert "self._execute_child(" in inspect.getsource(subprocess.Popen.__init__)


def check_dynamo_counters(tmp_path: Path) -> None:
    import torch
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    before = counters["stats"]["unique_graphs"]
    torch.compile(lambda x: x * 2, backend="eager", dynamic=False)(torch.ones(3))
    assert counters["stats"]["unique_graphs"] == before + 1  # one graph, as qa_hpc/compile.py counts it
    # inductor's cache lookups (qa_hpc.compile.CompileCounts), where inductor's graph cache counts them;
    # counted in a real compile by tests/e2e/test_compile.py (a unit test starts no C++ compiler)
    from torch._inductor.codecache import FxGraphCache

    source = inspect.getsource(FxGraphCache.load_with_key)
    assert all(f'counters["inductor"]["fxgraph_cache_{what}"] += 1' in source for what in ("hit", "miss"))
    # CUDA graphs left out (CompileCounts.cuda_graph_skips): inductor says why in one function, which counts
    from torch._inductor import cudagraph_utils

    source = inspect.getsource(cudagraph_utils.log_cudagraph_skip_and_bump_counter)
    assert 'counters["inductor"]["cudagraph_skips"] += 1' in source


def check_default_cache_dir(tmp_path: Path) -> None:
    import torch._dynamo.package
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    # torch._dynamo's import asks for the cache folder, and asking writes torch's default where none is set
    assert "cache_dir()" in inspect.getsource(torch._dynamo.package)
    previous = os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    try:
        assert cache_dir() == os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def check_dynamo_plugin(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import TorchDynamoPlugin

    # the state is shared by every Accelerator of the process: one an earlier test built keeps its plugin
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager", mode="default"))
        plugin = accelerator.state.dynamo_plugin  # as Effective.read reads the Trainer's
        assert (plugin.backend.value.lower(), plugin.mode) == ("eager", "default")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


@contextlib.contextmanager
def env_var(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` within, then as it was."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def check_dynamo_use_dynamic(tmp_path: Path) -> None:
    from accelerate.utils import TorchDynamoPlugin

    with env_var("ACCELERATE_DYNAMO_USE_DYNAMIC", "false"):
        assert TorchDynamoPlugin(backend="eager").dynamic is False


def check_dynamo_use_regional_compilation(tmp_path: Path) -> None:
    from accelerate.utils import TorchDynamoPlugin

    with env_var("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true"):
        assert TorchDynamoPlugin(backend="eager").use_regional_compilation is True


def check_length_grouped_indices(tmp_path: Path) -> None:
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    order = get_length_grouped_indices([5, 1, 9, 3], 2, generator=torch.Generator().manual_seed(0))
    assert sorted(order) == [0, 1, 2, 3]


def check_compile_modes(tmp_path: Path) -> None:
    from torch._inductor import list_mode_options

    modes = list(list_mode_options())
    assert {"default", "reduce-overhead", "max-autotune"} <= set(modes)
    # the names torch.compile takes are those, and no other
    torch.compile(torch.nn.Identity(), mode=modes[-1])
    with pytest.raises(RuntimeError, match="Unrecognized mode=nosuch"):
        torch.compile(torch.nn.Identity(), mode="nosuch")


def check_calculate_time_spent(tmp_path: Path) -> None:
    from torch._dynamo.utils import calculate_time_spent

    torch.compiler.reset()
    torch.compile(lambda x: x * 2, backend="eager", dynamic=False)(torch.ones(3))
    assert calculate_time_spent()["total_wall_time"] > 0  # seconds, as gpu_speed_probe.py reads them


def check_cuda_graph_rules(tmp_path: Path) -> None:
    from torch._dynamo.backends.cudagraphs import find_input_mutations
    from torch._inductor.utils import get_first_incompatible_cudagraph_node
    from torch.fx.experimental.proxy_tensor import make_fx

    def writes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * y

    def reads(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    ones = (torch.ones(3), torch.ones(3))
    # the graphs' inputs by position, found from the fake values tracing leaves in node.meta
    assert find_input_mutations(make_fx(writes, tracing_mode="fake")(*ones).graph) == {0}
    plain = make_fx(reads, tracing_mode="fake")(*ones)
    assert find_input_mutations(plain.graph) == set()
    assert get_first_incompatible_cudagraph_node(plain) is None
    sized_by_data = make_fx(torch.nonzero, tracing_mode="symbolic")(torch.ones(3))
    assert get_first_incompatible_cudagraph_node(sized_by_data).name == "nonzero"


CHECKS: dict[str, Callable[[Path], None]] = {
    "torch.distributed.distributed_c10d._set_pg_timeout": check_set_pg_timeout,
    "torch.profiler.profile.step_num": check_profiler_step_state,
    "torch.profiler.profile.current_action": check_profiler_step_state,
    "torch.utils.tensorboard.SummaryWriter.file_writer": check_summary_writer_file_writer,
    "datasets.Dataset._fingerprint": check_dataset_fingerprint,
    "transformers.Trainer._get_eval_sampler": check_get_eval_sampler,
    "transformers.Trainer._memory_tracker": check_memory_tracker,
    "transformers.Trainer._tr_loss": check_loss_filter_rule,
    "transformers.Trainer._globalstep_last_logged": check_loss_filter_rule,
    "transformers.trainer_utils.speed_metrics": check_speed_metrics,
    "transformers.trainer_utils.PredictionOutput": check_prediction_output,
    "transformers.integrations.integration_utils.default_logdir": check_default_logdir,
    "transformers.integrations.TensorBoardCallback.logging_dir": check_tensorboard_logging_dir,
    "transformers.PretrainedConfig._attn_implementation": check_attn_implementation,
    "torch._dynamo.utils.counters": check_dynamo_counters,
    "torch._inductor.runtime.cache_dir_utils.default_cache_dir": check_default_cache_dir,
    "accelerate.state.AcceleratorState.dynamo_plugin": check_dynamo_plugin,
    "accelerate.utils.TorchDynamoPlugin.ACCELERATE_DYNAMO_USE_DYNAMIC": check_dynamo_use_dynamic,
    "accelerate.utils.TorchDynamoPlugin.ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": (
        check_dynamo_use_regional_compilation
    ),
    "transformers.trainer_pt_utils.get_length_grouped_indices": check_length_grouped_indices,
    "accelerate.commands.launch._validate_launch_command": check_validate_launch_command,
    "accelerate.commands.launch._filter_args": check_filter_args,
    "argparse.ArgumentParser._actions": check_argparse_actions,
    "subprocess.Popen._execute_child": check_execute_child,
    "torch._inductor.list_mode_options": check_compile_modes,
    "torch._dynamo.utils.calculate_time_spent": check_calculate_time_spent,
    "torch._inductor.runtime.cache_dir_utils.cache_dir": check_default_cache_dir,
    "torch._dynamo.backends.cudagraphs.find_input_mutations": check_cuda_graph_rules,
    "torch._inductor.utils.get_first_incompatible_cudagraph_node": check_cuda_graph_rules,
}


def test_every_listed_use_has_a_check() -> None:
    assert sorted(CHECKS) == sorted(use.name for use in PRIVATE_API)


@pytest.mark.parametrize("use", PRIVATE_API, ids=[use.name for use in PRIVATE_API])
def test_listed_use_is_still_there_on_the_version_written_against(use: PrivateUse, tmp_path: Path) -> None:
    if use.library != "python":
        installed = importlib.metadata.version(use.library).split("+")[0]
        assert installed == use.written_against, (
            f"{use.library} {installed} is installed; {use.name} ({', '.join(use.used_in)}) was written "
            f"against {use.written_against}: check it still does what those files expect, then update "
            "written_against in qa_hpc/private_api.py"
        )
    CHECKS[use.name](tmp_path)


@pytest.mark.parametrize("use", PRIVATE_API, ids=[use.name for use in PRIVATE_API])
def test_listed_files_still_use_the_name(use: PrivateUse) -> None:
    used = use.name.rsplit(".", 1)[-1]
    for path in use.used_in:
        assert used in (REPO / path).read_text(encoding="utf-8"), (
            f"{path} no longer uses {use.name}: take the file out of its entry in qa_hpc/private_api.py "
            "(the entry, when no file is left)"
        )


# the libraries whose private modules and names the list covers, and the folders of the project's code
LISTED_LIBRARIES = ("torch", "transformers", "accelerate", "datasets", "huggingface_hub")
CODE_FOLDERS = ("qa_hpc", "tests", "bench", "scripts", "ci")


def private_paths(source: str) -> set[str]:
    """The dotted names the code (not its comments or strings) reaches from a listed library through a private
    part: `from torch._inductor import x` (torch._inductor.x), `from accelerate.commands.launch import
    _filter_args`, `import torch._dynamo.package`, `torch._dynamo.reset()`."""

    def dotted(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute) and (base := dotted(node.value)):
            return f"{base}.{node.attr}"
        return None

    reached = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            reached += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            reached += [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute) and (name := dotted(node)):
            reached.append(name)
    return {
        name
        for name in reached
        if name.split(".")[0] in LISTED_LIBRARIES
        and any(p.startswith("_") and not p.endswith("__") for p in name.split(".")[1:])  # dunders: public
    }


def listed_for(name: str, path: str) -> bool:
    """An entry for `path` names it, a name it reaches through (an attribute of a listed name), or a name
    inside it (a listed module imported whole)."""
    return any(
        path in use.used_in
        and (use.name == name or name.startswith(f"{use.name}.") or use.name.startswith(f"{name}."))
        for use in PRIVATE_API
    )


def test_every_private_module_path_the_code_reaches_is_listed() -> None:
    """The other way round: a private module or name reached by its path (`from torch._inductor import x`,
    `torch._dynamo.reset()`) in a tracked file is in an entry that lists that file. Private attributes of
    objects (`trainer._memory_tracker`) are listed by hand: a scan cannot tell whose they are."""
    files = [*REPO.glob("*.py"), *(f for folder in CODE_FOLDERS for f in (REPO / folder).rglob("*.py"))]
    own = {"qa_hpc/private_api.py", "tests/unit/test_private_api.py"}  # the list and its checks
    unlisted = [
        f"{path}: {name}"
        for path in sorted({str(f.relative_to(REPO)) for f in files} - own)
        for name in sorted(private_paths((REPO / path).read_text(encoding="utf-8")))
        if not listed_for(name, path)
    ]
    assert not unlisted, "add to qa_hpc/private_api.py, or use a public API: " + "; ".join(unlisted)

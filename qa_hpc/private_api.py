"""Every use of a library's private or undocumented API in this project, in one table: the name, the files
that use it, the library version it was written against, and why no public API does the job.

tests/unit/test_private_api.py fails when an installed library is not the version an entry was written
against (check the entry against the new version, then update `written_against`), when a name is gone or
changed, when a file no longer uses its entry's name (then drop the entry), and when code reaches a private
module or name by its path (`torch._inductor.x`) that no entry lists for that file. Python's standard library
is not pinned: its entries are checked for their shape only.

Looked at and public (documented, or exported by the library's top-level package): TensorBoardCallback,
AttentionInterface and AttentionMaskInterface with their mapping access, `sdpa_attention_forward` (the
attention interface guide imports it), datasets' `Hasher`, accelerate.utils' collectives, torch.profiler's
schedule, torch.utils.tensorboard.summary's `hparams` (in its `__all__`).
"""

from __future__ import annotations

from typing import NamedTuple


class PrivateUse(NamedTuple):
    # the dotted name as the code reaches it; its last part is what the files contain
    name: str
    # files, relative to the checkout
    used_in: tuple[str, ...]
    # the distribution as pip names it, or "python" for the standard library
    library: str
    written_against: str
    why_no_public_api: str


PRIVATE_API: tuple[PrivateUse, ...] = (
    PrivateUse(
        "torch.distributed.distributed_c10d._set_pg_timeout",
        ("qa_hpc/preemption.py",),
        "torch",
        "2.13.0",
        "a process group's timeout is set at init_process_group only, and transformers passes --ddp_timeout "
        "there for GPU backends alone; this gives gloo (CPU jobs) the same timeout",
    ),
    PrivateUse(
        "torch.profiler.profile.step_num",
        ("qa_hpc/observe/profiler.py",),
        "torch",
        "2.13.0",
        "written, with current_action, so that ProfilerStep#S is the Trainer's global step S (also after a "
        "resume); the profiler has no public way to start counting at a given step",
    ),
    PrivateUse(
        "torch.profiler.profile.current_action",
        ("qa_hpc/observe/profiler.py",),
        "torch",
        "2.13.0",
        "written with step_num: the schedule's action for the step the count starts at (2.13's own "
        "_prev_schedule_action stays at step 0's; it is read only after a device stop, or by stop() for a "
        "later start(), neither of which happens here)",
    ),
    PrivateUse(
        "torch.utils.tensorboard.SummaryWriter.file_writer",
        ("qa_hpc/observe/tensorboard.py",),
        "torch",
        "2.13.0",
        "an undocumented attribute: SummaryWriter's only public way to the HPARAMS tab, add_hparams, writes "
        "a second event file in a subfolder; the run's totals go into its one event file",
    ),
    PrivateUse(
        "datasets.Dataset._fingerprint",
        ("qa_hpc/features.py",),
        "datasets",
        "5.2.0",
        "the features cache is keyed by the examples' fingerprint (it changes with a select); datasets has "
        "no public accessor for it",
    ),
    PrivateUse(
        "transformers.Trainer._get_eval_sampler",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "overridden: with group_by_length the Trainer evaluates through a shuffled LengthGroupedSampler; "
        "get_test_dataloader, the public one, would have to be rebuilt whole to change only the sampler",
    ),
    PrivateUse(
        "transformers.Trainer._memory_tracker",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "evaluate() and predict() are replaced whole; this keeps the memory metrics the Trainer's own add "
        "under --skip_memory_metrics False",
    ),
    PrivateUse(
        "transformers.Trainer._tr_loss",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "the logging interval's loss sum on the device: --logging_nan_inf_filter's rule counts a non-finite "
        "step loss as its mean so far; the Trainer applies the rule only after bool()ing every step's loss "
        "(a host-device sync), and exposes the sum nowhere else",
    ),
    PrivateUse(
        "transformers.Trainer._globalstep_last_logged",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "the step of the last log, which that mean divides by (1 + global_step - it), as the Trainer's rule",
    ),
    PrivateUse(
        "transformers.trainer_utils.speed_metrics",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "not exported by transformers nor documented: the Trainer's own runtime / samples_per_second / "
        "steps_per_second keys for the replaced evaluate() and predict()",
    ),
    PrivateUse(
        "transformers.trainer_utils.PredictionOutput",
        ("trainer_qa.py",),
        "transformers",
        "5.23.0",
        "not exported by transformers nor documented as a class: what Trainer.predict returns",
    ),
    PrivateUse(
        "transformers.integrations.integration_utils.default_logdir",
        ("qa_hpc/observe/run.py",),
        "transformers",
        "5.23.0",
        "not exported by transformers.integrations: the TensorBoard folder name the Trainer would choose",
    ),
    PrivateUse(
        "transformers.integrations.TensorBoardCallback.logging_dir",
        ("qa_hpc/observe/tensorboard.py",),
        "transformers",
        "5.23.0",
        "an undocumented attribute, read when the callback makes its writer: the plan's TensorBoard folder "
        "(--logging_dir), also for an evaluation-only run, which never calls on_train_begin; the public ways "
        "are the TENSORBOARD_LOGGING_DIR variable, read by every callback of the process, or a writer made "
        "beforehand, which every rank would make",
    ),
    PrivateUse(
        "transformers.PretrainedConfig._attn_implementation",
        (
            "qa_hpc/effective.py",
            "qa_hpc/attention.py",
            "tests/unit/test_dropout.py",
            "tests/unit/test_attention.py",
        ),
        "transformers",
        "5.23.0",
        "the attention a loaded model runs with; set_attn_implementation sets it, nothing public reads it",
    ),
    PrivateUse(
        "torch._dynamo.utils.counters",
        ("qa_hpc/compile.py", "bench/gpu_speed_probe.py"),
        "torch",
        "2.13.0",
        "the count of graphs dynamo built (stats/unique_graphs), for the COMPILE line and the check that a "
        "pass compiles one graph per batch shape, of inductor's cache lookups (inductor/"
        "fxgraph_cache_hit, fxgraph_cache_miss): whether a run compiled warm, and of the graphs inductor "
        "ran without the CUDA graphs asked for (inductor/cudagraph_skips); torch has no public count of "
        "any of them",
    ),
    PrivateUse(
        "torch._inductor.runtime.cache_dir_utils.default_cache_dir",
        ("qa_hpc/compile.py",),
        "torch",
        "2.13.0",
        "the folder torch writes into TORCHINDUCTOR_CACHE_DIR when torch._dynamo is imported (transformers' "
        "model code imports it): a variable holding it was not set by the user; torch documents the "
        "variable, not its default",
    ),
    PrivateUse(
        "accelerate.state.AcceleratorState.dynamo_plugin",
        ("qa_hpc/effective.py",),
        "accelerate",
        "1.15.0",
        "an undocumented attribute: the backend, mode and dynamic setting accelerate hands torch.compile, "
        "read back into EFFECTIVE; the Accelerator exposes no public view of them",
    ),
    PrivateUse(
        "accelerate.utils.TorchDynamoPlugin.ACCELERATE_DYNAMO_USE_DYNAMIC",
        ("qa_hpc/plan.py",),
        "accelerate",
        "1.15.0",
        "the environment variable TorchDynamoPlugin reads for torch.compile's `dynamic`: transformers 5.23 "
        "builds the plugin itself and passes no `dynamic`, so the plan sets it before TrainingArguments",
    ),
    PrivateUse(
        "accelerate.utils.TorchDynamoPlugin.ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
        ("qa_hpc/plan.py",),
        "accelerate",
        "1.15.0",
        "the environment variable TorchDynamoPlugin reads for `use_regional_compilation` (--compile_scope "
        "regions): transformers 5.23 builds the plugin itself without it, so the plan sets it before "
        "TrainingArguments",
    ),
    PrivateUse(
        "transformers.trainer_pt_utils.get_length_grouped_indices",
        ("bench/padding_histogram.py",),
        "transformers",
        "5.23.0",
        "not exported by transformers nor documented: the order group_by_length trains in, so that the "
        "padding histogram counts the batches the Trainer really builds",
    ),
    PrivateUse(
        "accelerate.commands.launch._validate_launch_command",
        ("tests/unit/test_accelerate_configs.py",),
        "accelerate",
        "1.15.0",
        "a dry run of `accelerate launch`: what a config and command line resolve to, without starting "
        "processes; accelerate has no public call that stops there",
    ),
    PrivateUse(
        "accelerate.commands.launch._filter_args",
        ("tests/unit/test_accelerate_configs.py",),
        "accelerate",
        "1.15.0",
        "the same dry run: the arguments `accelerate launch` hands torchrun",
    ),
    PrivateUse(
        "argparse.ArgumentParser._actions",
        ("qa_hpc/flags.py", "bench/gpu_speed.py"),
        "python",
        "3.11",
        "an arguments file is held to the flags' names and choices, and the GPU measurement skips a "
        "variant whose flag run_qa.py lacks; argparse has no public list of a parser's arguments",
    ),
    PrivateUse(
        "subprocess.Popen._execute_child",
        ("tests/unit/conftest.py",),
        "python",
        "3.11",
        "the unit tests refuse to start processes: every way subprocess starts one goes through it",
    ),
    PrivateUse(
        "torch._inductor.list_mode_options",
        ("qa_hpc/plan.py",),
        "torch",
        "2.13.0",
        "torch.compile's documentation names it as the list of its modes (2.13 has 'lite', which the "
        "docstring's own list lacks); --torch_compile_mode is checked against it before anything runs",
    ),
    PrivateUse(
        "torch._dynamo.utils.calculate_time_spent",
        ("bench/gpu_speed_probe.py",),
        "torch",
        "2.13.0",
        "the seconds dynamo and inductor spent compiling in this process, as TORCH_LOGS prints them; the "
        "GPU measurement's compile seconds (torch.compiler has no public account of its time)",
    ),
    PrivateUse(
        "torch._dynamo.backends.cudagraphs.find_input_mutations",
        ("tests/unit/test_compile.py",),
        "torch",
        "2.13.0",
        "the rule by which CUDA graphs leave out a graph that writes to its inputs; the test that the "
        "training step's graphs can be recorded on a GPU holds them to torch's own rule, not a copy of it",
    ),
    PrivateUse(
        "torch._inductor.utils.get_first_incompatible_cudagraph_node",
        ("tests/unit/test_compile.py",),
        "torch",
        "2.13.0",
        "torch's own list of the ops CUDA graphs cannot hold (reads back to the host, output sizes that "
        "depend on the data), for the same test",
    ),
    PrivateUse(
        "torch._inductor.runtime.cache_dir_utils.cache_dir",
        ("tests/unit/test_compile.py",),
        "torch",
        "2.13.0",
        "what torch._dynamo's import calls, which writes torch's default folder into "
        "TORCHINDUCTOR_CACHE_DIR; the compile cache test does what that import does (default_cache_dir, "
        "above, is what it writes)",
    ),
)

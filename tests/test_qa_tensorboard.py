"""TensorBoard: the event files of real tiny runs, read back with TensorBoard's own reader.

Every scalar the README names is there at the logging steps; loss, learning rate and
grad norm equal the Trainer's trainer_state.json; samples and real tokens per second,
multiplied back by the interval's time, add up to the features and attention-mask
tokens run_qa counted before training (under DDP: across both ranks); eval EM/F1
equal eval_results.json; the run's totals are in the HPARAMS plugin and a text summary.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from observe_runs import TinyRun, ok_run

TRAIN_TAGS = [
    "train/loss", "train/learning_rate", "train/grad_norm", "train/step_time_seconds",
    "train/samples_per_second", "train/tokens_per_second",
]
GPU_TAGS = ["train/gpu_memory_allocated_mb", "train/gpu_memory_reserved_mb"]
EVAL_TAGS = ["eval/exact_match", "eval/f1"]


def _accumulator(run: TinyRun) -> EventAccumulator:
    dirs = [p for p in (run.out_dir / "runs").iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one TensorBoard run dir, found {dirs}"
    files = list(dirs[0].glob("events.out.tfevents.*"))
    assert len(files) == 1, f"one writer (rank 0) expected, found {files}"
    acc = EventAccumulator(str(dirs[0]), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _train_token_counts(run: TinyRun) -> tuple[int, int]:
    """features and real tokens of the train split, as run_qa logged them before training."""
    m = re.search(r"TOKENS split=train features=(\d+) real_tokens=(\d+)", run.text)
    return int(m.group(1)), int(m.group(2))


def _interval_totals(acc: EventAccumulator) -> tuple[float, float]:
    """Samples and real tokens summed over the logging intervals (rate x step time x steps)."""
    samples = tokens = 0.0
    previous = 0
    step_times = _series(acc, "train/step_time_seconds")
    for (step, step_time), (_, sps), (_, tps) in zip(
        step_times, _series(acc, "train/samples_per_second"), _series(acc, "train/tokens_per_second")
    ):
        elapsed = step_time * (step - previous)
        previous = step
        samples += sps * elapsed
        tokens += tps * elapsed
    return samples, tokens


@pytest.mark.e2e
def test_every_scalar_is_written_at_the_logging_steps(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    acc = _accumulator(run)
    tags = set(acc.Tags()["scalars"])
    expected = TRAIN_TAGS + EVAL_TAGS + (GPU_TAGS if torch.cuda.is_available() else [])
    missing = [t for t in expected if t not in tags]
    assert not missing, f"missing scalars {missing}; have {sorted(tags)}"
    if not torch.cuda.is_available():
        assert not any(t.startswith("train/gpu_memory") for t in tags)
    for tag in TRAIN_TAGS:
        assert [s for s, _ in _series(acc, tag)] == [3, 6, 9], tag
    # loss, learning rate and grad norm are the Trainer's own numbers
    state = json.loads((run.out_dir / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "loss" in e]
    for tag, key in (("train/loss", "loss"), ("train/learning_rate", "learning_rate"), ("train/grad_norm", "grad_norm")):
        assert [v for _, v in _series(acc, tag)] == pytest.approx([e[key] for e in logged], rel=1e-6), tag
    eval_results = json.loads((run.out_dir / "eval_results.json").read_text())
    assert _series(acc, "eval/exact_match")[-1][1] == pytest.approx(eval_results["eval_exact_match"])
    assert _series(acc, "eval/f1")[-1][1] == pytest.approx(eval_results["eval_f1"])


@pytest.mark.e2e
def test_throughput_adds_up_to_the_tokens_fed(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    acc = _accumulator(run)
    features, real_tokens = _train_token_counts(run)
    samples, tokens = _interval_totals(acc)
    # one epoch, every step inside a logged interval: each feature and each real token exactly once
    assert samples == pytest.approx(features, rel=1e-6)
    assert tokens == pytest.approx(real_tokens, rel=1e-6)
    for _, fraction in _series(acc, "train/real_token_fraction"):
        assert 0.5 < fraction <= 1.0
    for _, step_time in _series(acc, "train/step_time_seconds"):
        assert 0 < step_time < 60


@pytest.mark.e2e
def test_ddp_counts_every_rank_and_only_rank0_writes(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("ddp", tmp_path_factory, tiny_bert, demo_files)
    acc = _accumulator(run)  # asserts a single event file
    state = json.loads((run.out_dir / "trainer_state.json").read_text())
    steps = state["global_step"]
    assert [s for s, _ in _series(acc, "train/loss")] == [steps]
    features, real_tokens = _train_token_counts(run)
    samples, tokens = _interval_totals(acc)
    # both ranks ran `steps` full batches of 8 (accelerate fills the last batch with wrapped-around
    # features so ranks stay in step), so the all-reduced count is world x steps x batch
    assert samples == pytest.approx(2 * steps * 8, rel=1e-6)
    assert samples > features / 2  # more than one rank's share: the count is summed over ranks
    assert real_tokens <= tokens + 1e-3 and tokens <= samples * 128 + 1e-3


@pytest.mark.e2e
def test_run_totals_as_hparams_and_text(tmp_path_factory, tiny_bert, demo_files):
    run = ok_run("single", tmp_path_factory, tiny_bert, demo_files)
    acc = _accumulator(run)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.ListFields()[0][1] for k, v in start.hparams.items()}
    assert hparams["world_size"] == 1 and hparams["precision"] == "fp32"
    assert hparams["per_device_train_batch_size"] == 8 and hparams["epochs"] == 1
    kv = run.kv()
    wall = _series(acc, "hparam/wall_clock_seconds")[0][1]
    assert abs(wall - float(kv["WALL_CLOCK_SECONDS"])) <= 1.0
    assert _series(acc, "hparam/final_loss")[0][1] == pytest.approx(_series(acc, "train/loss")[-1][1])
    assert _series(acc, "hparam/eval_f1")[0][1] == pytest.approx(float(kv["eval_f1"]), abs=1e-4)
    text = acc.Tensors("run_summary/text_summary")[0].tensor_proto.string_val[0].decode()
    for key in ("wall_clock_seconds", "final_loss", "per_device_train_batch_size", "epochs", "world_size", "precision"):
        assert f"| {key} |" in text, key

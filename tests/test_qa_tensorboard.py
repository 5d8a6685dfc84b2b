"""TensorBoard: the event files of real tiny runs, read back with TensorBoard's own reader.

Every scalar the README names is there at the logging steps; loss, learning rate and
grad norm equal the Trainer's trainer_state.json; samples and real tokens per second,
multiplied back by the interval's time, add up to the features and attention-mask
tokens run_qa counted before training (under DDP: across both ranks); eval EM/F1
equal eval_results.json; the run's totals are in the HPARAMS plugin and a text summary.
"""

from __future__ import annotations


import torch


TRAIN_TAGS = [
    "train/loss", "train/learning_rate", "train/grad_norm", "train/step_time_seconds",
    "train/samples_per_second", "train/tokens_per_second",
]
GPU_TAGS = ["train/gpu_memory_allocated_mb", "train/gpu_memory_reserved_mb"]
EVAL_TAGS = ["eval/exact_match", "eval/f1"]


def test_report_to_decides_and_hf_callback_is_replaced(tmp_path):
    from transformers.integrations import TensorBoardCallback as HFTensorBoardCallback

    from fixtures.settings import plan_and_flags
    from qa_hpc.model import ModelShape
    from qa_hpc.observe.observability import Observability
    from qa_hpc.observe.tensorboard import TensorBoardCallback

    shape = ModelShape.of(torch.nn.Linear(2, 2))
    plan, flags = plan_and_flags(["--output_dir", str(tmp_path), "--logging_dir", str(tmp_path / "tb")])
    assert plan.tensorboard  # the qa-hpc default --report_to tensorboard
    obs = Observability(flags.observe, plan, flags.training, shape, 128)
    assert any(isinstance(c, TensorBoardCallback) for c in obs.callbacks)
    assert "tensorboard" not in flags.training.report_to  # HF's callback is not added as well
    assert not any(isinstance(c, HFTensorBoardCallback) for c in obs.callbacks)
    plan, flags = plan_and_flags(["--output_dir", str(tmp_path), "--report_to", "none"])
    assert not Observability(flags.observe, plan, flags.training, shape, 128).callbacks


def test_token_counter_counts_attention_mask_of_training_forwards():
    from transformers import BertConfig, BertForQuestionAnswering

    from qa_hpc.observe.tensorboard import TokenCounter

    model = BertForQuestionAnswering(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=32))
    counter = TokenCounter()
    counter.attach(model)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids = torch.randint(1, 50, mask.shape)
    model.train()
    model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask)
    model.eval()
    model(input_ids=ids, attention_mask=mask)  # evaluation forwards are not counted
    assert counter.take(torch.device("cpu")) == (6, 30, 2 * 10)
    assert counter.take(torch.device("cpu")) == (0, 0, 0)
    counter.detach()

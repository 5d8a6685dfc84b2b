"""--precision reaches evaluation too: bf16 is autocast in the eval forward (matmuls run in bf16), fp32 stays
fp32. (Through real runs: tests/e2e; the plan's decisions for every device: tests/unit/test_plan.py.)"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("precision, want", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_precision_applies_to_evaluation(tiny_bert, tmp_path, precision, want):
    import datasets
    from transformers import AutoModelForQuestionAnswering, Trainer

    from qa_hpc.flags import decide_and_build, read_flags

    plan, flags = decide_and_build(read_flags(["--output_dir", str(tmp_path / "o"), "--report_to", "none",
                                               "--precision", precision]))
    args = flags.training
    assert plan.precision == precision and args.bf16 == (precision == "bf16")
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert))
    seen = []
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    trainer = Trainer(model=model, args=args)
    trainer.predict(datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102] * 4], "attention_mask": [[1] * 12]}))
    assert seen == [f"torch.{want}"]

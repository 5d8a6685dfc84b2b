"""--precision reaches evaluation too. (Through real runs: tests/e2e/test_run_qa.py; the plan's decisions for
every device: tests/test_plan.py.)"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("precision, want", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_precision_applies_to_evaluation(tiny_bert, tmp_path, precision, want):
    """--precision bf16 is autocast in the eval forward too (matmuls run in bf16), fp32 stays fp32."""
    import datasets
    from transformers import AutoModelForQuestionAnswering, Trainer

    from qa_hpc.settings.apply import build_flags, read_flags, request_from
    from qa_hpc.settings.devices import read_device_facts
    from qa_hpc.settings.plan import decide

    values = read_flags(["--output_dir", str(tmp_path / "o"), "--report_to", "none", "--precision", precision])
    plan = decide(request_from(values), read_device_facts())
    args = build_flags(values, plan.training_fields(values["tf32"])).training
    assert plan.precision == precision and args.bf16 == (precision == "bf16")
    model = AutoModelForQuestionAnswering.from_pretrained(str(tiny_bert))
    seen = []
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    trainer = Trainer(model=model, args=args)
    trainer.predict(datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102] * 4], "attention_mask": [[1] * 12]}))
    assert seen == [f"torch.{want}"]

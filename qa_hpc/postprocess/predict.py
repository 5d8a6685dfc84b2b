"""Logits of an eval set -> answers and n-best lists, by the vectorized code or the reference loop."""

from __future__ import annotations

from typing import Any

from qa_hpc.features import real_lengths
from qa_hpc.postprocess.files import write_prediction_files
from qa_hpc.postprocess.reference import PostprocessConfig, QAPredictions, postprocess_qa_predictions_loop
from qa_hpc.postprocess.vectorized import mask_padding, postprocess_qa_predictions_vectorized


def _columns(dataset: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Whole columns as Python lists, read through Arrow (dataset["col"][i] costs ~50 us per item)."""
    if hasattr(dataset, "with_format"):
        table = dataset.with_format("arrow")
        return {name: table[name].to_pylist() for name in names}
    return {name: dataset[name] for name in names}


def predictions_from_logits(
    examples: Any, features: Any, logits: Any, cfg: PostprocessConfig, method: str = "vectorized"
) -> QAPredictions:
    """Eval examples + features (datasets or dicts of columns) + logits -> answers and n-best lists."""
    # outputs on pad tokens would compete for the n-best slots, and how many there are depends on batching
    logits = mask_padding(logits, real_lengths(features))
    if method == "loop":
        columns = {"id": examples["id"], "context": examples["context"]}
        feats = {"example_id": features["example_id"], "offset_mapping": features["offset_mapping"]}
        return postprocess_qa_predictions_loop(columns, feats, logits, cfg)
    columns = _columns(examples, ("id", "context"))
    arrow = features.with_format("arrow") if hasattr(features, "with_format") else None
    feats = {
        "example_id": arrow["example_id"].to_pylist() if arrow is not None else features["example_id"],
        "offset_mapping": arrow["offset_mapping"] if arrow is not None else features["offset_mapping"],
    }
    return postprocess_qa_predictions_vectorized(columns, feats, logits, cfg)


def make_postprocess(data_args: Any, output_dir: str, method: str = "vectorized") -> Any:
    """Logits -> answers, with the prediction files written (the trainer calls it on the main process).

    'vectorized' reads the offsets straight from the features' Arrow column; 'loop' is the
    per-feature reference loop. Both give the same answers.
    """
    cfg = PostprocessConfig(
        version_2_with_negative=data_args.version_2_with_negative,
        n_best_size=data_args.n_best_size,
        max_answer_length=data_args.max_answer_length,
        null_score_diff_threshold=data_args.null_score_diff_threshold,
    )

    def post_process(examples: Any, features: Any, logits: Any, stage: str) -> QAPredictions:
        preds = predictions_from_logits(examples, features, logits, cfg, method)
        write_prediction_files(preds, output_dir, stage)
        return preds

    return post_process

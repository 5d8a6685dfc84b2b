"""The prediction files of an evaluation: answers, n-best lists and (v2) null odds, written atomically."""

from __future__ import annotations

import logging
import os

from qa_hpc.postprocess.nbest_table import nbest_json
from qa_hpc.postprocess.reference import QAPredictions
from qa_hpc.reliability.atomic_io import json_text, write_text_atomic

logger = logging.getLogger(__name__)


def write_prediction_files(preds: QAPredictions, output_dir: str, prefix: str) -> list[str]:
    """Write {prefix}_predictions.json, _nbest_predictions.json and (v2) _null_odds.json atomically."""
    os.makedirs(output_dir, exist_ok=True)
    written = []
    # serialized before anything is written, so a bad value leaves no file behind
    texts: list[tuple[str, str]] = [
        (f"{prefix}_predictions.json", json_text(preds.answers)),
        (f"{prefix}_nbest_predictions.json", nbest_json(preds.nbest, indent=2) + "\n"),  # fast for NBestTable
    ]
    if preds.null_odds is not None:
        texts.append((f"{prefix}_null_odds.json", json_text(preds.null_odds)))
    for name, text in texts:
        path = os.path.join(output_dir, name)
        write_text_atomic(path, text)
        written.append(path)
    logger.info("wrote %s", ", ".join(written))
    return written

"""The prediction files of an evaluation: answers, n-best lists and (v2) null odds, written atomically."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import orjson

from qa_hpc.atomic_io import json_text, write_text_atomic
from qa_hpc.postprocess.nbest_table import NBestTable
from qa_hpc.postprocess.reference import QAPredictions

logger = logging.getLogger(__name__)


def nbest_json(nbest: Mapping[str, list[dict]]) -> str:
    """The n-best file's text: indented JSON, UTF-8 as is, one trailing newline.

    orjson, not json.dumps: with an indent the standard library encodes in pure Python, seconds for the
    55 MB of a SQuAD dev set. orjson writes NaN and infinities as null (JSON has no spelling for them).
    """
    plain = nbest.as_dict() if isinstance(nbest, NBestTable) else nbest
    return orjson.dumps(plain, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE).decode("utf-8")


def write_prediction_files(preds: QAPredictions, output_dir: str, prefix: str) -> list[str]:
    """Write {prefix}_predictions.json, _nbest_predictions.json and (v2) _null_odds.json atomically."""
    os.makedirs(output_dir, exist_ok=True)
    written = []
    # serialized before anything is written, so a bad value leaves no file behind
    texts: list[tuple[str, str]] = [
        (f"{prefix}_predictions.json", json_text(preds.answers)),
        (f"{prefix}_nbest_predictions.json", nbest_json(preds.nbest)),
    ]
    if preds.null_odds is not None:
        texts.append((f"{prefix}_null_odds.json", json_text(preds.null_odds)))
    for name, text in texts:
        path = os.path.join(output_dir, name)
        write_text_atomic(path, text)
        written.append(path)
    logger.info("wrote %s", ", ".join(written))
    return written

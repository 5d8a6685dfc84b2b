"""Answers + gold -> the official SQuAD metrics, through `evaluate`, as the trainer scores an evaluation.

By default the metric is the local `evaluate` module of this package for the SQuAD
version (evaluate_squad_v1 / evaluate_squad_v2: our scorer, loaded by path, no network);
``--squad_metric`` names another: the hub's ``squad`` / ``squad_v2`` or a path to a
module. The metric is loaded when the run is set up, so a name that cannot be loaded
(a hub metric with no internet and no cached copy) stops the run before training.

What loading writes: evaluate copies the module into $HF_MODULES_CACHE
(default $HF_HOME/modules/evaluate_modules/metrics/<name>/<hash>/) and makes an empty
$HF_HOME/metrics/<name>/default; the inputs stay in memory (keep_in_memory), so scoring
writes no cache files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qa_hpc.metric.evaluate_io import PREDICTION_FIELDS_V1, PREDICTION_FIELDS_V2, REFERENCE_FIELDS, metric_inputs
from qa_hpc.postprocess_loop import QAPredictions
from qa_hpc.reliability.errors import UsageError

LOCAL_MODULES = {
    False: Path(__file__).with_name("evaluate_squad_v1"),
    True: Path(__file__).with_name("evaluate_squad_v2"),
}
HUB_NAMES = {False: "squad", True: "squad_v2"}

ScoreFunction = Callable[[QAPredictions, Any], dict[str, Any]]


def make_score(version_2_with_negative: bool, null_score_diff_threshold: float,
               squad_metric: str | None = None) -> ScoreFunction:
    """Load the metric now; return (answers, examples) -> metrics without prefix.

    v1: exact_match, f1; v2: exact, f1, total, HasAns_*, NoAns_*, best_exact(_thresh), best_f1(_thresh).
    """
    metric = load_squad_metric(squad_metric, version_2_with_negative)
    # v2: null odds are score differences; thresholding them at the same value as the
    # postprocessing keeps exact/f1 unchanged and makes best_f1_thresh a usable threshold
    options = {"no_answer_threshold": null_score_diff_threshold} if version_2_with_negative else {}

    def score(preds: QAPredictions, examples: Any) -> dict[str, Any]:
        predictions, references = metric_inputs(preds.answers, preds.null_odds if version_2_with_negative else None,
                                                 examples["id"], examples["answers"])
        return metric.compute(predictions=predictions, references=references, **options)

    return score


def load_squad_metric(name: str | None, version_2_with_negative: bool) -> Any:
    """The `evaluate` metric asked for (default: ours for the version), checked to take run_qa's inputs."""
    import evaluate  # slow to import (it pulls in transformers.pipelines): only once a run is set up
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        # evaluate has its own offline switch; without it an offline job asking for a hub metric
        # would try the network first (and wait for it) before falling back to evaluate's cache
        evaluate.config.HF_EVALUATE_OFFLINE = True
    path = name or str(LOCAL_MODULES[version_2_with_negative])
    try:
        metric = evaluate.load(path, keep_in_memory=True)  # scores on the main process only: no cache files
    except Exception as err:  # evaluate raises FileNotFoundError, ConnectionError, ImportError, TypeError, ...
        if name is None:  # our own module: not the user's doing, keep the traceback
            raise
        raise UsageError(_cannot_load(name, version_2_with_negative, err)) from err
    _check_inputs(metric, name or path, version_2_with_negative)
    return metric


def _cannot_load(name: str, v2: bool, err: BaseException) -> str:
    """What was asked, why it failed, and how to get it."""
    from huggingface_hub import constants

    cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if os.path.exists(name):
        how = ("the path exists but is no evaluate module: give a .py file that defines an evaluate.Metric, "
               "or a folder holding one named after the folder")
    else:
        local = LOCAL_MODULES[v2].relative_to(Path(__file__).parents[2])
        offline = "offline mode is on (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "no internet?"
        how = (f"it is no local path, and a hub metric is fetched once from the Hugging Face Hub ({offline}): "
               "load it where there is internet with HF_HOME set as in the job (it is then cached in "
               f"{constants.HF_HOME}/modules for offline runs), or leave --squad_metric out to use {local}, "
               "which gives the official numbers offline")
    return f"--squad_metric {name!r} could not be loaded ({type(err).__name__}: {cause}); {how}"


def _check_inputs(metric: Any, name: str, v2: bool) -> None:
    """The metric must take the rows run_qa sends (a v1 metric cannot score a v2 run, and back)."""
    wanted = (set(PREDICTION_FIELDS_V2 if v2 else PREDICTION_FIELDS_V1), set(REFERENCE_FIELDS))
    schemas = metric.features if isinstance(metric.features, list) else [metric.features]
    found = [(set(_keys(f.get("predictions"))), set(_keys(f.get("references")))) for f in schemas]
    if wanted not in found:
        version = "2.0" if v2 else "1.1"
        takes = " or ".join(f"predictions {sorted(p)} and references {sorted(r)}" for p, r in found)
        raise UsageError(
            f"--squad_metric {name!r} takes {takes}, but a SQuAD v{version} run sends predictions "
            f"{sorted(wanted[0])} and references {sorted(wanted[1])}: use a SQuAD v{version} metric "
            f"(on the hub: {HUB_NAMES[v2]!r}), or leave --squad_metric out")


def _keys(feature: Any) -> list[str]:
    return list(feature.keys()) if isinstance(feature, dict) else []

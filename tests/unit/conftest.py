"""Unit tests start no process and train nothing: one that does fails, naming what it started. And
`process_settings`, for the tests that set a run up in process.

Real runs belong in tests/e2e (marked e2e there); this guard keeps the split true. Processes started off the
main thread are not a unit test's: they are the shared runs (tests/fixtures/shared_runs.py), which start
with the session and run beside the unit tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

import pytest
import torch

from qa_hpc import attention


def _refuse(what: str) -> NoReturn:
    pytest.fail(f"a unit test {what}: move it to tests/e2e", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _guarded()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _guarded()


def _guarded() -> Iterator[None]:
    start_process = subprocess.Popen._execute_child

    def refuse_on_the_tests_thread(popen: subprocess.Popen, args, *rest, **kwargs) -> None:
        if threading.current_thread() is not threading.main_thread():
            return start_process(popen, args, *rest, **kwargs)  # a shared run's thread
        _refuse(f"starts a process ({args!r:.200})")

    with pytest.MonkeyPatch.context() as patch:
        # private, the one way in for every process subprocess starts (listed in qa_hpc/private_api.py)
        patch.setattr(subprocess.Popen, "_execute_child", refuse_on_the_tests_thread)
        patch.setattr(os, "fork", lambda: _refuse("forks"))
        patch.setattr(os, "system", lambda cmd: _refuse(f"starts a shell ({cmd!r:.200})"))
        if (trainer := sys.modules.get("transformers.trainer")) is not None:
            patch.setattr(trainer.Trainer, "train", lambda *a, **k: _refuse("trains a model (Trainer.train)"))
        yield


@pytest.fixture
def process_settings(monkeypatch, tmp_path):
    """What a run sets for the whole process, put back after the test: the SDPA switches, the recompile
    limit, torch's threads, and the variables that carry `dynamic` and regional compilation to accelerate
    and the caches' folder to torch (the test's own)."""
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_DYNAMIC", raising=False)
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))
    limit = torch.compiler.config.recompile_limit
    threads = torch.get_num_threads()
    yield
    attention.apply(attention.ALL)
    torch.compiler.config.recompile_limit = limit
    torch.set_num_threads(threads)

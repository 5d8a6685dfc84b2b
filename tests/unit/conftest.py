"""Unit tests start no process and train nothing: one that does fails, naming what it started.

Real runs belong in tests/e2e (marked e2e there); this guard keeps the split true.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest


def _refuse(what: str) -> NoReturn:
    pytest.fail(f"a unit test {what}: move it to tests/e2e", pytrace=False)


@contextmanager
def no_process_no_training() -> Iterator[None]:
    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, attr: str, replacement: object) -> None:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, replacement)

    patch(subprocess.Popen, "_execute_child", lambda popen, args, *a, **k: _refuse(f"starts a process ({args!r:.200})"))
    patch(os, "fork", lambda: _refuse("forks"))
    patch(os, "system", lambda cmd: _refuse(f"starts a shell ({cmd!r:.200})"))
    trainer = sys.modules.get("transformers.trainer")
    if trainer is not None:
        patch(trainer.Trainer, "train", lambda *a, **k: _refuse("trains a model (Trainer.train)"))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with no_process_no_training():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with no_process_no_training():
        yield

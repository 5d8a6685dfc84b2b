"""The stop request and the checkpoint a resume picks. (Real signals and resumes: tests/e2e/test_reliability.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from qa_hpc.reliability.preemption import StopRequest, last_complete_checkpoint

def test_stop_request_handler_only_sets_a_flag() -> None:
    request = StopRequest()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        request.install()
        assert not request.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered before the next bytecode
        assert request.requested and request.name == "SIGUSR1"
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_resume_skips_an_incompletely_written_checkpoint(tmp_path: Path) -> None:
    """A job killed while saving leaves a checkpoint without a readable trainer_state.json."""
    for step, state in ((4, '{"global_step": 4}'), (6, '{"global_step": 6}'), (8, '{"global_st')):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"x")
        (ckpt / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-9").mkdir()  # killed before anything was written
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-6")

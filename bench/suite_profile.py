"""Where the test suite's time goes: each test's wall time and how many of the machine's cores were busy
meanwhile (all processes: a test waiting on a run it started ahead shows as busy cores), summed per file. A
file with idle cores is where running things side by side can still pay.

    CI=true .venv/bin/python -m pytest -p bench.suite_profile     # the table after pytest's summary

Busy cores come from /proc/stat (Linux), sampled every half second in a thread of the pytest process.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SAMPLE_S = 0.5


@dataclass(frozen=True)
class Span:
    test: str  # pytest's node id
    start: float
    end: float


def cpu_times() -> tuple[int, int]:
    """(all jiffies, idle jiffies) of the machine so far, from /proc/stat's first line."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def busy_cores(before: tuple[int, int], after: tuple[int, int], cores: int) -> float:
    total, idle = after[0] - before[0], after[1] - before[1]
    return cores * (1 - idle / total) if total else 0.0


def per_file(spans: list[Span], samples: list[tuple[float, float]]) -> list[tuple[str, float, float]]:
    """(file, wall seconds, mean busy cores), the longest first; a span's cores: the samples taken in it."""
    wall: dict[str, float] = defaultdict(float)
    core_seconds: dict[str, float] = defaultdict(float)
    for span in spans:
        inside = [cores for at, cores in samples if span.start <= at <= span.end]
        seconds = span.end - span.start
        name = span.test.split("::")[0]
        wall[name] += seconds
        core_seconds[name] += seconds * (sum(inside) / len(inside) if inside else 0.0)
    rows = [(name, wall[name], core_seconds[name] / wall[name] if wall[name] else 0.0) for name in wall]
    return sorted(rows, key=lambda row: -row[1])


class SuiteProfile:
    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1
        self.spans: list[Span] = []
        self.samples: list[tuple[float, float]] = []  # (time at the sample's middle, busy cores)
        self.stopped = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        before = cpu_times()
        while not self.stopped.wait(SAMPLE_S):
            after = cpu_times()
            self.samples.append((time.time() - SAMPLE_S / 2, busy_cores(before, after, self.cores)))
            before = after

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        start = time.time()
        yield
        self.spans.append(Span(item.nodeid, start, time.time()))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        self.stopped.set()
        terminalreporter.section(f"suite profile: wall seconds, mean busy cores of {self.cores}")
        for name, seconds, cores in per_file(self.spans, self.samples):
            terminalreporter.write_line(f"SUITE_FILE file={name} wall_s={seconds:.1f} busy_cores={cores:.2f}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteProfile(), "suite_profile")

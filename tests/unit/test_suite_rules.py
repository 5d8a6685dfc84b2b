"""The rules of the suite itself: a missing resource skips locally but fails under CI=true, a unit test
cannot start a process or train, CI runs the README's test command, and the suite's header names the
machine. (.ci/run itself: tests/e2e/test_ci_run.py.)"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, needed_module, pytest_report_header, shared_squad_file, skip_or_fail
from fixtures.machines import AVX2_AMD
from transformers import Trainer  # imported before the tests run: the guard patches Trainer.train


@pytest.mark.parametrize(
    "ci, fails", [("true", True), ("TRUE", True), ("1", True), (None, False), ("false", False), ("", False)]
)
def test_a_missing_resource_fails_under_ci_and_skips_elsewhere_saying_why(
    monkeypatch, ci: str | None, fails: bool
):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    prefix = "CI=true, and a resource this test needs is missing: " if fails else ""
    for call, arg, says in (
        (skip_or_fail, "gone", "gone"),
        (shared_squad_file, "no-such-file.json", "real SQuAD data not found at "),
        (needed_module, "no_such_module_qa", "module no_such_module_qa not importable"),
    ):
        with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as outcome:
            call(arg)
        assert isinstance(outcome.value, pytest.fail.Exception if fails else pytest.skip.Exception), (
            outcome.value
        )
        assert str(outcome.value).startswith(prefix + says), outcome.value
    assert needed_module("json").dumps([1]) == "[1]"


def test_a_unit_test_that_starts_a_process_or_trains_fails() -> None:
    """tests/unit/conftest.py turns a process start or a training run into a failure naming it; a process
    started off the test's thread is a shared run's (tests/fixtures/shared_runs.py) and starts."""
    with pytest.raises(pytest.fail.Exception, match=r"a unit test starts a process \(\['true'\]\)"):
        subprocess.run(["true"])
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(subprocess.run, ["true"]).result().returncode == 0
    with pytest.raises(pytest.fail.Exception, match=r"a unit test trains a model"):
        Trainer.train(None)


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    command = re.search(r"```bash\n(\S.*?)\s+#", readme[readme.index("\n## Tests") :]).group(1).strip()
    lines = [
        ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert lines[-1] == command == ".venv/bin/python -m pytest"


def test_the_suite_header_names_the_machine(monkeypatch, pytestconfig) -> None:
    """The MACHINE line bench results keep: this machine's, then a made-up CPU's (saying so), or what is
    wrong with it."""
    monkeypatch.delenv("QA_TEST_MACHINE", raising=False)
    (real,) = pytest_report_header(pytestconfig)
    assert real.startswith("MACHINE cpu_model=") and " cpu_flags=" in real and " torch=" in real, real
    assert "QA_TEST_MACHINE" not in real
    monkeypatch.setenv("QA_TEST_MACHINE", AVX2_AMD.test_machine)
    header = pytest_report_header(pytestconfig)
    assert header[0] == real and len(header) == 2, header
    assert "cpu_flags=avx2,fma3 " in header[1] and header[1].endswith(" cpu_source=QA_TEST_MACHINE"), header
    monkeypatch.setenv("QA_TEST_MACHINE", "cpu_flags=avx2")
    assert pytest_report_header(pytestconfig) == [
        real,
        "MACHINE made up: QA_TEST_MACHINE='cpu_flags=avx2': cpu_vendor, cpu_model: missing: a made-up CPU "
        "names its vendor, flags and model",
    ]

"""The rules of the suite itself: a missing resource skips locally but fails under CI=true, a unit test
cannot start a process or train, and CI runs the README's test command. (.ci/run itself: tests/e2e/test_ci_run.py.)"""

from __future__ import annotations

import re
import subprocess

import pytest
from transformers import Trainer  # imported before the tests run: the guard patches Trainer.train

from conftest import REPO, needed_module, shared_squad_file, skip_or_fail


def _outcome(call, *args) -> BaseException:
    """What a missing resource did to the test: the Skipped or Failed it raised (caught here, either way)."""
    try:
        call(*args)
    except (pytest.skip.Exception, pytest.fail.Exception) as outcome:
        return outcome
    raise AssertionError(f"{call.__name__}{args} neither skipped nor failed")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_a_missing_resource_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    for call, args, says in ((skip_or_fail, ("gone",), "gone"),
                             (shared_squad_file, ("no-such-file.json",), "real SQuAD data not found at "),
                             (needed_module, ("no_such_module_qa",), "module no_such_module_qa not importable")):
        outcome = _outcome(call, *args)
        assert isinstance(outcome, pytest.fail.Exception), f"{call.__name__} skipped under CI={ci}: {outcome}"
        assert str(outcome).startswith("CI=true, and a resource this test needs is missing: " + says), outcome


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_a_missing_resource_skips_elsewhere_saying_why(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    for call, args, says in ((shared_squad_file, ("no-such-file.json",), "real SQuAD data not found at "),
                             (needed_module, ("no_such_module_qa",), "module no_such_module_qa not importable")):
        outcome = _outcome(call, *args)
        assert isinstance(outcome, pytest.skip.Exception), f"{call.__name__} failed with CI={ci!r}: {outcome}"
        assert str(outcome).startswith(says), outcome
    assert needed_module("json").dumps([1]) == "[1]"


def test_a_unit_test_that_starts_a_process_or_trains_fails() -> None:
    """tests/unit/conftest.py turns a process start or a training run into a failure naming it."""
    with pytest.raises(pytest.fail.Exception, match=r"a unit test starts a process \(\['true'\]\)"):
        subprocess.run(["true"])
    with pytest.raises(pytest.fail.Exception, match=r"a unit test trains a model"):
        Trainer.train(None)


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    tests_section = readme[readme.index("\n## Tests"):]
    command = re.search(r"```bash\n(\S.*?)\s+#", tests_section).group(1).strip()
    lines = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[-1] == command == ".venv/bin/python -m pytest"

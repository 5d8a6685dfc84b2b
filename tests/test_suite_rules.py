"""The rules of the suite itself: a missing resource skips locally but fails under CI=true, .ci/run fails
when the local Slurm does not start under CI=true, the e2e split holds, and CI runs the README's command.

.ci/run is run for real (bash) in a copy whose heavy steps are stand-ins that record their calls: `python3`
(venv creation), the venv's python (pip, the venv check and pytest), `id`, `apt-get` and the Slurm
start/stop scripts.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from transformers import Trainer  # imported before the tests run: the guard patches Trainer.train

import conftest
from conftest import REPO, needed_module, shared_squad_file, skip_or_fail
from fixtures.procs import offline_env


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


def test_a_unit_test_that_starts_a_process_fails() -> None:
    """This test is not e2e: the guard turns a process start into a failure naming what was started."""
    with pytest.raises(pytest.fail.Exception, match=r"not marked e2e but starts a process \(\['true'\]\)"):
        subprocess.run(["true"])
    with pytest.raises(pytest.fail.Exception, match=r"not marked e2e but trains a model"):
        Trainer.train(None)


@pytest.mark.e2e
def test_an_e2e_test_may_start_processes() -> None:
    assert subprocess.run(["true"]).returncode == 0


def test_the_e2e_table_names_tests_that_exist() -> None:
    """A renamed or removed test must not leave tests/conftest.py's e2e table pointing at nothing."""
    tables = dict(conftest.E2E_MODULES)
    for module, names in conftest.E2E_TESTS.items():
        tables[module] = tables.get(module, ()) + names
    for module, names in tables.items():
        path = REPO / "tests" / module
        assert path.is_file(), module
        defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        missing = [n for n in names if n not in defined]
        assert not missing, f"{module}: {missing}"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    tests_section = readme[readme.index("\n## Tests"):]
    command = re.search(r"```bash\n(\S.*?)\s+#", tests_section).group(1).strip()
    lines = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[-1] == command == ".venv/bin/python -m pytest"


# --- .ci/run in a copy with stand-ins --------------------------------------------------------------------


def _ci_copy(tmp_path: Path, slurm_rc: int, uid: int) -> tuple[Path, Path, dict[str, str]]:
    """(checkout copy, the calls log, environment): .ci/run as is, everything it starts a stand-in."""
    root, bin_dir, calls = tmp_path / "checkout", tmp_path / "bin", tmp_path / "calls.log"
    (root / ".ci").mkdir(parents=True)
    (root / "ci" / "slurm").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(REPO / ".ci" / "run", root / ".ci" / "run")
    shutil.copy(REPO / "requirements.txt", root / "requirements.txt")
    (root / "ci" / "slurm" / "start-local-slurm.sh").write_text(f'echo "slurm start" >> {calls}\nexit {slurm_rc}\n')
    (root / "ci" / "slurm" / "stop-local-slurm.sh").write_text(f'echo "slurm stop $*" >> {calls}\n')
    venv_python = tmp_path / "venv_python"
    venv_python.write_text(f'#!/bin/bash\n[ "$1" = - ] && {{ cat >/dev/null; echo "venv check" >> {calls}; exit 0; }}\n'
                           f'echo "venv python $*" >> {calls}\n')
    stubs = {
        "python3": f'[ "$1 $2" = "-m venv" ] || exit 9\nmkdir -p "$3/bin" && cp {venv_python} "$3/bin/python"\n'
                   f'chmod +x "$3/bin/python"\necho "python3 $*" >> {calls}\n',
        "id": f'[ "$1" = -u ] && {{ echo {uid}; exit 0; }}\nexec /usr/bin/id "$@"\n',
        "apt-get": f'echo "apt-get $*" >> {calls}\n',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = offline_env(PATH=f"{bin_dir}:/usr/bin:/bin", CI=None)
    return root, calls, env


def _ci_run(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / ".ci" / "run")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.e2e
def test_ci_run_fails_when_slurm_does_not_start_under_ci(tmp_path: Path) -> None:
    root, calls, env = _ci_copy(tmp_path, slurm_rc=1, uid=0)
    proc = _ci_run(root, {**env, "CI": "true"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR: CI=true and the local SLURM did not start" in proc.stderr
    done = calls.read_text().splitlines()
    assert done[:4] == ["python3 -m venv .venv",
                        "venv python -m pip install -q --disable-pip-version-check -r requirements.txt",
                        "venv python -m pip install -q --disable-pip-version-check --no-deps -e .",
                        "venv check"], done
    assert "slurm start" in done and "slurm stop --quiet" in done  # tried, and cleaned up on the way out
    assert not any("pytest" in line for line in done)  # the suite did not run, so it could not pass


@pytest.mark.e2e
def test_ci_run_carries_on_without_slurm_outside_ci_and_with_it_under_ci(tmp_path: Path) -> None:
    root, calls, env = _ci_copy(tmp_path / "local", slurm_rc=1, uid=0)
    proc = _ci_run(root, env)  # no CI variable: the slurm tests will skip, saying why
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "local SLURM did not start: slurm tests will skip" in proc.stdout
    assert calls.read_text().splitlines()[-2:] == ["venv python -m pytest", "slurm stop --quiet"]

    root, calls, env = _ci_copy(tmp_path / "ci", slurm_rc=0, uid=0)
    proc = _ci_run(root, {**env, "CI": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls.read_text().splitlines()[-3:] == ["slurm start", "venv python -m pytest", "slurm stop --quiet"]


@pytest.mark.e2e
def test_ci_run_needs_root_under_ci(tmp_path: Path) -> None:
    root, calls, env = _ci_copy(tmp_path, slurm_rc=0, uid=1000)
    proc = _ci_run(root, {**env, "CI": "true"})
    assert proc.returncode == 1 and "ERROR: CI=true needs root" in proc.stderr, proc.stdout + proc.stderr
    assert "slurm start" not in calls.read_text() and "pytest" not in calls.read_text()
    proc = _ci_run(root, env)  # without CI: as before, the suite runs and the slurm tests skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls.read_text().splitlines()[-1] == "venv python -m pytest"

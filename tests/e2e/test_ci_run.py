""".ci/run, run for real (bash) in a copy whose heavy steps are stand-ins that record their calls: `python3`
(venv creation), the venv's python (pip, the venv check and pytest), `id`, `apt-get` and the Slurm start/stop
scripts. Under CI=true it fails when the local Slurm does not start or it is not root; elsewhere it carries on.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import REPO
from fixtures.procs import offline_env


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


def test_ci_run_needs_root_under_ci(tmp_path: Path) -> None:
    root, calls, env = _ci_copy(tmp_path, slurm_rc=0, uid=1000)
    proc = _ci_run(root, {**env, "CI": "true"})
    assert proc.returncode == 1 and "ERROR: CI=true needs root" in proc.stderr, proc.stdout + proc.stderr
    assert "slurm start" not in calls.read_text() and "pytest" not in calls.read_text()
    proc = _ci_run(root, env)  # without CI: as before, the suite runs and the slurm tests skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls.read_text().splitlines()[-1] == "venv python -m pytest"

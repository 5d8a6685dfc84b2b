""".ci/run, run for real (bash) in a copy whose heavy steps are stand-ins that record their calls: `python3`
(venv creation), the venv's python (pip, the venv check and pytest) and ruff, `id`, `apt-get` and the Slurm
start/stop scripts. Under CI=true it fails when the local Slurm does not start or it is not root; elsewhere
it carries on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.procs import offline_env, run

SETUP = [
    "python3 -m venv .venv",
    "venv python -m pip install -q --disable-pip-version-check -r requirements.txt",
    "venv python -m pip install -q --disable-pip-version-check --no-deps -r requirements-no-deps.txt",
    "venv python -m pip install -q --disable-pip-version-check --no-deps -e .",
    "venv check",
    "ruff check .",
    "ruff format --check .",
]
APT = "apt-get install -y -q libjemalloc2 libtcmalloc-minimal4"
START = "slurm start"
PYTEST = "venv python -m pytest"
STOP = "slurm stop --quiet"


@pytest.mark.parametrize(
    "ci, slurm_rc, uid, code, says, then",
    [
        # under CI=true a Slurm that does not start fails the run (the suite does not run, so it cannot pass)
        ("true", 1, 0, 1, "ERROR: CI=true and the local SLURM did not start", [APT, START, STOP]),
        (None, 1, 0, 0, "local SLURM did not start: slurm tests will skip", [APT, START, PYTEST, STOP]),
        ("true", 0, 0, 0, "", [APT, START, PYTEST, STOP]),
        ("true", 0, 1000, 1, "ERROR: CI=true needs root", []),
        (None, 0, 1000, 0, "", [PYTEST]),  # without CI, not root: the suite runs and the slurm tests skip
    ],
    ids=["ci-no-slurm", "local-no-slurm", "ci-slurm", "ci-not-root", "local-not-root"],
)
def test_ci_run_needs_root_and_slurm_under_ci_only(
    ci, slurm_rc, uid, code, says, then, tmp_path: Path
) -> None:
    root = tmp_path / "checkout"
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "calls.log"
    (root / ".ci").mkdir(parents=True)
    (root / "ci" / "slurm").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(REPO / ".ci" / "run", root / ".ci" / "run")
    for requirements in ("requirements.txt", "requirements-no-deps.txt"):
        shutil.copy(REPO / requirements, root / requirements)
    (root / "ci" / "slurm" / "start-local-slurm.sh").write_text(
        f'echo "slurm start" >> {calls}\nexit {slurm_rc}\n'
    )
    (root / "ci" / "slurm" / "stop-local-slurm.sh").write_text(f'echo "slurm stop $*" >> {calls}\n')
    venv_python = tmp_path / "venv_python"
    venv_python.write_text(
        f'#!/bin/bash\n[ "$1" = - ] && {{ cat >/dev/null; echo "venv check" >> {calls}; exit 0; }}\n'
        f'echo "venv python $*" >> {calls}\n'
    )
    ruff = tmp_path / "ruff"
    ruff.write_text(f'#!/bin/bash\necho "ruff $*" >> {calls}\n')
    stubs = {
        "python3": f'[ "$1 $2" = "-m venv" ] || exit 9\nmkdir -p "$3/bin"\n'
        f'cp {venv_python} "$3/bin/python" && cp {ruff} "$3/bin/ruff"\n'
        f'chmod +x "$3/bin/python" "$3/bin/ruff"\necho "python3 $*" >> {calls}\n',
        "id": f'[ "$1" = -u ] && {{ echo {uid}; exit 0; }}\nexec /usr/bin/id "$@"\n',
        "apt-get": f'echo "apt-get $*" >> {calls}\n',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = offline_env(PATH=f"{bin_dir}:/usr/bin:/bin", CI=ci)
    proc = run(["bash", root / ".ci" / "run"], cwd=root, env=env, timeout=60)
    assert proc.returncode == code and says in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert calls.read_text().splitlines() == SETUP + then

"""What starts with the first end-to-end test: the Slurm jobs that mostly wait (tests/fixtures/slurm_jobs.py),
after the unit tests, which run beside the shared runs and keep both cores busy (the shared runs may still
be running)."""

from __future__ import annotations

import pytest
from fixtures.shared_runs import reads


@pytest.fixture(scope="session", autouse=True)
def slurm_jobs_start_with_the_e2e_tests(request: pytest.FixtureRequest) -> None:
    """Where a test of the session checks a one-node job, they are submitted now (no cluster: none, and
    that test skips saying why, or fails under CI=true), and the tests before test_slurm.py run meanwhile."""
    if reads(request.session, "one_node_jobs"):
        request.getfixturevalue("one_node_jobs")

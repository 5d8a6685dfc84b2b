"""The job scripts under a real Slurm (tests/fixtures/slurm_jobs.py: the cluster, sbatch, the preemption):
tiny offline-demo jobs preempted for real by SIGUSR1, requeued and resumed from their checkpoint; failing
jobs and dying DDP nodes end the job with a non-zero status. The one-node jobs start with the first
end-to-end test and run side by side.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from fixtures.procs import rank_pids
from fixtures.runs import read
from fixtures.slurm_jobs import FAILING, MAX_STEPS, job_env, run_preempted_job, sh, submit, wait_for

pytestmark = pytest.mark.slurm


def assert_resumed_and_scored(rc: int, log: str, out: Path, first_exit: str) -> None:
    """The first run stopped at a checkpoint (its status matching `first_exit`);
    the requeued one trained the rest."""
    assert rc == 0, log[-4000:]
    assert "OFFLINE DEMO - NOT THE BASELINE" in log and "RUN_MODE=offline_demo" in log
    assert "PREEMPT_SIGNAL=SIGUSR1" in log
    first, _, second = log.partition("restart_count=1")
    assert second, log[-3000:]
    assert re.search(rf"EXIT_CODE={first_exit} \(after SIGUSR1\)", first), first[-3000:]
    stopped = re.findall(r"PREEMPTED signal=\w+ global_step=(\d+) ", first)
    assert len(stopped) == 1, first[-3000:]  # rank 0 checkpointed and said so, once
    resumed = re.search(r"RESUME_FROM=(\S+)", second)
    assert resumed, second[-3000:]
    stopped_at = int(resumed.group(1).rsplit("-", 1)[1])
    assert stopped_at == int(stopped[0]) and 0 < stopped_at < MAX_STEPS
    # rank 0 logs each step it trains (--logging_steps 1): no step was trained twice, none skipped
    assert first.count("{'loss'") == stopped_at and second.count("{'loss'") == MAX_STEPS - stopped_at, log[
        -3000:
    ]
    assert len(re.findall(r"^WALL_CLOCK_SECONDS=\d+", log, re.M)) == 1  # the first run stopped before the end
    assert re.search(r"^eval_f1=\d+\.\d+$", log, re.M) and re.search(
        r"^eval_exact_match=\d+\.\d+$", log, re.M
    )
    assert read(out / "trainer_state.json")["global_step"] == MAX_STEPS
    assert read(out / "eval_results.json")["eval_examples"] == 9
    assert (out / "OFFLINE_DEMO.txt").is_file()


def test_ft3_job_is_preempted_requeues_resumes_and_scores(slurm, one_node_jobs: dict[str, Future]):
    rc, log, out = one_node_jobs["ft3"].result()
    assert_resumed_and_scored(rc, log, out, first_exit="75")  # run_qa.py's own status
    assert "DISTRIBUTED world_size=1" in log
    # the job's arguments hold --overwrite_output_dir: the requeue resumed the checkpoint its first run saved
    second = log.partition("restart_count=1")[2]
    assert "OVERWRITE skipped: job " in second and "OVERWRITE removed" not in log, second[-3000:]
    # and is not told to add the flag it holds to start over
    assert re.search(r"RESUME_FROM=\S+ \(checkpoint found in --output_dir\)$", second, re.M), second[-3000:]


def test_ddp_job_with_dataloader_workers_is_preempted_requeues_resumes_and_scores(
    whole_cluster, tiny_bert: Path, tmp_path: Path
):
    """scancel --signal=USR1 reaches every process of the step, the ranks' dataloader workers too: they must
    neither die nor print (a worker killed by the signal would fail its rank with a traceback). One rank per
    node, with the node's 2 CPUs (a 1-CPU step seeing 1 CPU: test_steps_see_only_the_cpus_they_were_given)."""
    rc, log = run_preempted_job(
        "job_ddp.sh",
        tmp_path,
        job_env(tiny_bert, tmp_path),
        "--gres=none",
        # each emulated node whole: both nodes' CPU 0 is this machine's CPU 0, where Slurm binds a 1-CPU step,
        # so with 1 CPU per node both nodes' ranks would share one core (and the job take ~1.8x as long)
        "--cpus-per-task=2",
        name="ddptest",
        args=("--dataloader_num_workers", "2"),
    )
    # srun reports torchrun's status: 1 when a worker exits 75, or 143 when --kill-on-bad-exit ended the other
    # node's torchrun while it was still tearing its workers down; the job reports the ranks' own 75
    assert_resumed_and_scored(rc, log, tmp_path / "out", first_exit="75")
    assert re.search(r"\(ranks: (rank\d=75 ?)+; the launcher exited (1|143)\)", log), log[-3000:]
    first = log.partition("restart_count=1")[0]
    assert re.search(r"exitcode\s*: 75", first), log[-3000:]
    # the only tracebacks are torchrun's report of the workers' 75 (ChildFailedError), none from a worker
    assert log.count("Traceback (most recent") == log.count("raise ChildFailedError("), log[-3000:]
    assert "DataLoader worker" not in log
    assert re.search(r"^EFFECTIVE rank=1 .*dataloader_workers=2 ", log, re.M), log[-3000:]
    assert "nodes=node[1-2]" in log
    assert "DDP nodes=2 nproc_per_node=1 world_size=2 backend=gloo rdzv=c10d endpoint=node1:" in log
    for rank in (0, 1):
        assert f"[rank{rank}] INFO run_qa: DISTRIBUTED world_size=2 rank={rank}" in log


@pytest.mark.parametrize("gres, args, what", FAILING)
def test_failing_job_stops_at_once_and_exits_2(
    slurm, one_node_jobs: dict[str, Future], gres: str, args: tuple[str, ...], what: str
):
    if gres != "--gres=none" and not slurm.gpu_gres:
        pytest.fail("the CI cluster has no gres/gpu: start it with SLURM_CI_GPUS=1 (.ci/run does)")
    code, log = one_node_jobs[gres].result()
    assert code == 2, log[-3000:]
    assert what in log and "JOB_EXIT_CODE=2" in log and "REQUEUE" not in log and "'loss'" not in log
    assert not re.search(r"^WALL_CLOCK_SECONDS=", log, re.M)


def test_steps_see_only_the_cpus_they_were_given(slurm):
    """The CI cluster binds tasks to their CPUs (TaskPlugin=task/affinity), as real clusters do."""
    proc = sh("srun", "--nodes=1", "--cpus-per-task=1", "nproc", timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stdout + proc.stderr


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_ddp_job_shares_cpus_per_rank_and_ends_at_once_when_a_node_dies(
    whole_cluster, tiny_bert: Path, tmp_path: Path
):
    """2 nodes x 2 processes, --cpus-per-task=2: each node's step gets 2 CPUs, each rank 1 thread. Then a rank
    dies (SIGKILL) while the other node's ranks hang in a collective, as NCCL ranks do when a peer is gone
    (emulated with SIGSTOP: gloo itself would notice). Its node's torchrun exits 1; srun must end the whole
    step at once (without --kill-on-bad-exit it waits for the hung node until the collective timeout, 30 min
    by default)."""
    env = job_env(tiny_bert, tmp_path, QA_CPU_PROCS_PER_NODE="2")
    proc, log_file = submit(
        "job_ddp.sh",
        tmp_path,
        env,
        "--gres=none",
        "--cpus-per-task=2",
        name="cpustest",
        args=("--max_steps", "1000", "--logging_steps", "1", "--save_strategy", "no", "--ddp_timeout", "600"),
    )
    text = lambda: log_file.read_text(errors="replace")  # noqa: E731
    stopped: list[int] = []
    try:
        wait_for(lambda: len(rank_pids(text())) == 4, 60, "every rank's pid", log_file)
        log = text()
        assert sorted(re.findall(r"STEP_CPUS node=(node\d) cpus=(\d+)", log)) == [
            ("node1", "2"),
            ("node2", "2"),
        ]
        effective = re.findall(r"^EFFECTIVE rank=(\d) .*threads=(\d+) ", log, re.M)
        assert sorted(effective) == [("0", "1"), ("1", "1"), ("2", "1"), ("3", "1")], log[-4000:]
        assert "threads=1 (2 CPUs / 2 process(es) on this node)" in log
        assert "BINDING=none (no GPU on this node: CPU workers share the step's CPUs)" in log
        pids = rank_pids(log)
        dying_node = _parent(pids[0])
        stopped = [pid for pid in pids.values() if _parent(pid) != dying_node]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        os.kill(
            next(pid for rank, pid in pids.items() if rank and _parent(pid) == dying_node), signal.SIGKILL
        )
        died = time.time()
        proc.communicate(timeout=150)
        assert time.time() - died < 100, text()[-3000:]
        assert proc.returncode != 0 and re.search(r"JOB_EXIT_CODE=[1-9]", text()), text()[-3000:]
        assert "REQUEUE" not in text()
    finally:
        for pid in stopped:  # the hung ranks, if Slurm left any
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

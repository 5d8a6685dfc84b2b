"""The figures of qa_hpc.tools.collect_results --plot and qa_hpc.tools.report: PNGs drawn from a runs table
(qa_hpc.tools.collect_results.read_runs) and from a run's log history (trainer_state.json).

matplotlib's Figure, not pyplot: no global state, no display on a login node.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from qa_hpc.record import Status

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

NA = "n/a"  # a figure a run lacks, in tables and on bars
# the training curves: a key of the Trainer's logs (trainer_state.json's log_history) -> its axis label
CURVES = (
    ("loss", "training loss"),
    ("grad_norm", "gradient norm"),
    ("learning_rate", "learning rate"),
    ("eval_f1", "evaluation F1 (during training)"),
)
# 700 x 400 px, readable in a README
SIZE = (7, 4)
DPI = 100
# file -> (column, axis label)
BARS = {
    "throughput.png": ("train_samples_per_second", "train samples/s (all ranks)"),
    "wall_time.png": ("wall_clock_seconds", "wall clock seconds"),
}


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


def _bar_value(value: float) -> str:
    """3 significant digits, whole numbers from 1,000 on (3,725 s, not 3.73e+03)."""
    return f"{value:,.0f}" if round(abs(value)) >= 1000 else f"{value:.3g}"  # 999.7: 1,000, not 1e+03


def bar_figure(table: pd.DataFrame, column: str, label: str) -> Figure:
    """One bar per run (red when it did not end ok), labelled with its value (and status when not ok; a
    resumed run's figure is its last launch's alone, which its label says: its wall clock is not the
    run's)."""
    fig, ax = _axes(title=f"{label} per run", ylabel=label)
    ok = table["status"].eq(Status.OK)
    bars = ax.bar(
        range(len(table)), table[column].fillna(0.0), color=ok.map({True: "tab:blue", False: "tab:red"})
    )
    resumed = table["resumed_from_step"].astype("Int64").fillna(0)

    def said(good: bool, status: str, step: int) -> str:
        if not good:
            return f" ({status})"
        return f" (last launch, from step {step})" if step > 0 else ""

    ax.bar_label(
        bars,
        fontsize=8,
        labels=[
            (NA if pd.isna(value) else _bar_value(value)) + said(good, status, step)
            for value, good, status, step in zip(table[column], ok, table["status"], resumed)
        ],
    )
    ax.set_xticks(range(len(table)), table["run"], rotation=20, ha="right", fontsize=8)
    return fig


def curves_figure(log_history: list[dict[str, Any]], run: str) -> Figure:
    """Loss, gradient norm, learning rate and the evaluations during training against the optimizer step, as
    the Trainer logged them (a resumed run's history holds every launch's logs)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6.5), dpi=DPI, layout="tight")
    fig.suptitle(f"{run}: training (trainer_state.json)")
    for at, (key, label) in enumerate(CURVES, start=1):
        points = [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
        _, ax = _axes(fig, label, at=(2, 2, at), xlabel="optimizer step")
        if points:
            ax.plot(*zip(*points), marker=".", label=key)
        else:
            ax.text(0.5, 0.5, f"no {key} in the log history", ha="center", transform=ax.transAxes)
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

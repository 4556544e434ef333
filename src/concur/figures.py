"""Every figure of the workflow, drawn on bare `matplotlib.figure.Figure` objects (Agg canvas, no pyplot state) and
saved atomically as PNG: the analysis figures (docs/data.md §8) from the numbers `concur.analyze` computes (the
scatter plots also from the points themselves), and each adapter's training loss (docs/data.md §6) from its step log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from .io import atomic_path
from .metrics import DIFFICULTIES

DPI = 120
METRIC_LABELS = {"exec": "Exec (correct)", "fast_1": "fast_1 (correct and faster than eager)"}
DIFFICULTY_COLOURS = {"Easy": "tab:green", "Medium": "tab:orange", "Hard": "tab:red"}
MAX_TASK_BARS = 40  # above this many tasks the ARL figure is a histogram instead of one bar per task
MAX_BAR_LABELS = 12  # above this many length bins the counts are shown on the right axis only


# ---------------------------------------------------------------- the analysis


def _new_axes(title: str, size=(7, 4.2)):
    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    return fig, ax


def _placeholder(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=13, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")


def _n(value: int) -> str:
    return f"{value:,}"


def _bin_bars(ax, bins: list[dict], label: str, unit: str, min_count: int):
    """Accuracy bars per bin with 95% Wilson whiskers (`ci_low`, `ci_high`), hollow where a bin holds fewer than
    `min_count` candidates, and, on a right-hand axis, the number of candidates per bin."""
    width = bins[0]["hi"] - bins[0]["lo"]
    centres = [(b["lo"] + b["hi"]) / 2 for b in bins]
    sparse = [0 < b["count"] < min_count for b in bins]
    bars = ax.bar(
        centres,
        [b["accuracy"] or 0.0 for b in bins],
        width=0.9 * width,
        color=["none" if few else "tab:blue" for few in sparse],
        edgecolor="tab:blue",
        label=label,
    )
    filled = [b for b in bins if b["count"]]
    whiskers = ax.errorbar(
        [(b["lo"] + b["hi"]) / 2 for b in filled],
        [b["accuracy"] for b in filled],
        yerr=[
            [max(0.0, b["accuracy"] - b["ci_low"]) for b in filled],
            [max(0.0, b["ci_high"] - b["accuracy"]) for b in filled],
        ],
        fmt="none",
        ecolor="black",
        elinewidth=0.8,
        capsize=2,
        label="95% Wilson interval",
    )
    if len(bins) <= MAX_BAR_LABELS:
        for bar, b in zip(bars, bins):
            if b["count"]:
                ax.annotate(
                    f"n={b['count']}",
                    (bar.get_x() + bar.get_width() / 2, b["ci_high"]),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    counts = ax.twinx()
    (line,) = counts.plot(
        centres,
        [b["count"] for b in bins],
        color="grey",
        marker="." if len(bins) <= 40 else None,
        linewidth=1,
        label=f"candidates per bin (right axis; {unit})",
    )
    counts.set_ylabel("candidates per bin")
    counts.set_ylim(0, max(1, max(b["count"] for b in bins)) * 1.4)  # headroom for the legend
    ax.set_ylim(0, 1.35)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("share correct")
    handles = [bars, whiskers, line]
    if any(sparse):
        handles.append(
            Patch(facecolor="none", edgecolor="tab:blue", label=f"hollow: fewer than {min_count} candidates")
        )
    ax.legend(handles=handles, loc="upper right", fontsize=8)
    return bars, line


def plot_accuracy_by_length(bins: list[dict], path: Path, min_count: int) -> Figure:
    fig, ax = _new_axes("Accuracy by reasoning length (all candidates)")
    if not bins:
        _placeholder(ax, "no candidates")
    else:
        width = bins[0]["hi"] - bins[0]["lo"]
        _bin_bars(
            ax,
            bins,
            f"share correct per {width}-token bin (n = {_n(sum(b['count'] for b in bins))} candidates)",
            f"{len(bins)} bins",
            min_count,
        )
        ax.set_xlabel("reasoning length (tokens)")
    _save(fig, path)
    return fig


def plot_length_by_correctness(joined: pd.DataFrame, lengths: dict, bin_width: int, path: Path) -> Figure:
    fig, ax = _new_axes("Reasoning length of correct vs incorrect candidates")
    groups = [
        ("correct", "tab:green", joined.loc[joined["correct"], "reasoning_tokens"]),
        ("incorrect", "tab:red", joined.loc[~joined["correct"], "reasoning_tokens"]),
    ]
    groups = [g for g in groups if len(g[2])]
    if not groups:
        _placeholder(ax, "no candidates")
    else:
        tokens = joined["reasoning_tokens"].to_numpy(dtype=float)
        edges = np.arange(np.floor(tokens.min() / bin_width), np.floor(tokens.max() / bin_width) + 2) * bin_width
        for label, colour, values in groups:
            share = np.histogram(values.to_numpy(dtype=float), bins=edges)[0] / len(values)
            st = lengths[label]
            ax.stairs(
                share,
                edges,
                color=colour,
                linewidth=1.8,
                label=f"{label} (n = {_n(st['count'])}, median {st['median']:,.0f} tokens)",
            )
            ax.axvline(st["median"], color=colour, linestyle="--", linewidth=1)
        ax.set_xlabel(f"reasoning length (tokens, {bin_width}-token bins; dashed: medians)")
        ax.set_ylabel("share of the group's candidates")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


def _fit_text(fit: dict) -> str:
    return f"r = {fit['r']:.2f}, p = {fit['p']:.2g}, R² = {fit['r2']:.2f}"


def _fit_line(ax, x: np.ndarray, y: np.ndarray, fit: dict) -> None:
    """Least-squares line of y on x on linear axes, drawn over the points' span only."""
    if fit["r"] is None:
        ax.plot([], [], " ", label="r undefined (< 3 points or constant)")
        return
    slope, intercept = np.polyfit(x, y, 1)
    xs = np.linspace(x.min(), x.max(), 100)
    ax.plot(xs, slope * xs + intercept, color="tab:red", label=f"least-squares fit: {_fit_text(fit)}")


def _log_fit_curve(ax, fit: dict) -> None:
    """The fit of ln(speedup) on length (analyze.log_speedup_fit): exp(intercept + slope * x) from the shortest to
    the longest point, a straight line on the log axis."""
    if fit["r"] is None:
        ax.plot([], [], " ", label="r undefined (< 3 points or constant)")
        return
    xs = np.linspace(fit["x_min"], fit["x_max"], 100)
    ax.plot(
        xs,
        np.exp(fit["intercept"] + fit["slope"] * xs),
        color="tab:red",
        label=f"fit of ln speedup: {_fit_text(fit)}; ×{fit['factor_per_1k_tokens']:.3g} per 1,000 tokens",
    )


def _scatter_style(n: int) -> dict:
    return {"s": 18 if n < 2000 else 4, "alpha": 0.7 if n < 2000 else 0.25, "rasterized": True}


def plot_speedup_vs_length(correct: pd.DataFrame, fit: dict, path: Path) -> Figure:
    fig, ax = _new_axes("Speedup vs reasoning length (correct candidates)")
    points = correct[np.isfinite(correct["speedup"]) & (correct["speedup"] > 0)]
    if points.empty:
        _placeholder(ax, "no correct candidates with a measured speedup")
    else:
        x = points["reasoning_tokens"].to_numpy(dtype=float)
        y = points["speedup"].to_numpy(dtype=float)
        ax.scatter(x, y, label=f"correct candidates (n = {_n(len(points))})", **_scatter_style(len(points)))
        _log_fit_curve(ax, fit)  # a straight line on the logarithmic y axis
        ax.axhline(1.0, color="grey", linestyle=":", label="speedup 1 (PyTorch eager)")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        low, high = ax.get_ylim()
        if high / low < 30:  # less than 1.5 decades: label the minor ticks too, else they crowd
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        else:
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("reasoning length (tokens)")
        ax.set_ylabel("speedup over PyTorch eager (×, log scale)")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


def plot_arl_difficulty(
    arl_rows: list[dict], easy_below: float, hard_above: float, bin_width: int, path: Path
) -> Figure:
    many = len(arl_rows) > MAX_TASK_BARS
    size = (8.5, 4.5) if many else (max(8.5, 0.35 * len(arl_rows) + 4), 4.5)
    fig, ax = _new_axes("Average reasoning length (ARL) per task", size=size)
    if not arl_rows:
        _placeholder(ax, "no candidates")
        _save(fig, path)
        return fig
    arl = np.array([r["arl"] for r in arl_rows], dtype=float)
    band = np.array([r["difficulty"] for r in arl_rows], dtype=object)
    handles = [
        Patch(color=DIFFICULTY_COLOURS[level], label=f"{level} (n = {_n(int((band == level).sum()))} tasks)")
        for level in DIFFICULTIES
    ]
    if many:  # one bar per task would be unreadable: tasks per ARL bin, stacked by band
        edges = np.arange(np.floor(arl.min() / bin_width), np.floor(arl.max() / bin_width) + 2) * bin_width
        bottom = np.zeros(len(edges) - 1)
        for level in DIFFICULTIES:
            counts = np.histogram(arl[band == level], bins=edges)[0]
            ax.bar(
                edges[:-1],
                counts,
                width=np.diff(edges),
                bottom=bottom,
                align="edge",
                color=DIFFICULTY_COLOURS[level],
                edgecolor="white",
                linewidth=0.3,
            )
            bottom += counts
        ax.set_ylim(0, max(1, bottom.max()) * 1.1)
        ax.set_xlabel(f"ARL (tokens, {bin_width}-token bins)")
        ax.set_ylabel("tasks")
        for value, label, colour in ((easy_below, "Easy below", "tab:green"), (hard_above, "Hard above", "tab:red")):
            ax.axvline(value, color=colour, linestyle="--")
            handles.append(Line2D([], [], color=colour, linestyle="--", label=f"{label} {value:g} tokens"))
    else:
        order = np.argsort(arl, kind="stable")
        ax.bar(range(len(order)), arl[order], color=[DIFFICULTY_COLOURS[b] for b in band[order]])
        ax.set_xticks(range(len(order)), [arl_rows[i]["name"] for i in order], rotation=60, ha="right", fontsize=8)
        highest = max(arl.max(), 1.0)
        # a threshold up to twice the highest ARL stretches the axis; one further up would flatten the bars
        near = [v for v in (easy_below, hard_above) if v <= 2 * highest]
        top = max([highest * 1.15] + [v * 1.1 for v in near])
        for value, label, colour in ((easy_below, "Easy below", "tab:green"), (hard_above, "Hard above", "tab:red")):
            shown = value <= top
            if shown:
                ax.axhline(value, color=colour, linestyle="--")
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colour,
                    linestyle="--",
                    label=f"{label} {value:g} tokens" + ("" if shown else " (above the axis)"),
                )
            )
        ax.set_ylim(0, top)
        ax.set_xlabel("task")
        ax.set_ylabel("ARL (tokens)")
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
    return fig


def plot_accuracy_within_task(within: dict, path: Path, min_count: int) -> Figure:
    fig, ax = _new_axes("Accuracy by reasoning length within each task")
    bins = within["bins"]
    if not bins:
        _placeholder(ax, "no task with two or more reasoning lengths")
    else:
        fit = within["correlation"]
        r_text = f"r = {fit['r']:.2f}, p = {fit['p']:.2g}" if fit["r"] is not None else "r undefined"
        _bin_bars(
            ax,
            bins,
            f"share correct per {within['bin_width']:g}-σ bin (n = {_n(within['n'])} candidates, "
            f"{_n(within['n_tasks'])} tasks; {r_text})",
            f"{len(bins)} bins",
            min_count,
        )
        ax.axvline(0.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_xlabel("reasoning length relative to the task's mean (standard deviations within the task)")
    _save(fig, path)
    return fig


def plot_speedup_within_task(points: pd.DataFrame, fit: dict, path: Path) -> Figure:
    fig, ax = _new_axes("Speedup vs reasoning length within each task (correct candidates)")
    usable = points[np.isfinite(points["z_length"]) & np.isfinite(points["z_speedup"])]
    if usable.empty:
        _placeholder(ax, "no task with two or more distinct correct kernels")
    else:
        x = usable["z_length"].to_numpy(dtype=float)
        y = usable["z_speedup"].to_numpy(dtype=float)
        ax.scatter(
            x,
            y,
            label=f"correct candidates (n = {_n(len(usable))}, {_n(fit['n_tasks'])} tasks)",
            **_scatter_style(len(usable)),
        )
        _fit_line(ax, x, y, fit)
        ax.axhline(0.0, color="grey", linestyle=":", linewidth=0.8)
        ax.axvline(0.0, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("reasoning length (z-score within the task, σ)")
        ax.set_ylabel("ln speedup (z-score within the task, σ)")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


def plot_eval_scores(overall: pd.DataFrame | None, path: Path) -> Figure:
    fig, ax = _new_axes(
        "Evaluation: Exec and fast_1 per model (all eval tasks)",
        size=(max(7, 1.1 * (0 if overall is None else len(overall)) + 2), 4.2),
    )
    metrics = [m for m in ("exec", "fast_1") if overall is not None and m in overall.columns]
    if overall is None or overall.empty or not metrics:
        _placeholder(ax, "no evaluation scores")
    else:
        x = np.arange(len(overall))
        width = 0.8 / len(metrics)
        for i, metric in enumerate(metrics):
            values = overall[metric].fillna(0.0).to_numpy(dtype=float)
            bars = ax.bar(x + (i - (len(metrics) - 1) / 2) * width, values, width, label=METRIC_LABELS[metric])
            ax.bar_label(bars, labels=[f"{v:.0%}" for v in values], fontsize=8)
        ax.set_xticks(
            x, [f"{m}\n(n = {_n(int(s))} samples)" for m, s in zip(overall["model"], overall["n_samples"])], fontsize=8
        )
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of samples")
        ax.legend()
    _save(fig, path)
    return fig


def plot_eval_by_difficulty(by_difficulty: pd.DataFrame | None, path: Path) -> Figure:
    models = [] if by_difficulty is None else list(dict.fromkeys(by_difficulty["model"]))
    fig, ax = _new_axes(
        "Evaluation: Exec per model by task difficulty (ARL)", size=(max(7, 1.1 * len(models) + 2), 4.2)
    )
    if by_difficulty is None or by_difficulty.empty:
        _placeholder(ax, "no evaluation scores by difficulty")
    else:
        bands = [b for b in DIFFICULTIES if (by_difficulty["group"] == b).any()]
        x = np.arange(len(models))
        width = 0.8 / len(bands)
        for i, band in enumerate(bands):
            part = by_difficulty[by_difficulty["group"] == band].set_index("model")
            values = np.array([part["exec"].get(m, np.nan) for m in models], dtype=float)
            n_tasks = int(part["n_tasks"].iloc[0])
            bars = ax.bar(
                x + (i - (len(bands) - 1) / 2) * width,
                np.nan_to_num(values),
                width,
                color=DIFFICULTY_COLOURS[band],
                label=f"{band} (n = {_n(n_tasks)} tasks)",
            )
            ax.bar_label(bars, labels=["–" if np.isnan(v) else f"{v:.0%}" for v in values], fontsize=7)
        ax.set_xticks(x, models, fontsize=8)
        ax.set_ylim(0, 1.12)
        ax.set_xlabel("model")
        ax.set_ylabel("Exec (share of samples correct)")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


# ---------------------------------------------------------------- training


def loss_figure(log: list[dict], title: str = ""):
    """Training loss per optimizer step (top) and tokens per second (bottom), from train_log.jsonl records."""
    steps = [entry["step"] for entry in log]
    figure = Figure(figsize=(7.5, 5.5), constrained_layout=True)
    loss_axes, speed_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    loss_axes.plot(
        steps,
        [entry["loss"] for entry in log],
        marker="o" if len(log) <= 50 else None,
        markersize=3,
        color="tab:blue",
        label="loss",
    )
    for boundary in _epoch_ends(log):
        loss_axes.axvline(boundary, color="grey", linestyle=":", linewidth=1)
    loss_axes.set_ylabel("training loss\n(nats per assistant token)")
    loss_axes.grid(alpha=0.3)
    if title:
        loss_axes.set_title(title, fontsize=10)
    for key, label, colour in (
        ("tokens_per_s", "assistant (target) tokens/s", "tab:orange"),
        ("input_tokens_per_s", "all input tokens/s", "tab:green"),
    ):
        points = [(entry["step"], entry[key]) for entry in log if entry.get(key) is not None]
        if points:
            speed_axes.plot(*zip(*points), color=colour, label=label)
    speed_axes.set_xlabel("optimizer step (dotted: end of an epoch)" if _epoch_ends(log) else "optimizer step")
    speed_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    speed_axes.set_ylabel("throughput (tokens/s)")
    speed_axes.grid(alpha=0.3)
    if speed_axes.lines:
        speed_axes.legend(fontsize=8, loc="best")
    return figure


def _epoch_ends(log: list[dict]) -> list[int]:
    """Steps at which an epoch ended, the last step aside (where the floor of the epoch counter went up)."""
    ends, previous = [], 0.0
    for entry in log[:-1]:
        epoch = entry.get("epoch")
        if epoch is not None:
            if int(epoch + 1e-6) > int(previous + 1e-6):
                ends.append(entry["step"])
            previous = epoch
    return ends


def write_loss_figure(log: list[dict], path: Path, title: str = "") -> None:
    """Save loss_figure as a PNG whose text chunk `concur:plotted` holds the numbers drawn (for checks)."""
    figure = loss_figure(log, title)
    FigureCanvasAgg(figure)
    plotted = {
        line.get_label(): line.get_xydata().tolist()
        for axes in figure.axes
        for line in axes.lines
        if not line.get_label().startswith("_")
    }
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=DPI, metadata={"concur:plotted": json.dumps(plotted)})

"""Analysis of reasoning length vs correctness and speedup, task difficulty by ARL, and evaluation scores.

`analyze` returns the numbers behind every figure (contract 8 of docs/data.md, JSON-safe: NaN -> None) and writes
the figures as PNG files. Figures are drawn on bare `matplotlib.figure.Figure` objects (Agg canvas, no pyplot state)
from those numbers (the scatter plots also from the points themselves). Every per-task computation is a pandas
groupby over whole columns, so a KernelBook-sized run (90,810 candidates) takes seconds (benchmarks/curate_scale.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter
from scipy import stats

from concur.curate import join_candidates
from concur.io import atomic_path, read_parquets, write_json
from concur.metrics import DIFFICULTIES, check_thresholds, difficulty, difficulty_labels  # noqa: F401 (re-export)

DPI = 120
METRIC_LABELS = {"exec": "Exec (correct)", "fast_1": "fast_1 (correct and faster than eager)"}
DIFFICULTY_COLOURS = {"Easy": "tab:green", "Medium": "tab:orange", "Hard": "tab:red"}
Z_BIN_WIDTH = 0.5
MAX_TASK_BARS = 40  # above this many tasks the ARL figure is a histogram instead of one bar per task
MAX_BAR_LABELS = 12  # above this many length bins the counts are shown on the right axis only
WITHIN_TASK_NORMALISATION = (
    "z-score within each task of both reasoning_tokens and speedup (tasks with < 2 correct candidates or a "
    "constant value are left out)"
)
WITHIN_TASK_LENGTH = (
    "reasoning_tokens z-scored within each task over all its candidates (tasks with < 2 candidates or one "
    "length for all are left out)"
)
FIGURES = ("accuracy_by_length.png", "length_correct_vs_incorrect.png", "speedup_vs_length.png",
           "arl_difficulty.png", "accuracy_by_length_within_task.png", "speedup_vs_length_within_task.png",
           "eval_scores.png", "eval_by_difficulty.png")


# ---------------------------------------------------------------- numbers

def json_safe(value):
    """Nested copy with numpy scalars as Python numbers and NaN/inf as None."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _bins(values: np.ndarray, correct: np.ndarray, width: float) -> list[dict]:
    """Bins [lo, hi) of `width` from the lowest to the highest value, empty bins included."""
    if len(values) == 0:
        return []
    index = np.floor(values / width).astype(np.int64)
    first = int(index.min())
    count = np.bincount(index - first)
    hits = np.bincount(index - first, weights=correct.astype(float), minlength=len(count)).astype(np.int64)
    return [{"lo": (first + i) * width, "hi": (first + i + 1) * width, "count": int(c), "n_correct": int(h),
             "accuracy": h / c if c else None} for i, (c, h) in enumerate(zip(count, hits))]


def accuracy_by_length(joined: pd.DataFrame, bin_width: int) -> list[dict]:
    """Bins [lo, hi) of `bin_width` tokens from the shortest to the longest reasoning, empty bins included."""
    bins = _bins(joined["reasoning_tokens"].to_numpy(dtype=np.int64), joined["correct"].to_numpy(dtype=bool),
                 bin_width)
    for b in bins:
        b["lo"], b["hi"] = int(b["lo"]), int(b["hi"])
    return bins


def length_stats(tokens: pd.Series) -> dict:
    values = tokens.astype(float)
    if values.empty:
        return {"count": 0, "mean": None, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    q1, median, q3 = np.quantile(values.to_numpy(), [0.25, 0.5, 0.75])
    return {"count": len(values), "mean": values.mean(), "median": median, "q1": q1, "q3": q3,
            "min": values.min(), "max": values.max()}


def pearson(x, y) -> dict:
    """Pearson r, two-sided p and R^2; None where undefined (< 3 points or a constant variable)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"n": int(len(x)), "r": None, "p": None, "r2": None}
    r, p = stats.pearsonr(x, y)
    return {"n": int(len(x)), "r": float(r), "p": float(p), "r2": float(r) ** 2}


def within_task_z(frame: pd.DataFrame, column: str) -> pd.Series:
    """`column` z-scored within each task (population std); NaN for a task of one row or one value."""
    values = frame[column].astype(float)
    groups = values.groupby(frame["task_id"])
    std = groups.transform("std", ddof=0)
    z = (values - groups.transform("mean")) / std
    return z.where(std > 0)


def _speedup_points(correct: pd.DataFrame) -> pd.DataFrame:
    """Correct candidates with a measured speedup, with their within-task z-scores of length and speedup."""
    measured = correct[np.isfinite(correct["speedup"])]
    return pd.DataFrame({"task_id": measured["task_id"], "z_length": within_task_z(measured, "reasoning_tokens"),
                         "z_speedup": within_task_z(measured, "speedup")})


def within_task_pearson(correct: pd.DataFrame, points: pd.DataFrame | None = None) -> dict:
    points = _speedup_points(correct) if points is None else points
    result = pearson(points["z_length"], points["z_speedup"])
    usable = np.isfinite(points["z_length"]) & np.isfinite(points["z_speedup"])
    result["n_tasks"] = int(points.loc[usable, "task_id"].nunique())
    result["normalisation"] = WITHIN_TASK_NORMALISATION
    return result


def accuracy_within_task(joined: pd.DataFrame, z: pd.Series | None = None) -> dict:
    """Accuracy against length normalised per task: bins of `Z_BIN_WIDTH` standard deviations, the
    point-biserial correlation of z-length and correctness, and the mean z-length of correct and incorrect."""
    z = within_task_z(joined, "reasoning_tokens") if z is None else z
    usable = np.isfinite(z.to_numpy(dtype=float))
    values, ok = z.to_numpy(dtype=float)[usable], joined["correct"].to_numpy(dtype=bool)[usable]
    fit = pearson(values, ok.astype(float))
    return {
        "bin_width": Z_BIN_WIDTH,
        "bins": _bins(values, ok, Z_BIN_WIDTH),
        "n": int(usable.sum()),
        "n_tasks": int(joined.loc[usable, "task_id"].nunique()),
        "correlation": {k: fit[k] for k in ("n", "r", "p", "r2")},
        "mean_z": {"correct": float(values[ok].mean()) if ok.any() else None,
                   "incorrect": float(values[~ok].mean()) if (~ok).any() else None},
        "normalisation": WITHIN_TASK_LENGTH,
    }


def arl_per_task(joined: pd.DataFrame, easy_below: float, hard_above: float) -> list[dict]:
    """Average reasoning length over each task's candidates (all of them, correct or not) and its difficulty."""
    if joined.empty:
        return []
    per_task = joined.groupby("task_id", sort=True).agg(
        name=("name", "first"), category=("category", "first"), level=("level", "first"),
        n=("correct", "size"), accuracy=("correct", "mean"), arl=("reasoning_tokens", "mean")).reset_index()
    per_task["arl"] = per_task["arl"].astype(float)
    per_task["accuracy"] = per_task["accuracy"].astype(float)
    per_task["level"] = per_task["level"].astype("int64")
    per_task["difficulty"] = difficulty_labels(per_task["arl"], easy_below, hard_above)
    return per_task.to_dict(orient="records")


# ---------------------------------------------------------------- figures

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


def _bin_bars(ax, bins: list[dict], label: str, unit: str):
    """Accuracy bars per bin and, on a right-hand axis, the number of candidates per bin."""
    width = bins[0]["hi"] - bins[0]["lo"]
    centres = [(b["lo"] + b["hi"]) / 2 for b in bins]
    bars = ax.bar(centres, [b["accuracy"] or 0.0 for b in bins], width=0.9 * width, color="tab:blue", label=label)
    if len(bins) <= MAX_BAR_LABELS:
        for bar, b in zip(bars, bins):
            if b["count"]:
                ax.annotate(f"n={b['count']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    counts = ax.twinx()
    (line,) = counts.plot(centres, [b["count"] for b in bins], color="grey", marker="." if len(bins) <= 40 else None,
                          linewidth=1,
                          label=f"candidates per bin (right axis; {unit})")
    counts.set_ylabel("candidates per bin")
    counts.set_ylim(0, max(1, max(b["count"] for b in bins)) * 1.4)  # headroom for the legend
    ax.set_ylim(0, 1.35)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("share correct")
    ax.legend(handles=[bars, line], loc="upper right", fontsize=8)
    return bars, line


def plot_accuracy_by_length(bins: list[dict], path: Path) -> Figure:
    fig, ax = _new_axes("Accuracy by reasoning length (all candidates)")
    if not bins:
        _placeholder(ax, "no candidates")
    else:
        width = bins[0]["hi"] - bins[0]["lo"]
        _bin_bars(ax, bins, f"share correct per {width}-token bin (n = {_n(sum(b['count'] for b in bins))} "
                            "candidates)", f"{len(bins)} bins")
        ax.set_xlabel("reasoning length (tokens)")
    _save(fig, path)
    return fig


def plot_length_by_correctness(joined: pd.DataFrame, lengths: dict, bin_width: int, path: Path) -> Figure:
    fig, ax = _new_axes("Reasoning length of correct vs incorrect candidates")
    groups = [("correct", "tab:green", joined.loc[joined["correct"], "reasoning_tokens"]),
              ("incorrect", "tab:red", joined.loc[~joined["correct"], "reasoning_tokens"])]
    groups = [g for g in groups if len(g[2])]
    if not groups:
        _placeholder(ax, "no candidates")
    else:
        tokens = joined["reasoning_tokens"].to_numpy(dtype=float)
        edges = np.arange(np.floor(tokens.min() / bin_width), np.floor(tokens.max() / bin_width) + 2) * bin_width
        for label, colour, values in groups:
            share = np.histogram(values.to_numpy(dtype=float), bins=edges)[0] / len(values)
            st = lengths[label]
            ax.stairs(share, edges, color=colour, linewidth=1.8,
                      label=f"{label} (n = {_n(st['count'])}, median {st['median']:,.0f} tokens)")
            ax.axvline(st["median"], color=colour, linestyle="--", linewidth=1)
        ax.set_xlabel(f"reasoning length (tokens, {bin_width}-token bins; dashed: medians)")
        ax.set_ylabel("share of the group's candidates")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


def _fit_line(ax, x: np.ndarray, y: np.ndarray, fit: dict, positive_only: bool) -> None:
    if fit["r"] is None:
        ax.plot([], [], " ", label="r undefined (< 3 points or constant)")
        return
    slope, intercept = np.polyfit(x, y, 1)
    xs = np.linspace(x.min(), x.max(), 100)
    ys = slope * xs + intercept
    ok = ys > 0 if positive_only else np.ones_like(ys, dtype=bool)
    ax.plot(xs[ok], ys[ok], color="tab:red",
            label=f"least-squares fit: r = {fit['r']:.2f}, p = {fit['p']:.2g}, R² = {fit['r2']:.2f}")


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
        _fit_line(ax, x, y, fit, positive_only=True)  # the y axis is logarithmic
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


def plot_arl_difficulty(arl_rows: list[dict], easy_below: float, hard_above: float, bin_width: int,
                        path: Path) -> Figure:
    many = len(arl_rows) > MAX_TASK_BARS
    size = (8.5, 4.5) if many else (max(8.5, 0.35 * len(arl_rows) + 4), 4.5)
    fig, ax = _new_axes("Average reasoning length (ARL) per task", size=size)
    if not arl_rows:
        _placeholder(ax, "no candidates")
        _save(fig, path)
        return fig
    arl = np.array([r["arl"] for r in arl_rows], dtype=float)
    band = np.array([r["difficulty"] for r in arl_rows], dtype=object)
    handles = [Patch(color=DIFFICULTY_COLOURS[level], label=f"{level} (n = {_n(int((band == level).sum()))} tasks)")
               for level in DIFFICULTIES]
    if many:  # one bar per task would be unreadable: tasks per ARL bin, stacked by band
        edges = np.arange(np.floor(arl.min() / bin_width), np.floor(arl.max() / bin_width) + 2) * bin_width
        bottom = np.zeros(len(edges) - 1)
        for level in DIFFICULTIES:
            counts = np.histogram(arl[band == level], bins=edges)[0]
            ax.bar(edges[:-1], counts, width=np.diff(edges), bottom=bottom, align="edge",
                   color=DIFFICULTY_COLOURS[level], edgecolor="white", linewidth=0.3)
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
            handles.append(Line2D([], [], color=colour, linestyle="--",
                                  label=f"{label} {value:g} tokens" + ("" if shown else " (above the axis)")))
        ax.set_ylim(0, top)
        ax.set_xlabel("task")
        ax.set_ylabel("ARL (tokens)")
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
    return fig


def plot_accuracy_within_task(within: dict, path: Path) -> Figure:
    fig, ax = _new_axes("Accuracy by reasoning length within each task")
    bins = within["bins"]
    if not bins:
        _placeholder(ax, "no task with two or more reasoning lengths")
    else:
        fit = within["correlation"]
        r_text = f"r = {fit['r']:.2f}, p = {fit['p']:.2g}" if fit["r"] is not None else "r undefined"
        _bin_bars(ax, bins, f"share correct per {within['bin_width']:g}-σ bin (n = {_n(within['n'])} candidates, "
                            f"{_n(within['n_tasks'])} tasks; {r_text})", f"{len(bins)} bins")
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
        ax.scatter(x, y, label=f"correct candidates (n = {_n(len(usable))}, {_n(fit['n_tasks'])} tasks)",
                   **_scatter_style(len(usable)))
        _fit_line(ax, x, y, fit, positive_only=False)
        ax.axhline(0.0, color="grey", linestyle=":", linewidth=0.8)
        ax.axvline(0.0, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("reasoning length (z-score within the task, σ)")
        ax.set_ylabel("speedup (z-score within the task, σ)")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


def plot_eval_scores(overall: pd.DataFrame | None, path: Path) -> Figure:
    fig, ax = _new_axes("Evaluation: Exec and fast_1 per model (all eval tasks)",
                        size=(max(7, 1.1 * (0 if overall is None else len(overall)) + 2), 4.2))
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
        ax.set_xticks(x, [f"{m}\n(n = {_n(int(s))} samples)" for m, s in zip(overall["model"], overall["n_samples"])],
                      fontsize=8)
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of samples")
        ax.legend()
    _save(fig, path)
    return fig


def plot_eval_by_difficulty(by_difficulty: pd.DataFrame | None, path: Path) -> Figure:
    models = [] if by_difficulty is None else list(dict.fromkeys(by_difficulty["model"]))
    fig, ax = _new_axes("Evaluation: Exec per model by task difficulty (ARL)",
                        size=(max(7, 1.1 * len(models) + 2), 4.2))
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
            bars = ax.bar(x + (i - (len(bands) - 1) / 2) * width, np.nan_to_num(values), width,
                          color=DIFFICULTY_COLOURS[band], label=f"{band} (n = {_n(n_tasks)} tasks)")
            ax.bar_label(bars, labels=["–" if np.isnan(v) else f"{v:.0%}" for v in values], fontsize=7)
        ax.set_xticks(x, models, fontsize=8)
        ax.set_ylim(0, 1.12)
        ax.set_xlabel("model")
        ax.set_ylabel("Exec (share of samples correct)")
        ax.legend(fontsize=8)
    _save(fig, path)
    return fig


# ---------------------------------------------------------------- entry point

def _captions(summary: dict) -> dict[str, str]:
    fit = summary["speedup_vs_length"]
    within = summary["speedup_vs_length_within_task"]
    acc_within = summary["accuracy_by_length_within_task"]
    counts = summary["difficulty_counts"]

    def r_text(f: dict) -> str:
        return f"r = {f['r']:.2f}, p = {f['p']:.2g}, R² = {f['r2']:.2f}" if f["r"] is not None else "r undefined"

    return {
        "accuracy_by_length.png": (f"Share of correct candidates per {summary['bin_width']}-token bin of reasoning "
                                   f"length over all {summary['n_candidates']} candidates (grey, right axis: "
                                   "candidates per bin)."),
        "length_correct_vs_incorrect.png": (f"Reasoning-length distributions of the {summary['n_correct']} correct "
                                            f"and the {summary['n_candidates'] - summary['n_correct']} incorrect "
                                            "candidates (share of each group per bin; dashed: medians)."),
        "speedup_vs_length.png": (f"Speedup over PyTorch eager vs reasoning length for the {fit['n']} correct "
                                  f"candidates, with a least-squares line ({r_text(fit)})."),
        "arl_difficulty.png": (f"Average reasoning length per task, coloured by difficulty (Easy {counts['Easy']}, "
                               f"Medium {counts['Medium']}, Hard {counts['Hard']} tasks) with the thresholds dashed."),
        "accuracy_by_length_within_task.png": (
            f"Share of correct candidates by reasoning length relative to the task's own mean (z-score, "
            f"{acc_within['bin_width']:g}-σ bins) over {acc_within['n']} candidates of {acc_within['n_tasks']} tasks: "
            f"length separated from task difficulty ({r_text(acc_within['correlation'])}, point-biserial)."),
        "speedup_vs_length_within_task.png": (
            f"Speedup vs reasoning length, both z-scored within each task, for {within['n']} correct candidates "
            f"of {within['n_tasks']} tasks ({r_text(within)})."),
        "eval_scores.png": ("Exec (correct) and fast_1 (correct and faster than PyTorch eager) rates per model on "
                            "the eval split." if summary["eval_scores"] else
                            "No evaluation scores were available (placeholder)."),
        "eval_by_difficulty.png": ("Exec per model on the eval tasks of each ARL difficulty band (the bands from "
                                   "evaluate.difficulty_model's generations)." if summary["eval_scores_by_difficulty"]
                                   else "No evaluation scores by difficulty were available (placeholder)."),
    }


def analyze(candidates: pd.DataFrame, verdicts: pd.DataFrame, tasks: pd.DataFrame, scores: pd.DataFrame | None,
            settings: dict, fig_dir: Path, figures: dict | None = None) -> dict:
    """Compute the analysis summary (JSON-safe) and write the figures (`FIGURES`) into `fig_dir`. Pass a dict as
    `figures` to receive the drawn `Figure` objects by file name."""
    bin_width = int(settings.get("bin_width", 512))
    easy_below = float(settings.get("easy_below", 4000))
    hard_above = float(settings.get("hard_above", 8500))
    if bin_width < 1:
        raise ValueError(f"analyze.bin_width: {bin_width} must be >= 1")
    check_thresholds(easy_below, hard_above)
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)

    joined = join_candidates(candidates, verdicts, tasks)
    correct = joined[joined["correct"]]
    bins = accuracy_by_length(joined, bin_width)
    fit = pearson(correct["reasoning_tokens"], correct["speedup"])
    points = _speedup_points(correct)
    within = within_task_pearson(correct, points)
    acc_within = accuracy_within_task(joined)
    arl_rows = arl_per_task(joined, easy_below, hard_above)
    overall = by_difficulty = None
    if scores is not None and not scores.empty:
        overall = scores[scores["scope"] == "overall"].reset_index(drop=True)
        by_difficulty = scores[scores["scope"] == "difficulty"].reset_index(drop=True)
    lengths = {"correct": length_stats(correct["reasoning_tokens"]),
               "incorrect": length_stats(joined.loc[~joined["correct"], "reasoning_tokens"])}

    summary = {
        "n_candidates": len(joined),
        "n_correct": len(correct),
        "n_tasks": int(joined["task_id"].nunique()),
        "bin_width": bin_width,
        "accuracy_by_length": bins,
        "length_by_correctness": lengths,
        "speedup_vs_length": {**fit, "over": "correct candidates, raw speedup vs reasoning_tokens"},
        "speedup_vs_length_within_task": within,
        "accuracy_by_length_within_task": acc_within,
        "difficulty_thresholds": {"easy_below": easy_below, "hard_above": hard_above},
        "arl": arl_rows,
        "difficulty_counts": {level: sum(r["difficulty"] == level for r in arl_rows) for level in DIFFICULTIES},
        "eval_scores": overall.to_dict(orient="records") if overall is not None else None,
        "eval_scores_by_difficulty": (by_difficulty.to_dict(orient="records")
                                      if by_difficulty is not None and len(by_difficulty) else None),
    }
    summary = json_safe(summary)

    drawn = {
        "accuracy_by_length.png": plot_accuracy_by_length(bins, fig_dir / "accuracy_by_length.png"),
        "length_correct_vs_incorrect.png": plot_length_by_correctness(
            joined, summary["length_by_correctness"], bin_width, fig_dir / "length_correct_vs_incorrect.png"),
        "speedup_vs_length.png": plot_speedup_vs_length(correct, fit, fig_dir / "speedup_vs_length.png"),
        "arl_difficulty.png": plot_arl_difficulty(arl_rows, easy_below, hard_above, bin_width,
                                                  fig_dir / "arl_difficulty.png"),
        "accuracy_by_length_within_task.png": plot_accuracy_within_task(
            summary["accuracy_by_length_within_task"], fig_dir / "accuracy_by_length_within_task.png"),
        "speedup_vs_length_within_task.png": plot_speedup_within_task(
            points, summary["speedup_vs_length_within_task"], fig_dir / "speedup_vs_length_within_task.png"),
        "eval_scores.png": plot_eval_scores(overall, fig_dir / "eval_scores.png"),
        "eval_by_difficulty.png": plot_eval_by_difficulty(by_difficulty, fig_dir / "eval_by_difficulty.png"),
    }
    if figures is not None:
        figures.update(drawn)
    summary["figures"] = _captions(summary)
    return summary


def run(candidate_paths, verified_paths, tasks_path, scores_path, settings: dict, summary_path, figure_paths) -> None:
    """The analyze stage: figures next to each other in one folder, and summary.json."""
    fig_dir = Path(figure_paths[0]).parent
    expected = {Path(p).name for p in figure_paths}
    scores = pd.read_csv(scores_path, dtype={"group": str}) if scores_path else None
    summary = analyze(read_parquets(candidate_paths), read_parquets(verified_paths), pd.read_parquet(tasks_path),
                      scores, settings, fig_dir)
    if set(summary["figures"]) != expected:
        raise ValueError(f"analyze wrote {sorted(summary['figures'])}, the workflow expects {sorted(expected)}")
    write_json(summary, summary_path)

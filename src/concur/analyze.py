"""Analysis of reasoning length vs correctness and speedup, task difficulty by ARL, and evaluation scores.

`analyze` returns the numbers behind every figure (contract 8 of docs/data.md, JSON-safe: NaN -> None) and writes
the figures as PNG files. Figures are drawn on bare `matplotlib.figure.Figure` objects (Agg canvas, no pyplot state).
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
from matplotlib.ticker import FuncFormatter
from scipy import stats

from concur.curate import join_candidates
from concur.io import atomic_path, read_parquets, write_json

DPI = 120
DIFFICULTIES = ("Easy", "Medium", "Hard")
METRIC_LABELS = {"exec": "Exec (correct)", "fast_1": "fast_1 (correct and faster than eager)"}
DIFFICULTY_COLOURS = {"Easy": "tab:green", "Medium": "tab:orange", "Hard": "tab:red"}
WITHIN_TASK_NORMALISATION = (
    "z-score within each task of both reasoning_tokens and speedup (tasks with < 2 correct candidates or a "
    "constant value are left out)"
)


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


def accuracy_by_length(joined: pd.DataFrame, bin_width: int) -> list[dict]:
    """Bins [lo, hi) of `bin_width` tokens from the shortest to the longest reasoning, empty bins included."""
    if joined.empty:
        return []
    index = joined["reasoning_tokens"] // bin_width
    bins = []
    for b in range(int(index.min()), int(index.max()) + 1):
        part = joined[index == b]
        n_correct = int(part["correct"].sum())
        bins.append({"lo": b * bin_width, "hi": (b + 1) * bin_width, "count": len(part), "n_correct": n_correct,
                     "accuracy": n_correct / len(part) if len(part) else None})
    return bins


def length_stats(tokens: pd.Series) -> dict:
    values = tokens.astype(float)
    if values.empty:
        return {"count": 0, "mean": None, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    return {"count": len(values), "mean": values.mean(), "median": values.median(),
            "q1": values.quantile(0.25), "q3": values.quantile(0.75), "min": values.min(), "max": values.max()}


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


def _zscore(values: pd.Series) -> pd.Series:
    std = values.std(ddof=0)
    return (values - values.mean()) / std if std > 0 else values * np.nan


def within_task_pearson(correct: pd.DataFrame) -> dict:
    measured = correct[np.isfinite(correct["speedup"])]
    groups = measured.groupby("task_id")["reasoning_tokens"]
    z_len = groups.transform(lambda s: _zscore(s.astype(float)))
    z_speed = measured.groupby("task_id")["speedup"].transform(_zscore)
    result = pearson(z_len, z_speed)
    usable = np.isfinite(z_len) & np.isfinite(z_speed)
    result["n_tasks"] = int(measured.loc[usable, "task_id"].nunique()) if len(measured) else 0
    result["normalisation"] = WITHIN_TASK_NORMALISATION
    return result


def difficulty(arl: float, easy_below: float, hard_above: float) -> str:
    if arl < easy_below:
        return "Easy"
    return "Hard" if arl > hard_above else "Medium"


def arl_per_task(joined: pd.DataFrame, easy_below: float, hard_above: float) -> list[dict]:
    """Average reasoning length over each task's candidates (all of them, correct or not) and its difficulty."""
    rows = []
    for task_id, part in joined.groupby("task_id", sort=True):
        arl = float(part["reasoning_tokens"].mean())
        rows.append({"task_id": task_id, "name": part["name"].iloc[0], "category": part["category"].iloc[0],
                     "level": int(part["level"].iloc[0]), "n": len(part), "accuracy": float(part["correct"].mean()),
                     "arl": arl, "difficulty": difficulty(arl, easy_below, hard_above)})
    return rows


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


def plot_accuracy_by_length(bins: list[dict], path: Path) -> None:
    fig, ax = _new_axes("Accuracy by reasoning length (all candidates)")
    if not bins:
        _placeholder(ax, "no candidates")
    else:
        width = bins[0]["hi"] - bins[0]["lo"]
        centres = [(b["lo"] + b["hi"]) / 2 for b in bins]
        heights = [b["accuracy"] or 0.0 for b in bins]
        bars = ax.bar(centres, heights, width=0.9 * width, color="tab:blue",
                      label=f"accuracy per {width}-token bin (n = {sum(b['count'] for b in bins)})")
        for bar, b in zip(bars, bins):
            if b["count"]:
                ax.annotate(f"n={b['count']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, 1.12)
        ax.set_xlabel("reasoning length (tokens)")
        ax.set_ylabel("share correct")
        ax.legend(loc="upper right")
    _save(fig, path)


def plot_length_by_correctness(joined: pd.DataFrame, path: Path) -> None:
    fig, ax = _new_axes("Reasoning length of correct vs incorrect candidates")
    groups = [("correct", joined.loc[joined["correct"], "reasoning_tokens"]),
              ("incorrect", joined.loc[~joined["correct"], "reasoning_tokens"])]
    groups = [(label, values) for label, values in groups if len(values)]
    if not groups:
        _placeholder(ax, "no candidates")
    else:
        ax.boxplot([values.to_numpy() for _, values in groups], showmeans=True)
        ax.set_xticks(range(1, len(groups) + 1), [f"{label}\n(n = {len(values)})" for label, values in groups])
        ax.set_ylabel("reasoning length (tokens)")
    _save(fig, path)


def plot_speedup_vs_length(correct: pd.DataFrame, fit: dict, path: Path) -> None:
    fig, ax = _new_axes("Speedup vs reasoning length (correct candidates)")
    points = correct[np.isfinite(correct["speedup"]) & (correct["speedup"] > 0)]
    if points.empty:
        _placeholder(ax, "no correct candidates with a measured speedup")
    else:
        x = points["reasoning_tokens"].to_numpy(dtype=float)
        y = points["speedup"].to_numpy(dtype=float)
        ax.scatter(x, y, s=18, alpha=0.7, label=f"correct candidates (n = {len(points)})")
        if fit["r"] is not None:
            slope, intercept = np.polyfit(x, y, 1)
            xs = np.linspace(x.min(), x.max(), 100)
            ys = slope * xs + intercept
            ok = ys > 0  # the y axis is logarithmic
            ax.plot(xs[ok], ys[ok], color="tab:red",
                    label=f"least-squares fit: r = {fit['r']:.2f}, p = {fit['p']:.2g}, R² = {fit['r2']:.2f}")
        else:
            ax.plot([], [], " ", label="r undefined (< 3 points or constant)")
        ax.axhline(1.0, color="grey", linestyle=":", label="speedup 1 (PyTorch eager)")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("reasoning length (tokens)")
        ax.set_ylabel("speedup over PyTorch eager (×, log scale)")
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_arl_difficulty(arl_rows: list[dict], easy_below: float, hard_above: float, path: Path) -> None:
    fig, ax = _new_axes("Average reasoning length (ARL) per task", size=(max(8.5, 0.35 * len(arl_rows) + 4), 4.5))
    if not arl_rows:
        _placeholder(ax, "no candidates")
    else:
        ordered = sorted(arl_rows, key=lambda r: r["arl"])
        ax.bar(range(len(ordered)), [r["arl"] for r in ordered],
               color=[DIFFICULTY_COLOURS[r["difficulty"]] for r in ordered])
        ax.set_xticks(range(len(ordered)), [r["name"] for r in ordered], rotation=60, ha="right", fontsize=8)
        highest = max(max(r["arl"] for r in ordered), 1.0)
        # a threshold up to twice the highest ARL stretches the axis; one further up would flatten the bars
        near = [v for v in (easy_below, hard_above) if v <= 2 * highest]
        top = max([highest * 1.15] + [v * 1.1 for v in near])
        handles = [Patch(color=DIFFICULTY_COLOURS[level],
                         label=f"{level} (n = {sum(r['difficulty'] == level for r in ordered)} tasks)")
                   for level in DIFFICULTIES]
        for value, label, colour in ((easy_below, "Easy below", "tab:green"), (hard_above, "Hard above", "tab:red")):
            shown = value <= top
            if shown:
                ax.axhline(value, color=colour, linestyle="--")
            handles.append(Line2D([], [], color=colour, linestyle="--",
                                  label=f"{label} {value:g} tokens" + ("" if shown else " (above the axis)")))
        ax.set_ylim(0, top)
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_xlabel("task")
        ax.set_ylabel("ARL (tokens)")
    _save(fig, path)


def plot_eval_scores(overall: pd.DataFrame | None, path: Path) -> None:
    fig, ax = _new_axes("Evaluation: Exec and fast_1 per model (all eval tasks)")
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
        ax.set_xticks(x, [f"{m}\n(n = {int(s)} samples)" for m, s in zip(overall["model"], overall["n_samples"])])
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of samples")
        ax.legend()
    _save(fig, path)


# ---------------------------------------------------------------- entry point

def _captions(summary: dict) -> dict[str, str]:
    fit = summary["speedup_vs_length"]
    counts = summary["difficulty_counts"]
    r_text = f"r = {fit['r']:.2f}, p = {fit['p']:.2g}" if fit["r"] is not None else "r undefined"
    return {
        "accuracy_by_length.png": (f"Share of correct candidates per {summary['bin_width']}-token bin of reasoning "
                                   f"length over all {summary['n_candidates']} candidates (n per bin on the bars)."),
        "length_correct_vs_incorrect.png": (f"Reasoning length of the {summary['n_correct']} correct vs the "
                                            f"{summary['n_candidates'] - summary['n_correct']} incorrect candidates "
                                            "(box: quartiles, line: median, triangle: mean)."),
        "speedup_vs_length.png": (f"Speedup over PyTorch eager vs reasoning length for the {fit['n']} correct "
                                  f"candidates, with a least-squares line ({r_text})."),
        "arl_difficulty.png": (f"Average reasoning length per task, coloured by difficulty (Easy {counts['Easy']}, "
                               f"Medium {counts['Medium']}, Hard {counts['Hard']} tasks) with the thresholds dashed."),
        "eval_scores.png": ("Exec (correct) and fast_1 (correct and faster than PyTorch eager) rates per model on "
                            "the eval split." if summary["eval_scores"] else
                            "No evaluation scores were available (placeholder)."),
    }


def analyze(candidates: pd.DataFrame, verdicts: pd.DataFrame, tasks: pd.DataFrame, scores: pd.DataFrame | None,
            settings: dict, fig_dir: Path) -> dict:
    """Compute the analysis summary (JSON-safe) and write the five figures into `fig_dir`."""
    bin_width = int(settings.get("bin_width", 512))
    easy_below = float(settings.get("easy_below", 4000))
    hard_above = float(settings.get("hard_above", 8500))
    if bin_width < 1:
        raise ValueError(f"analyze.bin_width: {bin_width} must be >= 1")
    if easy_below > hard_above:
        raise ValueError(f"analyze: easy_below ({easy_below}) is above hard_above ({hard_above})")
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)

    joined = join_candidates(candidates, verdicts, tasks)
    correct = joined[joined["correct"]]
    bins = accuracy_by_length(joined, bin_width)
    fit = pearson(correct["reasoning_tokens"], correct["speedup"])
    arl_rows = arl_per_task(joined, easy_below, hard_above)
    overall = None
    if scores is not None and not scores.empty:
        overall = scores[scores["scope"] == "overall"].reset_index(drop=True)

    summary = {
        "n_candidates": len(joined),
        "n_correct": len(correct),
        "n_tasks": int(joined["task_id"].nunique()),
        "bin_width": bin_width,
        "accuracy_by_length": bins,
        "length_by_correctness": {"correct": length_stats(correct["reasoning_tokens"]),
                                  "incorrect": length_stats(joined.loc[~joined["correct"], "reasoning_tokens"])},
        "speedup_vs_length": {**fit, "over": "correct candidates, raw speedup vs reasoning_tokens"},
        "speedup_vs_length_within_task": within_task_pearson(correct),
        "difficulty_thresholds": {"easy_below": easy_below, "hard_above": hard_above},
        "arl": arl_rows,
        "difficulty_counts": {level: sum(r["difficulty"] == level for r in arl_rows) for level in DIFFICULTIES},
        "eval_scores": overall.to_dict(orient="records") if overall is not None else None,
    }
    summary = json_safe(summary)

    plot_accuracy_by_length(bins, fig_dir / "accuracy_by_length.png")
    plot_length_by_correctness(joined, fig_dir / "length_correct_vs_incorrect.png")
    plot_speedup_vs_length(correct, fit, fig_dir / "speedup_vs_length.png")
    plot_arl_difficulty(arl_rows, easy_below, hard_above, fig_dir / "arl_difficulty.png")
    plot_eval_scores(overall, fig_dir / "eval_scores.png")
    summary["figures"] = _captions(summary)
    return summary


def run(candidate_paths, verified_paths, tasks_path, scores_path, settings: dict, summary_path, figure_paths) -> None:
    """The analyze stage: figures next to each other in one folder, and summary.json."""
    fig_dir = Path(figure_paths[0]).parent
    expected = {Path(p).name for p in figure_paths}
    scores = pd.read_csv(scores_path) if scores_path else None
    summary = analyze(read_parquets(candidate_paths), read_parquets(verified_paths), pd.read_parquet(tasks_path),
                      scores, settings, fig_dir)
    if set(summary["figures"]) != expected:
        raise ValueError(f"analyze wrote {sorted(summary['figures'])}, the workflow expects {sorted(expected)}")
    write_json(summary, summary_path)

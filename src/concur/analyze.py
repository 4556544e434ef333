"""Analysis of reasoning length vs correctness and speedup, task difficulty by ARL, and evaluation scores.

`analyze` returns the numbers behind every figure (contract 8 of docs/data.md, JSON-safe: NaN -> None) and has
`concur.figures` draw them as PNG files. Every per-task computation is a pandas groupby over whole columns, so a
KernelBook-sized run (90,810 candidates) takes seconds (benchmarks/curate_scale.py).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from concur import config, screening
from concur.curate import join_candidates
from concur.figures import (
    plot_accuracy_by_length,
    plot_accuracy_within_task,
    plot_arl_difficulty,
    plot_eval_by_difficulty,
    plot_eval_scores,
    plot_length_by_correctness,
    plot_speedup_vs_length,
    plot_speedup_within_task,
)
from concur.io import read_parquets, write_json
from concur.metrics import DIFFICULTIES, check_thresholds, difficulty_labels

log = logging.getLogger(__name__)

Z_BIN_WIDTH = 0.5
MIN_BIN_COUNT = 10  # bins with fewer candidates are drawn hollow: their share is too uncertain to show as a bar
CI_Z = 1.959963984540054  # 95% two-sided normal quantile of the Wilson interval
SPEEDUP_FIT = (
    "least squares of ln(speedup) on reasoning_tokens over correct candidates with a measured speedup > 0; "
    "r, p, r2: Pearson of reasoning_tokens and ln(speedup)"
)
WITHIN_TASK_NORMALISATION = (
    "z-score within each task of both reasoning_tokens and ln(speedup) (tasks with < 2 correct candidates or a "
    "constant value are left out)"
)
WITHIN_TASK_LENGTH = (
    "reasoning_tokens z-scored within each task over all its candidates (tasks with < 2 candidates or one "
    "length for all are left out)"
)
FIGURES = (
    "accuracy_by_length.png",
    "length_correct_vs_incorrect.png",
    "speedup_vs_length.png",
    "arl_difficulty.png",
    "accuracy_by_length_within_task.png",
    "speedup_vs_length_within_task.png",
    "eval_scores.png",
    "eval_by_difficulty.png",
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


def wilson(successes: int, n: int) -> tuple[float | None, float | None]:
    """95% Wilson score interval of a share of `successes` out of `n`; (None, None) when n is 0."""
    if n == 0:
        return None, None
    share, z2 = successes / n, CI_Z * CI_Z
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = CI_Z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if successes == 0 else max(0.0, min(share, centre - half))  # exact ends where rounding would stray
    high = 1.0 if successes == n else min(1.0, max(share, centre + half))
    return low, high


def _bins(values: np.ndarray, correct: np.ndarray, width: float) -> list[dict]:
    """Bins [lo, hi) of `width` from the lowest to the highest value, empty bins included, each with its share
    correct and the share's 95% Wilson interval (`ci_low`, `ci_high`)."""
    if len(values) == 0:
        return []
    index = np.floor(values / width).astype(np.int64)
    first = int(index.min())
    count = np.bincount(index - first)
    hits = np.bincount(index - first, weights=correct.astype(float), minlength=len(count)).astype(np.int64)
    return [
        {
            "lo": (first + i) * width,
            "hi": (first + i + 1) * width,
            "count": int(c),
            "n_correct": int(h),
            "accuracy": h / c if c else None,
            "ci_low": wilson(int(h), int(c))[0],
            "ci_high": wilson(int(h), int(c))[1],
        }
        for i, (c, h) in enumerate(zip(count, hits))
    ]


def accuracy_by_length(joined: pd.DataFrame, bin_width: int) -> list[dict]:
    """Bins [lo, hi) of `bin_width` tokens from the shortest to the longest reasoning, empty bins included."""
    bins = _bins(joined["reasoning_tokens"].to_numpy(dtype=np.int64), joined["correct"].to_numpy(dtype=bool), bin_width)
    for b in bins:
        b["lo"], b["hi"] = int(b["lo"]), int(b["hi"])
    return bins


def length_stats(tokens: pd.Series) -> dict:
    values = tokens.astype(float)
    if values.empty:
        return {"count": 0, "mean": None, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    q1, median, q3 = np.quantile(values.to_numpy(), [0.25, 0.5, 0.75])
    return {
        "count": len(values),
        "mean": values.mean(),
        "median": median,
        "q1": q1,
        "q3": q3,
        "min": values.min(),
        "max": values.max(),
    }


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


def log_speedup_fit(tokens, speedup) -> dict:
    """Exponential fit of speedup on reasoning length: least squares of ln(speedup) on tokens, a straight line on a
    log speedup axis. `n`, Pearson `r`, `p`, `r2` of tokens and ln(speedup); `slope` (ln speedup per token),
    `intercept` (ln speedup at 0 tokens), `factor_per_1k_tokens` (exp(1000 * slope): the speedup's change per 1,000
    tokens), `x_min`, `x_max` (the span of the points, where the curve is drawn). Points with a speedup that is not
    finite and > 0 are left out."""
    x = np.asarray(tokens, dtype=float)
    y = np.asarray(speedup, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[keep], np.log(y[keep])
    result = pearson(x, y)
    result.update(slope=None, intercept=None, factor_per_1k_tokens=None, x_min=None, x_max=None)
    if len(x):
        result.update(x_min=float(x.min()), x_max=float(x.max()))
    if result["r"] is not None:
        slope, intercept = np.polyfit(x, y, 1)
        result.update(slope=float(slope), intercept=float(intercept), factor_per_1k_tokens=math.exp(1000 * slope))
    return result


def within_task_z(frame: pd.DataFrame, column: str) -> pd.Series:
    """`column` z-scored within each task (population std); NaN for a task of one row or one value."""
    values = frame[column].astype(float)
    groups = values.groupby(frame["task_id"])
    std = groups.transform("std", ddof=0)
    z = (values - groups.transform("mean")) / std
    return z.where(std > 0)


def _speedup_points(correct: pd.DataFrame) -> pd.DataFrame:
    """Correct candidates with a measured speedup (finite, > 0), with their within-task z-scores of length and of
    ln(speedup)."""
    measured = correct[np.isfinite(correct["speedup"]) & (correct["speedup"] > 0)]
    measured = measured.assign(log_speedup=np.log(measured["speedup"].astype(float)))
    return pd.DataFrame(
        {
            "task_id": measured["task_id"],
            "z_length": within_task_z(measured, "reasoning_tokens"),
            "z_speedup": within_task_z(measured, "log_speedup"),
        }
    )


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
        "mean_z": {
            "correct": float(values[ok].mean()) if ok.any() else None,
            "incorrect": float(values[~ok].mean()) if (~ok).any() else None,
        },
        "normalisation": WITHIN_TASK_LENGTH,
    }


def arl_per_task(joined: pd.DataFrame, easy_below: float, hard_above: float) -> list[dict]:
    """Average reasoning length over each task's candidates (all of them, correct or not, cut ones at the length
    they reached: `n_truncated` of `n`) and its difficulty."""
    if joined.empty:
        return []
    per_task = (
        joined.groupby("task_id", sort=True)
        .agg(
            name=("name", "first"),
            category=("category", "first"),
            level=("level", "first"),
            n=("correct", "size"),
            n_truncated=("truncated", "sum"),
            accuracy=("correct", "mean"),
            arl=("reasoning_tokens", "mean"),
        )
        .reset_index()
    )
    per_task["arl"] = per_task["arl"].astype(float)
    per_task["accuracy"] = per_task["accuracy"].astype(float)
    per_task["level"] = per_task["level"].astype("int64")
    per_task["n_truncated"] = per_task["n_truncated"].astype("int64")
    per_task["difficulty"] = difficulty_labels(per_task["arl"], easy_below, hard_above)
    return per_task.to_dict(orient="records")


# ---------------------------------------------------------------- entry point


def _captions(summary: dict) -> dict[str, str]:
    fit = summary["speedup_vs_length"]
    within = summary["speedup_vs_length_within_task"]
    acc_within = summary["accuracy_by_length_within_task"]
    counts = summary["difficulty_counts"]

    def r_text(f: dict) -> str:
        return f"r = {f['r']:.2f}, p = {f['p']:.2g}, R² = {f['r2']:.2f}" if f["r"] is not None else "r undefined"

    screened = summary["screening"]
    left = screened["left_out"]
    left_text = (
        f"; left out: {left['truncated']} truncated, {left['no_reasoning']} without reasoning, "
        f"{left['untrusted']} with untrusted verdicts"
        if any(left.values())
        else ""
    )
    sparse = f"hollow: fewer than {summary['min_bin_count']} candidates; whiskers: 95% Wilson intervals"
    fit_text = (
        f"{r_text(fit)} on ln speedup; ×{fit['factor_per_1k_tokens']:.3g} per 1,000 tokens"
        if fit["r"] is not None
        else r_text(fit)
    )

    return {
        "accuracy_by_length.png": (
            f"Share of correct candidates per {summary['bin_width']}-token bin of reasoning "
            f"length over all {summary['n_candidates']} candidates analysed (grey, right axis: "
            f"candidates per bin; {sparse}{left_text})."
        ),
        "length_correct_vs_incorrect.png": (
            f"Reasoning-length distributions of the {summary['n_correct']} correct "
            f"and the {summary['n_candidates'] - summary['n_correct']} incorrect "
            "candidates (share of each group per bin; dashed: medians)."
        ),
        "speedup_vs_length.png": (
            f"Speedup over PyTorch eager (log axis) vs reasoning length for the {fit['n']} correct "
            f"candidates with a measured speedup, with the least-squares fit of ln(speedup) on length, drawn over "
            f"the data's span ({fit_text})."
        ),
        "arl_difficulty.png": (
            f"Average reasoning length per task, coloured by difficulty (Easy {counts['Easy']}, "
            f"Medium {counts['Medium']}, Hard {counts['Hard']} tasks) with the thresholds dashed."
        ),
        "accuracy_by_length_within_task.png": (
            f"Share of correct candidates by reasoning length relative to the task's own mean (z-score, "
            f"{acc_within['bin_width']:g}-σ bins; {sparse}) over {acc_within['n']} candidates of "
            f"{acc_within['n_tasks']} tasks: length separated from task difficulty "
            f"({r_text(acc_within['correlation'])}, point-biserial)."
        ),
        "speedup_vs_length_within_task.png": (
            f"ln speedup vs reasoning length, both z-scored within each task, for {within['n']} correct candidates "
            f"of {within['n_tasks']} tasks ({r_text(within)})."
        ),
        "eval_scores.png": (
            "Exec (correct) and fast_1 (correct and faster than PyTorch eager) rates per model on the eval split."
            if summary["eval_scores"]
            else "No evaluation scores were available (placeholder)."
        ),
        "eval_by_difficulty.png": (
            "Exec per model on the eval tasks of each ARL difficulty band (the bands from "
            "evaluate.difficulty_model's generations)."
            if summary["eval_scores_by_difficulty"]
            else "No evaluation scores by difficulty were available (placeholder)."
        ),
    }


def last_turn(scores: pd.DataFrame) -> pd.DataFrame:
    """The eval scores after the last turn (scores.csv's `turn`; older files without it hold one turn)."""
    if "turn" not in scores.columns:
        return scores
    turns = scores["turn"].astype(str)
    numbered = sorted({int(t) for t in turns if t.isdigit()})
    return scores[turns == str(numbered[-1])] if numbered else scores


def analyze(
    candidates: pd.DataFrame,
    verdicts: pd.DataFrame,
    tasks: pd.DataFrame,
    scores: pd.DataFrame | None,
    settings: dict,
    fig_dir: Path,
    figures: dict | None = None,
) -> dict:
    """Compute the analysis summary (JSON-safe) and write the figures (`FIGURES`) into `fig_dir`. Pass a dict as
    `figures` to receive the drawn `Figure` objects by file name."""
    settings = config.with_defaults("analyze", settings)
    bin_width = int(settings["bin_width"])
    easy_below = float(settings["easy_below"])
    hard_above = float(settings["hard_above"])
    if bin_width < 1:
        raise ValueError(f"analyze.bin_width: {bin_width} must be >= 1")
    check_thresholds(easy_below, hard_above)
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)

    everything = join_candidates(candidates, verdicts, tasks)
    screened = screening.screen(everything, bool(settings["include_truncated"]))
    joined = screened.kept  # `correct` here is the shared rule's (concur.screening.counts_as_correct)
    correct = joined[joined["correct"]]
    bins = accuracy_by_length(joined, bin_width)
    fit = log_speedup_fit(correct["reasoning_tokens"], correct["speedup"])
    points = _speedup_points(correct)
    within = within_task_pearson(correct, points)
    acc_within = accuracy_within_task(joined)
    # a task's ARL counts its cut samples at the length they reached (a floor): leaving them out would make the
    # tasks whose samples run longest look easiest, and drop those the model never finished at all
    arl_rows = arl_per_task(screening.screen(everything, True).kept, easy_below, hard_above)
    overall = by_difficulty = None
    if scores is not None and not scores.empty:
        scores = last_turn(scores)
        overall = scores[scores["scope"] == "overall"].reset_index(drop=True)
        by_difficulty = scores[scores["scope"] == "difficulty"].reset_index(drop=True)
    lengths = {
        "correct": length_stats(correct["reasoning_tokens"]),
        "incorrect": length_stats(joined.loc[~joined["correct"], "reasoning_tokens"]),
    }

    counts = screened.counts
    summary = {
        "n_candidates": len(joined),
        "n_correct": len(correct),
        "n_tasks": int(joined["task_id"].nunique()),
        "screening": {
            "candidates": counts["candidates"],
            "left_out": counts["left_out"],
            "no_code": counts["no_code"],
            "correct_verdict_without_code": counts["correct_verdict_without_code"],
            "reduced_precision": counts["reduced_precision"],
            "truncated": counts["truncated"],
            "reasoning_generators": counts["reasoning_generators"],
            "tokenizers": counts["tokenizers"],
        },
        "bin_width": bin_width,
        "min_bin_count": MIN_BIN_COUNT,
        "accuracy_by_length": bins,
        "length_by_correctness": lengths,
        "speedup_vs_length": {**fit, "fit": SPEEDUP_FIT},
        "speedup_vs_length_within_task": within,
        "accuracy_by_length_within_task": acc_within,
        "difficulty_thresholds": {"easy_below": easy_below, "hard_above": hard_above},
        "arl": arl_rows,
        "difficulty_counts": {level: sum(r["difficulty"] == level for r in arl_rows) for level in DIFFICULTIES},
        "eval_scores": overall.to_dict(orient="records") if overall is not None else None,
        "eval_scores_by_difficulty": (
            by_difficulty.to_dict(orient="records") if by_difficulty is not None and len(by_difficulty) else None
        ),
    }
    summary = json_safe(summary)

    drawn = {
        "accuracy_by_length.png": plot_accuracy_by_length(
            summary["accuracy_by_length"], fig_dir / "accuracy_by_length.png", MIN_BIN_COUNT
        ),
        "length_correct_vs_incorrect.png": plot_length_by_correctness(
            joined, summary["length_by_correctness"], bin_width, fig_dir / "length_correct_vs_incorrect.png"
        ),
        "speedup_vs_length.png": plot_speedup_vs_length(
            correct, summary["speedup_vs_length"], fig_dir / "speedup_vs_length.png"
        ),
        "arl_difficulty.png": plot_arl_difficulty(
            arl_rows, easy_below, hard_above, bin_width, fig_dir / "arl_difficulty.png"
        ),
        "accuracy_by_length_within_task.png": plot_accuracy_within_task(
            summary["accuracy_by_length_within_task"], fig_dir / "accuracy_by_length_within_task.png", MIN_BIN_COUNT
        ),
        "speedup_vs_length_within_task.png": plot_speedup_within_task(
            points, summary["speedup_vs_length_within_task"], fig_dir / "speedup_vs_length_within_task.png"
        ),
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
    if isinstance(scores_path, (list, tuple)):  # a rule's input list: empty when evaluation is off
        scores_path = scores_path[0] if scores_path else None
    expected = {Path(p).name for p in figure_paths}
    scores = pd.read_csv(scores_path, dtype={"group": str}) if scores_path else None
    summary = analyze(
        read_parquets(candidate_paths),
        read_parquets(verified_paths),
        pd.read_parquet(tasks_path),
        scores,
        settings,
        fig_dir,
    )
    if set(summary["figures"]) != expected:
        raise ValueError(f"analyze wrote {sorted(summary['figures'])}, the workflow expects {sorted(expected)}")
    write_json(summary, summary_path)
    log.info(
        "analyze: %d candidates (%d correct) over %d tasks, of %d (left out: %s); ln speedup vs length r = %s; "
        "%d figures in %s",
        summary["n_candidates"],
        summary["n_correct"],
        summary["n_tasks"],
        summary["screening"]["candidates"],
        summary["screening"]["left_out"],
        summary["speedup_vs_length"]["r"],
        len(summary["figures"]),
        fig_dir,
    )

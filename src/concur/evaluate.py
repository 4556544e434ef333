"""Score evaluation verdicts (contract 7 of docs/data.md): eval/scores.csv, the paper-style results table
(eval/table.csv, eval/table.md) and the eval tasks' difficulty (eval/difficulty.csv).

Definitions, per model and group of tasks:
* ``exec``: correct samples / all samples.
* ``fast_{p}``: share of samples that are correct with speedup STRICTLY greater than p (fast_0: correct, a speedup
  the clock could not resolve included).
* ``pass@{k}`` / ``fast_{p}@{k}``: unbiased pass@k per task, averaged over tasks. A task with fewer than k
  samples has no pass@k estimate (NaN) and is left out of the mean; the mean is NaN when no task has k samples.
  The results table calls them Exec@k (pass@k of a correct kernel) and fast_1@k, as the paper does.
* ``mean_speedup`` / ``geomean_speedup``: over correct samples with a measured speedup; NaN when none.

Groups: every task (overall/all), each KernelBench level, each category, and each difficulty band, where a task's
difficulty is the average reasoning length (ARL) of one reference model's eval generations for it
(``evaluate.difficulty_model``), banded by ``analyze.easy_below`` / ``analyze.hard_above``.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from concur import config
from concur.contracts import require_columns
from concur.metrics import DIFFICULTIES, check_thresholds, difficulty_labels, geomean, pass_at_k

log = logging.getLogger(__name__)

SCOPES = ("overall", "level", "category", "difficulty")
DIFFICULTY_COLUMNS = ["task_id", "level", "category", "model", "n_samples", "arl", "difficulty"]
TABLE_FAST_P = 1


def fast_name(p: float) -> str:
    return f"fast_{p:g}"


def score_columns(pass_k, fast_p) -> list[str]:
    """The scores.csv columns, in order."""
    return (
        ["model", "scope", "group", "n_tasks", "n_samples", "exec"]
        + [f"pass@{k}" for k in pass_k]
        + [fast_name(p) for p in fast_p]
        + [f"{fast_name(p)}@{k}" for p in fast_p for k in pass_k]
        + ["mean_speedup", "geomean_speedup"]
    )


def _mean_pass_at_k(per_task: pd.DataFrame, success: str, k: int) -> float:
    """Mean over tasks of pass@k; tasks with fewer than k samples are skipped."""
    estimates = [pass_at_k(int(n), int(c), k) for n, c in zip(per_task["n"], per_task[success]) if n >= k]
    return float(np.mean(estimates)) if estimates else math.nan


def _group_scores(frame: pd.DataFrame, pass_k, fast_p) -> dict:
    correct = frame["correct"].to_numpy(dtype=bool)
    speedup = frame["speedup"].to_numpy(dtype=float)
    row: dict = {"n_tasks": int(frame["task_id"].nunique()), "n_samples": len(frame)}
    row["exec"] = float(correct.mean()) if len(frame) else math.nan

    flags = frame[["task_id"]].assign(ok=correct)
    for p in fast_p:
        # NaN > p is False: an unmeasured speedup (timing:unresolved) never counts as fast, but as fast_0 (> 0)
        flags[fast_name(p)] = correct & ((speedup > p) | ((p <= 0) & np.isnan(speedup)))
    per_task = flags.groupby("task_id").agg(n=("ok", "size"), **{col: (col, "sum") for col in flags.columns[1:]})

    for k in pass_k:
        row[f"pass@{k}"] = _mean_pass_at_k(per_task, "ok", k)
    for p in fast_p:
        row[fast_name(p)] = float(flags[fast_name(p)].mean()) if len(frame) else math.nan
    for p in fast_p:
        for k in pass_k:
            row[f"{fast_name(p)}@{k}"] = _mean_pass_at_k(per_task, fast_name(p), k)

    measured = speedup[correct & ~np.isnan(speedup)]
    row["mean_speedup"] = float(measured.mean()) if len(measured) else math.nan
    row["geomean_speedup"] = geomean(measured)
    return row


def _with_task_info(
    verdicts: pd.DataFrame, tasks: pd.DataFrame, model: str, difficulty: pd.DataFrame | None
) -> pd.DataFrame:
    require_columns(verdicts, ("task_id", "correct", "speedup"), f"verdicts of model {model!r}")
    unknown = sorted(set(verdicts["task_id"]) - set(tasks["task_id"]))
    if unknown:
        raise ValueError(f"verdicts of model {model!r}: task_id {unknown[0]!r} is not in the tasks table")
    info = tasks.loc[:, ["task_id", "level", "category"]].drop_duplicates("task_id")
    if difficulty is not None:
        info = info.merge(difficulty.loc[:, ["task_id", "difficulty"]], on="task_id", how="left")
    joined = verdicts.loc[:, ["task_id", "correct", "speedup"]].merge(info, on="task_id", how="left")
    return joined.astype({"correct": bool, "speedup": float, "level": "int64"})


def score(
    verdicts_by_model: dict[str, pd.DataFrame],
    tasks: pd.DataFrame,
    settings: dict,
    difficulty: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per model x scope x group, columns of `score_columns`: overall/all, each level, each category and,
    with a `difficulty` table (task_id, difficulty), each difficulty band that has tasks (Easy, Medium, Hard)."""
    settings = config.with_defaults("evaluate", settings)
    pass_k, fast_p = list(settings["pass_k"]), list(settings["fast_p"])
    rows = []
    for model, verdicts in verdicts_by_model.items():
        frame = _with_task_info(verdicts, tasks, model, difficulty)
        groups = [("overall", "all", frame)]
        groups += [("level", str(level), part) for level, part in frame.groupby("level", sort=True)]
        groups += [("category", str(cat), part) for cat, part in frame.groupby("category", sort=True)]
        if difficulty is not None:
            groups += [
                ("difficulty", band, frame[frame["difficulty"] == band])
                for band in DIFFICULTIES
                if (frame["difficulty"] == band).any()
            ]
        for scope, group, part in groups:
            rows.append({"model": model, "scope": scope, "group": group, **_group_scores(part, pass_k, fast_p)})
    columns = score_columns(pass_k, fast_p)
    table = pd.DataFrame(rows, columns=columns)
    return table.astype({"n_tasks": "int64", "n_samples": "int64"})


# ---------------------------------------------------------------- difficulty


def task_difficulty(
    candidates: pd.DataFrame, tasks: pd.DataFrame, model: str, easy_below: float, hard_above: float
) -> pd.DataFrame:
    """Each eval task's ARL over `model`'s eval generations (every sample, correct or not) and its band.

    Columns `DIFFICULTY_COLUMNS`, one row per task that has generations, in task_id order."""
    check_thresholds(easy_below, hard_above)
    require_columns(candidates, ("task_id", "reasoning_tokens"), f"candidates of difficulty model {model!r}")
    unknown = sorted(set(candidates["task_id"]) - set(tasks["task_id"]))
    if unknown:
        raise ValueError(f"candidates of difficulty model {model!r}: task_id {unknown[0]!r} is not in the tasks table")
    per_task = (
        candidates.groupby("task_id", sort=True)["reasoning_tokens"].agg(n_samples="size", arl="mean").reset_index()
    )
    info = tasks.loc[:, ["task_id", "level", "category"]].drop_duplicates("task_id")
    table = per_task.merge(info, on="task_id", how="left").assign(model=model)
    table["arl"] = table["arl"].astype(float)
    table["difficulty"] = difficulty_labels(table["arl"], easy_below, hard_above)
    return table.loc[:, DIFFICULTY_COLUMNS].astype({"level": "int64", "n_samples": "int64"})


# ---------------------------------------------------------------- the results table


def _level_groups(scores: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(scope, group, column prefix) of the table: each level in order, then every task."""
    levels = sorted(scores.loc[scores["scope"] == "level", "group"].unique(), key=lambda g: (len(g), g))
    return [("level", lv, f"L{lv}") for lv in levels] + [("overall", "all", "all")]


def _table_metrics(pass_k) -> list[tuple[str, str]]:
    """(scores.csv column, table label) pairs: Exec@k for every k, then fast_1@k."""
    fast = fast_name(TABLE_FAST_P)
    return [(f"pass@{k}", f"exec@{k}") for k in pass_k] + [(f"{fast}@{k}", f"{fast}@{k}") for k in pass_k]


def results_table(scores: pd.DataFrame, pass_k, models: dict[str, dict] | None = None) -> pd.DataFrame:
    """The paper's layout: one row per model (kind, generator), per level and over all tasks Exec@k and fast_1@k
    for each k (fractions; NaN where no task of the group has k samples). Columns `{L1,L2,…,all}_{metric}`."""
    models = models or {}
    metrics = _table_metrics(pass_k)
    missing = [col for col, _ in metrics if col not in scores.columns]
    if missing:
        raise ValueError(
            f"results table: scores lack {', '.join(missing)} (evaluate.fast_p must include {TABLE_FAST_P})"
        )
    groups = _level_groups(scores)
    rows = []
    for model in dict.fromkeys(scores["model"]):
        info = models.get(model, {})
        row = {"model": model, "kind": info.get("kind", ""), "generator": info.get("generator", "")}
        mine = scores[scores["model"] == model]
        for scope, group, prefix in groups:
            match = mine[(mine["scope"] == scope) & (mine["group"] == group)]
            for col, label in metrics:
                row[f"{prefix}_{label}"] = float(match[col].iloc[0]) if len(match) else math.nan
        rows.append(row)
    columns = ["model", "kind", "generator"] + [f"{p}_{label}" for _, _, p in groups for _, label in metrics]
    return pd.DataFrame(rows, columns=columns)


def _percent(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * value:.1f}"


def _label(metric: str) -> str:
    return metric.replace("exec@", "Exec@")


def _markdown_grid(scores: pd.DataFrame, groups: list[tuple[str, str, str]], metrics, models) -> list[str]:
    header = ["model", "kind"] + [f"{title} {_label(label)}" for _, _, title in groups for _, label in metrics]
    lines = ["| " + " | ".join(header) + " |", "|---|---" + "|---:" * (len(header) - 2) + "|"]
    for model in dict.fromkeys(scores["model"]):
        mine = scores[scores["model"] == model]
        cells = [str(model), models.get(model, {}).get("kind", "")]
        for scope, group, _ in groups:
            match = mine[(mine["scope"] == scope) & (mine["group"] == group)]
            cells += [_percent(match[col].iloc[0]) if len(match) else "–" for col, _ in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    counts = scores.drop_duplicates(["scope", "group"]).set_index(["scope", "group"])["n_tasks"]
    lines += [
        "",
        "Tasks: "
        + ", ".join(
            f"{title} {int(counts[(scope, group)])}" for scope, group, title in groups if (scope, group) in counts.index
        ),
    ]
    return lines


def table_markdown(
    scores: pd.DataFrame,
    settings: dict,
    models: dict[str, dict] | None = None,
    difficulty: pd.DataFrame | None = None,
    thresholds: dict | None = None,
) -> str:
    """eval/table.md: the results table (models x levels x Exec@k/fast_1@k), then the same by difficulty and
    by category."""
    models = models or {}
    if scores.empty:
        return "# Evaluation results\n\nNo evaluation scores.\n"
    settings = config.with_defaults("evaluate", settings)
    metrics = _table_metrics(settings["pass_k"])
    fast = fast_name(TABLE_FAST_P)
    lines = [
        "# Evaluation results",
        "",
        f"Values in %. Exec@k: unbiased pass@k of a correct kernel; {fast}@k: of a correct kernel faster than "
        f"PyTorch eager (speedup > {TABLE_FAST_P}); each the mean over tasks of the per-task estimate from "
        f"{settings['samples']} samples per task at temperature {settings['temperature']}; "
        "– where no task of the group has k samples. L1, L2, …: KernelBench levels. Every number is in "
        "eval/scores.csv; this table is eval/table.csv.",
        "",
    ]
    lines += _markdown_grid(
        scores, [(s, g, "All" if g == "all" else p) for s, g, p in _level_groups(scores)], metrics, models
    )
    by_difficulty = [
        ("difficulty", band, band)
        for band in DIFFICULTIES
        if ((scores["scope"] == "difficulty") & (scores["group"] == band)).any()
    ]
    if by_difficulty:
        ref = difficulty["model"].iloc[0] if difficulty is not None and len(difficulty) else "?"
        easy, hard = (
            f"{float(v):g}" if v is not None else "?"
            for v in ((thresholds or {}).get("easy_below"), (thresholds or {}).get("hard_above"))
        )
        lines += [
            "",
            "## By difficulty",
            "",
            f"A task's difficulty is the average reasoning length (ARL) of model `{ref}`'s samples for it: "
            f"Easy < {easy} ≤ Medium ≤ {hard} < Hard tokens (eval/difficulty.csv).",
            "",
        ]
        lines += _markdown_grid(scores, by_difficulty, metrics, models)
    categories = [("category", c, c) for c in sorted(scores.loc[scores["scope"] == "category", "group"].unique())]
    if categories:
        lines += ["", "## By category", ""] + _markdown_grid(scores, categories, metrics, models)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the stage


def run_scoring(
    verified_paths: dict,
    tasks_path,
    difficulty_path,
    settings: dict,
    thresholds: dict,
    models: dict[str, dict],
    outputs,
) -> None:
    """Score every model's eval verdicts. `outputs` has .csv (scores.csv), .table_csv, .table_md and .difficulty;
    `difficulty_path` is the difficulty model's eval candidates; `models` maps each model to its kind and
    generator."""
    from concur.io import write_csv, write_text

    settings = config.with_defaults("evaluate", settings)
    thresholds = config.with_defaults("analyze", thresholds)
    tasks = pd.read_parquet(tasks_path)
    ref = settings["difficulty_model"]
    difficulty = task_difficulty(
        pd.read_parquet(difficulty_path), tasks, ref, float(thresholds["easy_below"]), float(thresholds["hard_above"])
    )
    scores = score(
        {model: pd.read_parquet(path) for model, path in verified_paths.items()}, tasks, settings, difficulty
    )
    table = results_table(scores, list(settings["pass_k"]), models)
    for frame, path in ((scores, outputs.csv), (table, outputs.table_csv), (difficulty, outputs.difficulty)):
        write_csv(frame, path)
    write_text(table_markdown(scores, settings, models, difficulty, thresholds), outputs.table_md)
    overall = scores[scores["scope"] == "overall"]
    log.info(
        "eval scores (exec, overall): %s; difficulty from %s: %s",
        dict(zip(overall["model"], overall["exec"])),
        ref,
        difficulty["difficulty"].value_counts().to_dict(),
    )

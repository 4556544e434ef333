"""Score evaluation verdicts: eval/scores.csv (contract 7 of docs/data.md) and its paper-style Markdown table.

Definitions, per model and group of tasks:
* ``exec``: correct samples / all samples.
* ``fast_{p}``: share of samples that are correct with speedup STRICTLY greater than p (fast_0: correct and > 0).
* ``pass@{k}`` / ``fast_{p}@{k}``: unbiased pass@k per task, averaged over tasks. A task with fewer than k
  samples has no pass@k estimate (NaN) and is left out of the mean; the mean is NaN when no task has k samples.
* ``mean_speedup`` / ``geomean_speedup``: over correct samples with a measured speedup; NaN when none.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from concur.metrics import geomean, pass_at_k

SCOPES = ("overall", "level", "category")


def fast_name(p: float) -> str:
    return f"fast_{p:g}"


def score_columns(pass_k, fast_p) -> list[str]:
    """The scores.csv columns, in order."""
    return (["model", "scope", "group", "n_tasks", "n_samples", "exec"]
            + [f"pass@{k}" for k in pass_k]
            + [fast_name(p) for p in fast_p]
            + [f"{fast_name(p)}@{k}" for p in fast_p for k in pass_k]
            + ["mean_speedup", "geomean_speedup"])


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
        # NaN > p is False, so an unmeasured speedup never counts as fast
        flags[fast_name(p)] = correct & (speedup > p)
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


def _with_task_info(verdicts: pd.DataFrame, tasks: pd.DataFrame, model: str) -> pd.DataFrame:
    missing = [c for c in ("task_id", "correct", "speedup") if c not in verdicts.columns]
    if missing:
        raise ValueError(f"verdicts of model {model!r}: missing column(s) {', '.join(missing)}")
    unknown = sorted(set(verdicts["task_id"]) - set(tasks["task_id"]))
    if unknown:
        raise ValueError(f"verdicts of model {model!r}: task_id {unknown[0]!r} is not in the tasks table")
    info = tasks.loc[:, ["task_id", "level", "category"]].drop_duplicates("task_id")
    joined = verdicts.loc[:, ["task_id", "correct", "speedup"]].merge(info, on="task_id", how="left")
    return joined.astype({"correct": bool, "speedup": float, "level": "int64"})


def score(verdicts_by_model: dict[str, pd.DataFrame], tasks: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """One row per model x scope x group (overall/all, each level, each category), columns of `score_columns`."""
    pass_k = list(settings.get("pass_k", [1, 10]))
    fast_p = list(settings.get("fast_p", [0, 0.5, 0.8, 1, 1.5, 2]))
    rows = []
    for model, verdicts in verdicts_by_model.items():
        frame = _with_task_info(verdicts, tasks, model)
        groups = [("overall", "all", frame)]
        groups += [("level", str(level), part) for level, part in frame.groupby("level", sort=True)]
        groups += [("category", str(cat), part) for cat, part in frame.groupby("category", sort=True)]
        for scope, group, part in groups:
            rows.append({"model": model, "scope": scope, "group": group, **_group_scores(part, pass_k, fast_p)})
    columns = score_columns(pass_k, fast_p)
    table = pd.DataFrame(rows, columns=columns)
    return table.astype({"n_tasks": "int64", "n_samples": "int64"})


def _percent(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * value:.1f}"


def scores_markdown(scores: pd.DataFrame) -> str:
    """Paper-style table: one row per model, a column group (Exec, fast_1, pass@k...) per level and overall."""
    if scores.empty:
        return "# Evaluation scores\n\nNo evaluation scores.\n"
    metrics = ["exec"] + (["fast_1"] if "fast_1" in scores.columns else [])
    metrics += [c for c in scores.columns if c.startswith("pass@")]
    labels = {"exec": "Exec", "fast_1": "fast_1"}
    level_rows = scores[scores["scope"] == "level"]
    levels = sorted(level_rows["group"].unique(), key=lambda g: (len(g), g))
    groups = [("level", lv, f"L{lv}") for lv in levels] + [("overall", "all", "All")]

    header = ["model"] + [f"{short} {labels.get(m, m)}" for _, _, short in groups for m in metrics]
    lines = ["# Evaluation scores", "",
             "Values in % (Exec: correct samples; fast_1: correct and faster than PyTorch eager; pass@k: unbiased, "
             "mean over tasks; – where no task of the group has k samples). L1/L2/L3: KernelBench levels.", "",
             "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for model in dict.fromkeys(scores["model"]):
        cells = [str(model)]
        for scope, group, _ in groups:
            match = scores[(scores["model"] == model) & (scores["scope"] == scope) & (scores["group"] == group)]
            for m in metrics:
                cells.append(_percent(match[m].iloc[0]) if len(match) else "–")
        lines.append("| " + " | ".join(cells) + " |")
    counts = scores[(scores["scope"].isin(["level", "overall"]))].drop_duplicates(["scope", "group"])
    lines += ["", "Tasks per group: " + ", ".join(
        f"{short} {int(counts[(counts['scope'] == s) & (counts['group'] == g)]['n_tasks'].iloc[0])}"
        for s, g, short in groups if len(counts[(counts['scope'] == s) & (counts['group'] == g)])), ""]
    return "\n".join(lines)


def run_generation(tasks_path, adapter_dir, model_name: str, generator_name: str, generator: dict, model_specs: dict,
                   settings: dict, language: str, out_path) -> None:
    """Eval generation for one model: the base generator, or the base generator with a trained adapter.
    Resumable like synthesis: a checkpoint next to `out_path` (see concur.synthesize)."""
    from concur.synthesize import checkpoint_path, generate_candidates, write_candidates

    label = generator_name if model_name == "base" else f"{generator_name}+{model_name}"
    frame = generate_candidates(pd.read_parquet(tasks_path), label, generator, model_specs, settings, language,
                                settings["samples"], adapter=adapter_dir, checkpoint=checkpoint_path(out_path))
    write_candidates(frame, out_path)


def run_scoring(verified_paths: dict, tasks_path, settings: dict, csv_path, markdown_path) -> None:
    """Score every model's eval verdicts into scores.csv and scores.md."""
    from concur.io import atomic_path, write_text

    scores = score({model: pd.read_parquet(path) for model, path in verified_paths.items()},
                   pd.read_parquet(tasks_path), settings)
    with atomic_path(csv_path) as tmp:
        scores.to_csv(tmp, index=False)
    write_text(scores_markdown(scores), markdown_path)

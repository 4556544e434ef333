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

Turns (``evaluate.turns``): a sample is a trajectory of versions. Turn ``k``'s scores take each trajectory's version
after turn k (its last one up to k: a trajectory that stopped keeps its final version); ``best`` takes each
trajectory's best version (correct before incorrect, then the largest speedup, then the earliest turn). With one
turn there is only turn ``1``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from concur import config, contracts
from concur.contracts import require_columns
from concur.metrics import DIFFICULTIES, check_thresholds, difficulty_labels, geomean, pass_at_k

log = logging.getLogger(__name__)

SCOPES = ("overall", "level", "category", "difficulty")
DIFFICULTY_COLUMNS = ["task_id", "level", "category", "model", "n_samples", "arl", "difficulty"]
TABLE_FAST_P = 1


def fast_name(p: float) -> str:
    return f"fast_{p:g}"


def score_columns(pass_k, fast_p, baselines=()) -> list[str]:
    """The scores.csv columns, in order: fast_p over eager, then over each other baseline timed
    (`fast_{p}_{baseline}`, e.g. fast_1_compile: verify.baselines)."""
    suffixes = [""] + [_suffix(b) for b in baselines]
    return (
        ["model", "turn", "scope", "group", "n_tasks", "n_samples", "exec"]
        + [f"pass@{k}" for k in pass_k]
        + [fast_name(p) + s for s in suffixes for p in fast_p]
        + [f"{fast_name(p)}{s}@{k}" for s in suffixes for p in fast_p for k in pass_k]
        + ["mean_speedup", "geomean_speedup"]
    )


def _suffix(baseline: str) -> str:
    """What a baseline's scores add to fast_p's name: `_compile`, `_compile_max_autotune`, …"""
    return contracts.speedup_column(baseline).removeprefix("speedup")


def timed_baselines(frame: pd.DataFrame) -> list[str]:
    """The baselines besides eager that some verdict of `frame` has a speedup over (verify.baselines)."""
    return [
        b
        for b in contracts.COMPILE_BASELINES
        if contracts.speedup_column(b) in frame.columns and frame[contracts.speedup_column(b)].notna().any()
    ]


def _mean_pass_at_k(per_task: pd.DataFrame, success: str, k: int) -> float:
    """Mean over tasks of pass@k; tasks with fewer than k samples are skipped."""
    estimates = [pass_at_k(int(n), int(c), k) for n, c in zip(per_task["n"], per_task[success]) if n >= k]
    return float(np.mean(estimates)) if estimates else math.nan


def _group_scores(frame: pd.DataFrame, pass_k, fast_p, baselines=()) -> dict:
    correct = frame["correct"].to_numpy(dtype=bool)
    speedup = frame["speedup"].to_numpy(dtype=float)
    row: dict = {"n_tasks": int(frame["task_id"].nunique()), "n_samples": len(frame)}
    row["exec"] = float(correct.mean()) if len(frame) else math.nan

    flags = frame[["task_id"]].assign(ok=correct)
    over = [("", speedup)] + [(_suffix(b), frame[contracts.speedup_column(b)].to_numpy(dtype=float)) for b in baselines]
    for suffix, times in over:
        for p in fast_p:
            # NaN > p is False: an unmeasured speedup (timing:unresolved) never counts as fast, but as fast_0 (> 0)
            flags[fast_name(p) + suffix] = correct & ((times > p) | ((p <= 0) & np.isnan(times)))
    per_task = flags.groupby("task_id").agg(n=("ok", "size"), **{col: (col, "sum") for col in flags.columns[1:]})

    for k in pass_k:
        row[f"pass@{k}"] = _mean_pass_at_k(per_task, "ok", k)
    for suffix, _ in over:
        for p in fast_p:
            row[fast_name(p) + suffix] = float(flags[fast_name(p) + suffix].mean()) if len(frame) else math.nan
    for suffix, _ in over:
        for p in fast_p:
            for k in pass_k:
                row[f"{fast_name(p)}{suffix}@{k}"] = _mean_pass_at_k(per_task, fast_name(p) + suffix, k)

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
    extra = ("sample_idx", "turn", *(contracts.speedup_column(b) for b in contracts.COMPILE_BASELINES))
    keep = ["task_id", "correct", "speedup"] + [c for c in extra if c in verdicts.columns]
    joined = verdicts.loc[:, keep].merge(info, on="task_id", how="left")
    return joined.astype({"correct": bool, "speedup": float, "level": "int64"})


def turn_states(frame: pd.DataFrame, turns: int, model: str = "") -> list[tuple[str, pd.DataFrame]]:
    """(turn label, one row per trajectory) to score: with one turn ("1", frame); with more, each trajectory's
    version after turn 1, 2, … (its last version up to that turn), then its best version ("best")."""
    if turns <= 1:
        return [("1", frame)]
    require_columns(frame, ("sample_idx", "turn"), f"verdicts of model {model!r} (evaluate.turns {turns})")
    ordered = frame.sort_values(["task_id", "sample_idx", "turn"], kind="stable")
    states = []
    for turn in range(1, turns + 1):
        upto = ordered[ordered["turn"] <= turn]
        states.append((str(turn), upto.drop_duplicates(["task_id", "sample_idx"], keep="last")))
    ranked = ordered.assign(_speed=ordered["speedup"].fillna(-np.inf))
    ranked = ranked.sort_values(
        ["task_id", "sample_idx", "correct", "_speed", "turn"], ascending=[True, True, False, False, True]
    )
    states.append(("best", ranked.drop_duplicates(["task_id", "sample_idx"]).drop(columns="_speed")))
    return states


def score(
    verdicts_by_model: dict[str, pd.DataFrame],
    tasks: pd.DataFrame,
    settings: dict,
    difficulty: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per model x turn x scope x group, columns of `score_columns`: overall/all, each level, each category
    and, with a `difficulty` table (task_id, difficulty), each difficulty band that has tasks (Easy, Medium, Hard).
    With `evaluate.turns` > 1 each model's verdicts carry `sample_idx` and `turn` (`trajectory_verdicts`) and are
    scored after every turn and for the best version of each trajectory (`turn_states`)."""
    settings = config.with_defaults("evaluate", settings)
    pass_k, fast_p = list(settings["pass_k"]), list(settings["fast_p"])
    timed = {b for verdicts in verdicts_by_model.values() for b in timed_baselines(verdicts)}
    baselines = [b for b in contracts.COMPILE_BASELINES if b in timed]
    rows = []
    for model, verdicts in verdicts_by_model.items():
        whole = _with_task_info(verdicts, tasks, model, difficulty)
        for turn, frame in turn_states(whole, int(settings["turns"]), model):
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
                scores = _group_scores(part, pass_k, fast_p, baselines)
                rows.append({"model": model, "turn": turn, "scope": scope, "group": group, **scores})
    columns = score_columns(pass_k, fast_p, baselines)
    table = pd.DataFrame(rows, columns=columns)
    return table.astype({"n_tasks": "int64", "n_samples": "int64", "turn": str})


def trajectory_verdicts(verdicts: list[pd.DataFrame], candidates: list[pd.DataFrame], model: str) -> pd.DataFrame:
    """One model's verdicts of turns 1, 2, … (in that order) with each candidate's `sample_idx` and `turn`, from
    the candidates of the same turns."""
    if len(candidates) != len(verdicts):
        raise ValueError(f"model {model!r}: {len(verdicts)} turns of verdicts but {len(candidates)} of candidates")
    parts = []
    for turn, (verdict, cands) in enumerate(zip(verdicts, candidates), 1):
        require_columns(cands, ("candidate_id", "sample_idx"), f"turn {turn} candidates of model {model!r}")
        joined = verdict.merge(cands.loc[:, ["candidate_id", "sample_idx"]], on="candidate_id", how="left")
        if joined["sample_idx"].isna().any():
            missing = joined.loc[joined["sample_idx"].isna(), "candidate_id"].iloc[0]
            raise ValueError(f"model {model!r}: turn {turn} verdict {missing!r} has no candidate")
        parts.append(joined.assign(turn=turn))
    return pd.concat(parts, ignore_index=True).astype({"sample_idx": "int64"})


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


def _table_metrics(pass_k, columns=()) -> list[tuple[str, str]]:
    """(scores.csv column, table label) pairs: Exec@k for every k, then fast_1@k, then fast_1@k over each other
    baseline the scores have (`columns`: theirs)."""
    fast = fast_name(TABLE_FAST_P)
    over = [""] + [_suffix(b) for b in contracts.COMPILE_BASELINES if f"{fast}{_suffix(b)}@{pass_k[0]}" in columns]
    return [(f"pass@{k}", f"exec@{k}") for k in pass_k] + [
        (f"{fast}{s}@{k}", f"{fast}{s}@{k}") for s in over for k in pass_k
    ]


def _turn_labels(scores: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(scores["turn"].astype(str))) if "turn" in scores.columns else ["1"]


def _turn_suffix(turn: str, labels: list[str]) -> str:
    """A results-table column's turn: none with one turn, else `_turn{k}` or `_best`."""
    if len(labels) == 1:
        return ""
    return "_best" if turn == "best" else f"_turn{turn}"


def results_table(scores: pd.DataFrame, pass_k, models: dict[str, dict] | None = None) -> pd.DataFrame:
    """The paper's layout: one row per model (kind, generator), per level and over all tasks Exec@k and fast_1@k
    for each k (fractions; NaN where no task of the group has k samples). Columns `{L1,L2,…,all}_{metric}`; with
    several turns, one column per turn and best of trajectory: `{…}_{metric}_turn{k}`, `{…}_{metric}_best`."""
    models = models or {}
    metrics = _table_metrics(pass_k, scores.columns)
    missing = [col for col, _ in metrics if col not in scores.columns]
    if missing:
        raise ValueError(
            f"results table: scores lack {', '.join(missing)} (evaluate.fast_p must include {TABLE_FAST_P})"
        )
    groups = _level_groups(scores)
    turns = _turn_labels(scores)
    turn_of = scores["turn"].astype(str) if "turn" in scores.columns else pd.Series("1", index=scores.index)
    rows = []
    for model in dict.fromkeys(scores["model"]):
        info = models.get(model, {})
        row = {"model": model, "kind": info.get("kind", ""), "generator": info.get("generator", "")}
        for turn in turns:
            mine = scores[(scores["model"] == model) & (turn_of == turn)]
            for scope, group, prefix in groups:
                match = mine[(mine["scope"] == scope) & (mine["group"] == group)]
                for col, label in metrics:
                    value = float(match[col].iloc[0]) if len(match) else math.nan
                    row[f"{prefix}_{label}{_turn_suffix(turn, turns)}"] = value
        rows.append(row)
    columns = ["model", "kind", "generator"] + [
        f"{p}_{label}{_turn_suffix(turn, turns)}" for _, _, p in groups for _, label in metrics for turn in turns
    ]
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
    metrics = _table_metrics(settings["pass_k"], scores.columns)
    fast = fast_name(TABLE_FAST_P)
    turns = _turn_labels(scores)
    every_turn = scores
    if "turn" in scores.columns:  # the grids show the last turn; "By turn" every turn and best of trajectory
        last = [t for t in turns if t != "best"][-1]
        scores = scores[scores["turn"].astype(str) == last]
    turn_note = (
        f" After turn {len(turns) - 1} of trajectories of {len(turns) - 1} turns (the verifier's feedback between "
        "turns; each sample's version after its last turn): every turn under *By turn*."
        if len(turns) > 1
        else ""
    )
    lines = [
        "# Evaluation results",
        "",
        f"Values in %. Exec@k: unbiased pass@k of a correct kernel; {fast}@k: of a correct kernel faster than "
        f"PyTorch eager (speedup > {TABLE_FAST_P}; {fast}_compile…@k: over the reference under torch.compile in "
        "that inductor mode, where verify.baselines timed it); each the mean over tasks of the per-task estimate from "
        f"{settings['samples']} samples per task at temperature {settings['temperature']}; "
        "– where no task of the group has k samples. L1, L2, …: KernelBench levels. Every number is in "
        f"eval/scores.csv; this table is eval/table.csv.{turn_note}",
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
    if len(turns) > 1:
        lines += [
            "",
            "## By turn",
            "",
            "Every eval task, after each turn (each sample's version after that turn, or its last one when its "
            "trajectory stopped earlier) and for the best version of each trajectory (correct first, then the "
            "fastest).",
            "",
        ]
        lines += _turn_grid(every_turn, turns, metrics, models)
    return "\n".join(lines) + "\n"


def _turn_grid(scores: pd.DataFrame, turns: list[str], metrics, models) -> list[str]:
    """Models x (turn, metric) over every task."""
    titles = ["Best" if t == "best" else f"Turn {t}" for t in turns]
    header = ["model", "kind"] + [f"{title} {_label(label)}" for title in titles for _, label in metrics]
    lines = ["| " + " | ".join(header) + " |", "|---|---" + "|---:" * (len(header) - 2) + "|"]
    overall = scores[(scores["scope"] == "overall") & (scores["group"] == "all")]
    for model in dict.fromkeys(scores["model"]):
        cells = [str(model), models.get(model, {}).get("kind", "")]
        for turn in turns:
            match = overall[(overall["model"] == model) & (overall["turn"].astype(str) == turn)]
            cells += [_percent(match[col].iloc[0]) if len(match) else "–" for col, _ in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------- the stage


def run_scoring(
    verified_paths: dict,
    tasks_path,
    difficulty_path,
    settings: dict,
    thresholds: dict,
    models: dict[str, dict],
    outputs,
    candidate_paths: dict | None = None,
) -> None:
    """Score every model's eval verdicts. `verified_paths` maps each model to its verdicts file, or to a list of
    them, one per turn (turn 1 first); with several turns `candidate_paths` maps it to the candidates of the same
    turns. `outputs` has .csv (scores.csv), .table_csv, .table_md and .difficulty; `difficulty_path` is the
    difficulty model's eval candidates (turn 1); `models` maps each model to its kind and generator."""
    from concur.io import write_csv, write_text

    settings = config.with_defaults("evaluate", settings)
    thresholds = config.with_defaults("analyze", thresholds)
    tasks = pd.read_parquet(tasks_path)
    ref = settings["difficulty_model"]
    difficulty = task_difficulty(
        pd.read_parquet(difficulty_path), tasks, ref, float(thresholds["easy_below"]), float(thresholds["hard_above"])
    )
    verdicts = {}
    for model, paths in verified_paths.items():
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        if len(paths) != int(settings["turns"]):
            raise ValueError(f"model {model!r}: {len(paths)} verdict file(s) for evaluate.turns {settings['turns']}")
        if len(paths) == 1:
            verdicts[model] = pd.read_parquet(paths[0])
            continue
        cands = (candidate_paths or {}).get(model) or []
        verdicts[model] = trajectory_verdicts(
            [pd.read_parquet(p) for p in paths], [pd.read_parquet(p) for p in cands], model
        )
    scores = score(verdicts, tasks, settings, difficulty)
    table = results_table(scores, list(settings["pass_k"]), models)
    for frame, path in ((scores, outputs.csv), (table, outputs.table_csv), (difficulty, outputs.difficulty)):
        write_csv(frame, path)
    write_text(table_markdown(scores, settings, models, difficulty, thresholds), outputs.table_md)
    overall = scores[(scores["scope"] == "overall") & (scores["turn"] == str(settings["turns"]))]
    log.info(
        "eval scores (exec, overall): %s; difficulty from %s: %s",
        dict(zip(overall["model"], overall["exec"])),
        ref,
        difficulty["difficulty"].value_counts().to_dict(),
    )

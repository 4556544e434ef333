"""The tasks stage: sources -> checked, deduplicated, decontaminated train and eval tables and their reports; the
stable shard assignment of the tasks."""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path

import pandas as pd

from .. import config, contracts
from ..contamination import code_hash, contamination_report
from ..contracts import SPLITS
from ..io import write_csv, write_parquet
from ..logs import Progress
from .programs import TaskError
from .reference import Checker, validate_programs
from .sources import SOURCES

log = logging.getLogger("concur.tasks")

REPORT_COLUMNS = ["task_id", "source", "origin", "reason"]
OUTPUTS = ("train", "eval", "rejected", "unchecked", "contamination")
# The probe runs a reference ~correctness_trials + 1 times: only tasks whose one CPU run took at most this are probed
# here; the verify job probes every task again anyway.
PROBE_MAX_RUN_S = 2.0


def shard_of(task_id: str, n_shards: int) -> int:
    """Stable shard of a task: depends only on its id, so adding tasks never moves another."""
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % n_shards


def select_shard(tasks: pd.DataFrame, shard: int, n_shards: int) -> pd.DataFrame:
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is outside 0..{n_shards - 1}")
    keep = tasks["task_id"].map(lambda t: shard_of(t, n_shards) == shard)
    return tasks[keep].reset_index(drop=True)


def build_tasks(sources: list[dict], settings: dict | None = None, workers: int = 1) -> dict[str, pd.DataFrame]:
    """Train and eval tables plus the rejected, unchecked and contamination reports (the keys of `OUTPUTS`).

    `settings`: the config's `tasks` section (its defaults fill what is left out; `sources`, `shards` and `workers`
    are not read from it).
    """
    settings = config.with_defaults("tasks", settings)
    unknown = [src["kind"] for src in sources if src["kind"] not in SOURCES]
    if unknown:
        raise TaskError(f"task source kind {unknown[0]!r} is unknown (available: {', '.join(SOURCES)})")
    early = [Checker(start=True)] if settings["validate_run"] else []
    try:
        tasks, rejected = _load_sources(sources)
        tasks, duplicates = drop_duplicate_code(tasks)
    except BaseException:
        for checker in early:
            checker.close()
        raise
    tasks, failed, unchecked, unprobed = _validate(tasks, settings, workers, early)
    train, eval_ = (tasks[tasks["split"] == split] for split in SPLITS)
    report = contamination_report(train, eval_, settings["similarity_threshold"], settings["ngram"])
    if settings["drop_contaminated"]:
        train = train[~train["task_id"].isin(report["train_task_id"])]
    log.info(
        "tasks: %d train, %d eval; %d rejected, %d duplicates, %d not run, %d contaminated train tasks%s",
        len(train),
        len(eval_),
        len(rejected) + len(failed),
        len(duplicates),
        len(unchecked),
        report["train_task_id"].nunique(),
        " (dropped)" if settings["drop_contaminated"] else "",
    )
    train = contracts.conform(train, contracts.TASKS, "tasks/train")
    eval_ = contracts.conform(eval_, contracts.TASKS, "tasks/eval")
    if settings["validate_run"]:
        train, eval_ = flag_degenerate([train, eval_], unprobed, settings, workers)
    return {
        "train": train,
        "eval": eval_,
        "rejected": pd.DataFrame(rejected + duplicates + failed, columns=REPORT_COLUMNS),
        "unchecked": pd.DataFrame(unchecked, columns=REPORT_COLUMNS),
        "contamination": report,
    }


def flag_degenerate(frames: list[pd.DataFrame], skip: set[str], settings: dict, workers: int) -> list[pd.DataFrame]:
    """Add `degenerate` (a trivial output — zeros, an input, a constant — passes the task's check, so its verdicts
    prove little) and `degenerate_outputs` (which ones), probed once per task on the CPU with the verifier's check.
    Tasks in `skip` are not probed: `degenerate` is <NA> (unknown) and `degenerate_outputs` empty."""
    from ..verify import normalize_settings, probe_tasks

    probe_settings = normalize_settings(
        {"device": "cpu", "workers": max(1, workers), "timeout_s": settings["validate_timeout_s"]}
    )
    references = {t: c for f in frames for t, c in zip(f["task_id"], f["code"]) if t not in skip}
    precisions = {t: p for f in frames if "precision" in f.columns for t, p in zip(f["task_id"], f["precision"])}
    progress = Progress(log, "probed", "tasks", len(references), ["degenerate", "not degenerate"])
    with tempfile.TemporaryDirectory(prefix="concur-probe-") as workdir:
        kinds = probe_tasks(
            references,
            probe_settings,
            Path(workdir),
            lambda _, k: progress.add("degenerate" if k else "not degenerate"),
            precisions,
        )
    progress.finish()
    flagged = []
    for frame in frames:
        found = [kinds.get(t) for t in frame["task_id"]]
        degenerate = pd.array([pd.NA if k is None else bool(k) for k in found], dtype="boolean")
        flagged.append(frame.assign(degenerate=degenerate, degenerate_outputs=["+".join(k or []) for k in found]))
    unprobed = sum(t not in kinds for f in frames for t in f["task_id"])
    log.info(
        "degenerate tasks: %s; %d tasks not probed here", sorted(t for t, k in kinds.items() if k) or "none", unprobed
    )
    return flagged


def _load_sources(sources: list[dict]) -> tuple[pd.DataFrame, list[dict]]:
    rows, rejected = [], []
    for source in sources:
        loaded, refused = SOURCES[source["kind"]](source)
        loaded = [{**row, "precision": source.get("precision") or "fp32"} for row in loaded]
        log.info("source %s %s: %d programs, %d rejected", source["kind"], source["path"], len(loaded), len(refused))
        rows += loaded
        rejected += refused
    tasks = pd.DataFrame(rows, columns=list(contracts.TASKS))
    dupes = tasks.loc[tasks["task_id"].duplicated(), "task_id"].tolist()
    if dupes:
        raise TaskError(f"duplicate task ids across sources: {', '.join(dupes[:5])}")
    return tasks.sort_values("task_id", kind="stable", ignore_index=True), rejected


def drop_duplicate_code(tasks: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Keep the first task (by id) of each split with a given normalised code; the others are reported."""
    hashes = tasks["code"].map(code_hash)
    first = {}
    keep, duplicates = [], []
    for task, key in zip(tasks.itertuples(index=False), hashes):
        kept = first.setdefault((task.split, key), task.task_id)
        keep.append(kept == task.task_id)
        if kept != task.task_id:
            duplicates.append(_report_row(task, f"duplicate of {kept} (same normalised code)"))
    return tasks[keep].reset_index(drop=True), duplicates


def _validate(
    tasks: pd.DataFrame, settings: dict, workers: int, started: list
) -> tuple[pd.DataFrame, list[dict], list[dict], set[str]]:
    """Check every reference once: failures are rejected; programs checked on the meta device only, or too big or
    slow for the CPU, are kept but listed. Also the ids not to probe (not run to the end, or slow)."""
    if not settings["validate_run"]:
        unchecked = [_report_row(t, "not run: validate_run is false") for t in tasks.itertuples(index=False)]
        return tasks, [], unchecked, set(tasks["task_id"])
    verdicts = validate_programs(
        tasks["code"].tolist(),
        settings["validate_timeout_s"],
        settings["max_input_mb"],
        settings["validate_max_gflop"],
        workers,
        started,
    )
    keep, failed, unchecked, unprobed = [], [], [], set()
    for task, verdict in zip(tasks.itertuples(index=False), verdicts):
        keep.append(verdict["status"] != "rejected")
        if verdict["status"] == "rejected":
            reason = verdict["reason"] if verdict.get("ran") else f"reference does not run: {verdict['reason']}"
            failed.append(_report_row(task, reason))
        elif verdict["status"] == "meta_only":
            unchecked.append(_report_row(task, verdict["reason"]))
        elif verdict["status"] != "ok":
            unchecked.append(_report_row(task, f"not run to the end: {verdict['reason']}"))
        if verdict["status"] != "ok" or verdict["seconds"] > PROBE_MAX_RUN_S:
            unprobed.add(task.task_id)
    return tasks[keep].reset_index(drop=True), failed, unchecked, unprobed


def _report_row(task, reason: str) -> dict:
    return {"task_id": task.task_id, "source": task.suite, "origin": task.origin, "reason": reason}


def run(sources: list[dict], out_paths: dict[str, str], settings: dict | None = None, workers: int = 1) -> None:
    """The `tasks` stage: `out_paths` names where each of `OUTPUTS` goes (tasks/{train,eval}.parquet and the
    rejected, unchecked and contamination CSVs); every one of them is written."""
    missing = [name for name in OUTPUTS if name not in out_paths]
    if missing:
        raise ValueError(f"tasks: no output path for {', '.join(missing)}")
    for name, frame in build_tasks(sources, settings, workers).items():
        if name in SPLITS:
            write_parquet(frame, out_paths[name])
        else:
            write_csv(frame, out_paths[name])

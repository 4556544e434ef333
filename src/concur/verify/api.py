"""The verifier's public functions (re-exported by concur.verify): tables in, tables out."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pandas as pd

from concur import contracts
from concur.io import write_parquet, write_text
from concur.verify import compiling, orchestrate
from concur.verify import settings as verify_settings
from concur.verify.orchestrate import Job, cache_root_of, device_label
from concur.verify.report import Report
from concur.verify.settings import BUILD, PROBE, REFEREE, VerifySettings
from concur.verify.verdict import before_run, blank, decide, mark_task_trust

log = logging.getLogger("concur.verify")
TRACE_SINK = None  # when set, jobs are traced and it is called with (candidate_id, report) for each (benchmarks)
Settings = VerifySettings | dict | None  # a dict: some keys of the `verify` section, the schema's defaults for the rest


def normalize_settings(settings: Settings, for_compile: bool = False) -> dict:
    """The plain dict the verifier's modules read (concur.verify.settings.normalize)."""
    return verify_settings.normalize(settings, for_compile)


def compile_frame(
    candidates: pd.DataFrame,
    settings: Settings,
    workdir: Path,
    progress: bool = True,
    tasks: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Build every candidate's extension into the build cache, in a pool of sandboxed builders (contracts.BUILDS).
    With `tasks`, each builder also makes ModelNew on its task's init inputs, so that what its __init__ loads is
    built too; without, only on the candidate's own get_init_inputs, where it has one. The builds see the BUILD
    settings only (and how many to run at once): what the compile rule's params hold is all a build can depend on."""
    settings = VerifySettings.of(settings).resolved(for_compile=True).to_dict(BUILD, plan=True)
    references = {} if tasks is None else reference_programs(tasks)
    jobs = []
    for i, r in enumerate(candidates.itertuples()):
        if tasks is not None and str(r.task_id) not in references:
            raise ValueError(f"candidate {r.candidate_id}: task {r.task_id!r} is not in the tasks frame")
        jobs.append(Job(i, str(r.candidate_id), str(r.task_id), references.get(str(r.task_id), ""), _code(r)))
    rows = orchestrate.run_builds(jobs, settings, Path(workdir), progress)
    frame = pd.DataFrame(
        [{"candidate_id": j.candidate_id, "task_id": j.task_id, **b} for j, b in zip(jobs, rows)],
        columns=list(contracts.BUILDS),
    )
    return contracts.conform(frame, contracts.BUILDS, "builds")


def verify_frame(
    candidates: pd.DataFrame,
    tasks: pd.DataFrame,
    settings: Settings,
    workdir: Path,
    progress: bool = True,
    builds: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One verdict per candidate, in input order (contracts.VERDICTS). With `builds`, candidates whose build already
    decided the verdict (no code, rejected, compile error, timeout) are not run again."""
    settings = normalize_settings(settings)
    references = reference_programs(tasks)
    build_rows = {} if builds is None else builds.set_index("candidate_id").to_dict("index")
    jobs = []
    for index, row in enumerate(candidates.itertuples(index=False)):
        if row.task_id not in references:
            raise ValueError(f"candidate {row.candidate_id}: task {row.task_id!r} is not in the tasks frame")
        jobs.append(
            Job(
                index,
                str(row.candidate_id),
                str(row.task_id),
                references[row.task_id],
                _code(row),
                build_rows.get(str(row.candidate_id)),
            )
        )
    verdicts, degenerate = run_jobs(jobs, settings, Path(workdir), progress, task_precisions(tasks))
    rows = []
    for job, verdict in zip(jobs, verdicts):
        mark_task_trust(verdict, degenerate.get(job.task_id, []))
        rows.append({"candidate_id": job.candidate_id, "task_id": job.task_id, **verdict})
    return contracts.conform(pd.DataFrame(rows, columns=list(contracts.VERDICTS)), contracts.VERDICTS, "verdicts")


def verify_one(reference_code: str, solution_code: str, settings: Settings, workdir: Path) -> dict:
    """The verdict for one solution against one reference program (VERDICTS keys minus the ids), with the task's
    `degenerate` flag: the trivial outputs (zeros, identity, constant, other inputs' output) that pass its check."""
    settings = normalize_settings(settings)
    verdicts, degenerate = run_jobs(
        [Job(0, "one", "one", reference_code, solution_code or "")], settings, Path(workdir), False
    )
    kinds = degenerate.get("one", [])
    if not kinds and verdicts[0]["status"] in ("no_code", "rejected", "compile_error"):
        kinds = probe_tasks({"one": reference_code}, settings, Path(workdir)).get("one", [])
    mark_task_trust(verdicts[0], kinds)
    return {**verdicts[0], "degenerate": bool(kinds), "degenerate_outputs": kinds}


def probe_tasks(
    references: dict[str, str], settings: Settings, workdir: Path, on_done=None, precisions: dict | None = None
) -> dict[str, list[str]]:
    """task_id -> the trivial outputs that pass its check (empty: the check is sound), run on the referees; cached
    per reference, precision and PROBE settings. `on_done(task_id, kinds)` is called as each task's answer comes
    (progress). `precisions`: task_id -> the precision it runs in (fp32 where not given), whose tolerance the check
    takes."""
    settings = normalize_settings(settings)
    precisions = precisions or {}
    cache = cache_root_of(settings, workdir) / "probes"
    cache.mkdir(parents=True, exist_ok=True)
    found, payloads = {}, []
    for task_id, code in sorted(references.items()):
        precision = precisions.get(task_id) or "fp32"
        cached = cache / f"{probe_key(code, settings, precision)}.json"
        if cached.exists():
            found[task_id] = json.loads(cached.read_text())
            if on_done is not None:
                on_done(task_id, found[task_id])
        else:
            payloads.append(
                {
                    "candidate_id": task_id,
                    "task_id": task_id,
                    "reference": code,
                    "solution": "",
                    "settings": {**job_settings(settings), "precision": precision},
                    "key": str(cached),
                }
            )

    def done(payload: dict, report: Report) -> None:
        kinds = report.degenerate
        found[payload["task_id"]] = kinds or []
        if kinds is not None:  # a failing reference: its candidates get runtime errors, nothing to flag
            write_text(json.dumps(kinds), Path(payload["key"]))
        if on_done is not None:
            on_done(payload["task_id"], kinds or [])

    if payloads:
        orchestrate.evaluate_all(payloads, settings, cache_root_of(settings, workdir), False, done)
    return found


def probe_key(reference: str, settings: dict, precision: str = "fp32") -> str:
    """The probe cache's key: the reference program, its precision and the PROBE settings (resolved)."""
    values = [settings[key] for key in VerifySettings.keys(PROBE)]
    return hashlib.sha256(json.dumps([reference, precision, values]).encode()).hexdigest()[:32]


def run(candidates_path, tasks_path, settings: Settings, workdir, out_path, builds_path=None) -> None:
    """The verify rule: verdicts for one candidates file, written atomically."""
    candidates, tasks = pd.read_parquet(candidates_path), pd.read_parquet(tasks_path)
    builds = pd.read_parquet(builds_path) if builds_path else None
    verdicts = verify_frame(candidates, tasks, settings, Path(workdir), progress=True, builds=builds)
    write_parquet(verdicts, out_path)
    log.info("verdicts: %s", verdicts["status"].value_counts().to_dict())


def compile_run(candidates_path, settings: Settings, workdir, out_path, tasks_path=None) -> None:
    """The compile rule: build every candidate of one candidates file into the build cache (ModelNew made on the
    init inputs of its task in `tasks_path`)."""
    tasks = pd.read_parquet(tasks_path) if tasks_path else None
    builds = compile_frame(pd.read_parquet(candidates_path), settings, Path(workdir), progress=True, tasks=tasks)
    write_parquet(builds, out_path)
    log.info("builds: %s", builds["status"].value_counts().to_dict())


# ---------------------------------------------------------------- jobs and verdicts


def _code(row) -> str:
    return row.code if isinstance(row.code, str) else ""


def reference_programs(tasks: pd.DataFrame) -> dict[str, str]:
    missing = [c for c in ("task_id", "code") if c not in tasks.columns]
    if missing:
        raise ValueError(f"tasks frame: missing column(s) {', '.join(missing)}")
    return dict(zip(tasks["task_id"].astype(str), tasks["code"].astype(str)))


def task_precisions(tasks: pd.DataFrame) -> dict[str, str]:
    """task_id -> the precision it runs in (tasks' `precision`; fp32 for tables made before it)."""
    if "precision" not in tasks.columns:
        return {}
    return {str(t): str(p) for t, p in zip(tasks["task_id"], tasks["precision"]) if isinstance(p, str) and p}


def job_settings(settings: dict) -> dict:
    """What a job's referee reads of the settings (the REFEREE fields), as plain data: it crosses to that process."""
    return {key: settings[key] for key in VerifySettings.keys(REFEREE)}


def run_jobs(
    jobs: list[Job], settings: dict, workdir: Path, progress: bool, precisions: dict[str, str] | None = None
) -> tuple[list[dict], dict]:
    """Verdicts for `jobs` in order, and the degenerate outputs found per task. `precisions`: task_id -> the
    precision it runs in (fp32 where not given)."""
    precisions = precisions or {}
    label = device_label(settings["device"])
    verdicts: list[dict | None] = [None] * len(jobs)
    unbuilt = [j for j in jobs if j.build is None and before_run(j.solution, None, settings) is None]
    if unbuilt:  # builds always happen before a referee sees the candidate
        for job, row in zip(
            unbuilt,
            orchestrate.run_builds(
                [Job(i, j.candidate_id, j.task_id, j.reference, j.solution) for i, j in enumerate(unbuilt)],
                settings,
                workdir,
                progress,
            ),
        ):
            job.build = row
    to_run = []
    for job in jobs:
        early = before_run(job.solution, job.build, settings)
        if early is None:
            to_run.append(job)
            continue
        verdicts[job.index] = blank(*early, settings, label)
        verdicts[job.index]["compile_s"] = float((job.build or {}).get("compile_s") or 0.0)
    degenerate: dict[str, list[str]] = {}
    if to_run:
        cache_root = cache_root_of(settings, workdir)
        library = compiling.library_kernels(cache_root) if settings["device"] == "cuda" else set()
        by_id = {job.candidate_id: job for job in to_run}
        reported: set[str] = set()

        def done(payload: dict, report: Report) -> None:
            job = by_id[payload["candidate_id"]]
            in_precision = {**settings, "precision": payload["settings"]["precision"]}
            compile_s = (job.build or {}).get("compile_s") or 0.0
            verdicts[job.index] = decide(report, in_precision, job.solution, compile_s, label)
            report_baselines(job.task_id, report, reported)
            if TRACE_SINK is not None:
                TRACE_SINK(job.candidate_id, report)
            if report.degenerate is not None:
                kinds = set(degenerate.get(job.task_id, [])) | set(report.degenerate)
                degenerate[job.task_id] = sorted(kinds)

        payloads = [payload(job, settings, cache_root, library, precisions.get(job.task_id)) for job in to_run]
        orchestrate.evaluate_all(payloads, settings, cache_root, progress, done)
    return verdicts, degenerate  # type: ignore[return-value]


def payload(job: Job, settings: dict, cache_root: Path, library: set[str], precision: str | None = None) -> dict:
    kernels = (job.build or {}).get("kernels") or ""
    own = None if not kernels else sorted(set(json.loads(kernels)) - library)
    return {
        "candidate_id": job.candidate_id,
        "task_id": job.task_id,
        "reference": job.reference,
        "solution": job.solution,
        "build_dir": str(cache_root / job.build["cache_key"]),
        "kernels": own,
        "settings": {**job_settings(settings), "precision": precision or "fp32"},
        "trace": TRACE_SINK is not None,
    }


def report_baselines(task_id: str, report: Report, reported: set[str]) -> None:
    """Log, once per task, what compiling its reference under each baseline cost, or why that baseline failed."""
    if task_id in reported or not report.baselines:
        return
    reported.add(task_id)
    for name, found in report.baselines.items():
        if found.error:
            log.warning("task %s: baseline %s failed, its speedups are NaN: %s", task_id, name, found.error)
        else:
            log.info("task %s: baseline %s compiled in %.1f s", task_id, name, found.compile_s)

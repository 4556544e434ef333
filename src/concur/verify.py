"""Verify candidate kernels: each in its own process (hard timeout), facts from the child, verdict decided here.

`verify_frame` turns a candidates frame into a verdicts frame (docs/data.md section 4); `verify_one` checks a single
solution against a reference program. The child (`verify_child.py`) builds the solution with load_inline into a
content-addressed build cache and reports raw facts (compiled?, per-trial checks, timings) in a nonce-stamped JSON.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from concur import contracts
from concur.screen import screen

log = logging.getLogger(__name__)

CHILD_SCRIPT = Path(__file__).with_name("verify_child.py")
NONCE_ENV = "CONCUR_VERIFY_NONCE"
DEFAULT_SETTINGS = {
    "device": "auto",
    "mode": "kernelbench",
    "timeout_s": 300,
    "workers": 2,
    "correctness_trials": 5,
    "warmup": 3,
    "timing_trials": 100,
    "atol": 1.0e-2,
    "rtol": 1.0e-2,
}
MEMORY_LIMIT_MB = 16 * 1024  # address-space limit of a CPU child (gcc included); CUDA children get none
PCH_TIMEOUT_S = 900
BUILD_ENV_KEYS = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME")
VERDICT_FIELDS = [c for c in contracts.VERDICTS if c not in ("candidate_id", "task_id")]


@dataclass
class Job:
    index: int
    candidate_id: str
    task_id: str
    reference: str
    solution: str


@dataclass
class ChildOutcome:
    returncode: int | None
    timed_out: bool
    facts: dict | None
    wall_s: float


# ---------------------------------------------------------------- public API


def verify_frame(
    candidates: pd.DataFrame, tasks: pd.DataFrame, settings: dict, workdir: Path, progress: bool = True
) -> pd.DataFrame:
    """One verdict per candidate, in input order (contracts.VERDICTS)."""
    settings = normalize_settings(settings)
    references = reference_programs(tasks)
    jobs = []
    for index, row in enumerate(candidates.itertuples(index=False)):
        if row.task_id not in references:
            raise ValueError(f"candidate {row.candidate_id}: task {row.task_id!r} is not in the tasks frame")
        code = row.code if isinstance(row.code, str) else ""
        jobs.append(Job(index, str(row.candidate_id), str(row.task_id), references[row.task_id], code))
    verdicts = run_jobs(jobs, settings, Path(workdir), progress)
    rows = [{"candidate_id": j.candidate_id, "task_id": j.task_id, **v} for j, v in zip(jobs, verdicts)]
    frame = pd.DataFrame(rows, columns=list(contracts.VERDICTS))
    return contracts.conform(frame, contracts.VERDICTS, "verdicts")


def verify_one(reference_code: str, solution_code: str, settings: dict, workdir: Path) -> dict:
    """The verdict for one solution against one reference program (VERDICTS keys minus the ids)."""
    settings = normalize_settings(settings)
    job = Job(0, "one", "one", reference_code, solution_code or "")
    return run_jobs([job], settings, Path(workdir), progress=False)[0]


# ---------------------------------------------------------------- settings and inputs


def normalize_settings(settings: dict) -> dict:
    merged = {**DEFAULT_SETTINGS, **(settings or {})}
    if merged["mode"] not in ("kernelbench", "hardened"):
        raise ValueError(f"verify.mode must be kernelbench or hardened, got {merged['mode']!r}")
    if merged["device"] not in ("auto", "cpu", "cuda"):
        raise ValueError(f"verify.device must be auto, cpu or cuda, got {merged['device']!r}")
    merged["device"] = resolve_device(merged["device"])
    if int(merged["workers"]) < 1 or float(merged["timeout_s"]) <= 0:
        raise ValueError("verify.workers must be >= 1 and verify.timeout_s > 0")
    return merged


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("verify.device is cuda but torch sees no CUDA device")
    return name


def device_label(device: str) -> str:
    if device == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(0)}"
    return "cpu"


def reference_programs(tasks: pd.DataFrame) -> dict[str, str]:
    missing = [c for c in ("task_id", "code") if c not in tasks.columns]
    if missing:
        raise ValueError(f"tasks frame: missing column(s) {', '.join(missing)}")
    return dict(zip(tasks["task_id"].astype(str), tasks["code"].astype(str)))


# ---------------------------------------------------------------- orchestration


def run_jobs(jobs: list[Job], settings: dict, workdir: Path, progress: bool) -> list[dict]:
    """Verdicts for `jobs` in order: cheap decisions here, the rest in a pool of child processes."""
    verdicts: list[dict | None] = [None] * len(jobs)
    label = device_label(settings["device"])
    to_run = []
    for job in jobs:
        verdicts[job.index] = pre_verdict(job, settings, label)
        if verdicts[job.index] is None:
            to_run.append(job)
    if to_run:
        workdir.mkdir(parents=True, exist_ok=True)
        cache_root = Path(settings.get("build_cache") or workdir / "build-cache")
        cache_root.mkdir(parents=True, exist_ok=True)
        if settings["device"] == "cpu" and any(needs_build(job, settings, cache_root) for job in to_run):
            prepare_pch(settings, workdir)
        with ThreadPoolExecutor(max_workers=int(settings["workers"])) as pool:
            futures = {pool.submit(run_job, job, settings, workdir, cache_root): job for job in to_run}
            for future in _progress(as_completed(futures), len(futures), progress):
                job = futures[future]
                verdicts[job.index] = future.result()
    return verdicts  # type: ignore[return-value]


def _progress(iterable, total: int, enabled: bool):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc="verify", unit="cand", file=sys.stderr)


def pre_verdict(job: Job, settings: dict, label: str) -> dict | None:
    """The verdict when no process is needed (no code, or rejected by the static screen), else None."""
    if not job.solution.strip():
        return blank_verdict("no_code", "no code block in the answer", settings, label)
    if settings["mode"] == "hardened":
        findings = screen(job.solution)
        if findings:
            return blank_verdict("rejected", f"screen:{findings[0].rule}", settings, label)
    return None


def blank_verdict(status: str, reason: str, settings: dict, label: str) -> dict:
    nan = math.nan
    return {
        "status": status, "reason": reason, "compiled": False, "correct": False,
        "ref_ms": nan, "new_ms": nan, "ref_median_ms": nan, "new_median_ms": nan,
        "speedup": 0.0, "max_abs_err": nan, "device": label, "verify_mode": settings["mode"],
        "compile_s": 0.0, "eval_s": 0.0,
    }  # fmt: skip


def run_job(job: Job, settings: dict, workdir: Path, cache_root: Path) -> dict:
    key = build_cache_key(job.solution, settings["device"])
    job_dir = workdir / "jobs" / f"{job.index:06d}-{_safe(job.candidate_id)}"
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "reference.py").write_text(job.reference)
    (job_dir / "solution.py").write_text(job.solution)
    write_spec(job_dir, settings)
    build_dir = cache_root / key
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f"{key}.lock", "a") as key_lock:
        fcntl.flock(key_lock, fcntl.LOCK_EX)  # one child per build dir at a time, across threads and processes
        _remove_stale_batons(build_dir)
        outcome = run_child(job_dir, "all", settings, float(settings["timeout_s"]), build_dir)
    return decide_verdict(outcome, settings, device_label(settings["device"]))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]


def _remove_stale_batons(build_dir: Path) -> None:
    # torch's FileBaton left behind by a killed build would make the next load_inline wait forever
    for baton in build_dir.glob("*/lock"):
        baton.unlink(missing_ok=True)


def write_spec(job_dir: Path, settings: dict) -> None:
    spec = {k: settings[k] for k in ("device", "mode", "correctness_trials", "warmup", "timing_trials", "atol", "rtol")}
    spec["threads"] = thread_count(settings)
    spec["memory_limit_mb"] = MEMORY_LIMIT_MB if settings["device"] == "cpu" else None
    (job_dir / "job.json").write_text(json.dumps(spec))


def thread_count(settings: dict) -> int:
    """Threads per child so that `workers` concurrent children do not oversubscribe the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(settings["workers"]))


def build_cache_key(solution: str, device: str) -> str:
    """sha256 of everything that changes the built extension: code, torch/python versions, build env, device kind."""
    import torch

    env = {k: os.environ.get(k, "") for k in BUILD_ENV_KEYS}
    if device == "cuda" and not env["TORCH_CUDA_ARCH_LIST"]:
        env["cuda_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
    parts = [solution, torch.__version__, sys.version, json.dumps(env, sort_keys=True), device]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def needs_build(job: Job, settings: dict, cache_root: Path) -> bool:
    """Whether the child will probably run a C++ build: it calls load_inline/load and its cache holds no module."""
    if "cpp_extension" not in job.solution and "load_inline" not in job.solution:
        return False
    return not any((cache_root / build_cache_key(job.solution, settings["device"])).glob("*/*.so"))


def prepare_pch(settings: dict, workdir: Path) -> None:
    """Build torch's shared precompiled header once, in a single child, before parallel builds could race on it."""
    import torch

    if (Path(torch.__file__).resolve().parent / "include" / "torch" / "extension.h.gch").exists():
        return
    job_dir = workdir / "jobs" / "pch"
    job_dir.mkdir(parents=True, exist_ok=True)
    write_spec(job_dir, settings)
    outcome = run_child(job_dir, "pch", settings, max(PCH_TIMEOUT_S, float(settings["timeout_s"])), None)
    if not (outcome.facts and outcome.facts.get("complete")):
        log.warning("building the precompiled header failed (see %s); builds will be slower", job_dir / "child.log")


def child_env(settings: dict, build_dir: Path | None, nonce: str) -> dict:
    env = dict(os.environ)
    threads = str(thread_count(settings))
    env.update({NONCE_ENV: nonce, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "MAX_JOBS": threads})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if build_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(build_dir)
    if settings["device"] == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_child(job_dir: Path, phase: str, settings: dict, timeout_s: float, build_dir: Path | None) -> ChildOutcome:
    """Run the child in its own session; kill its whole process group on timeout (and afterwards, for strays)."""
    nonce = secrets.token_hex(16)
    result_path = job_dir / "result.json"
    result_path.unlink(missing_ok=True)
    start = time.perf_counter()
    with open(job_dir / "child.log", "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD_SCRIPT), str(job_dir), phase],
            cwd=job_dir, env=child_env(settings, build_dir, nonce),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)
        proc.wait()
    return ChildOutcome(proc.returncode, timed_out, read_facts(result_path, nonce), time.perf_counter() - start)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_facts(path: Path, nonce: str) -> dict | None:
    """The child's facts, only if the file parses and carries this run's nonce."""
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(facts, dict) or not secrets.compare_digest(str(facts.get("nonce", "")), nonce):
        return None
    return facts


# ---------------------------------------------------------------- verdict (decided here, from the child's facts)


def decide_verdict(outcome: ChildOutcome, settings: dict, label: str) -> dict:
    facts = outcome.facts or {}
    compile_facts = facts.get("compile") or {}
    verdict = blank_verdict("runtime_error", "", settings, facts.get("device") or label)
    verdict["compiled"] = bool(compile_facts.get("ok"))
    verdict["compile_s"] = float(compile_facts.get("seconds") or 0.0)
    verdict["eval_s"] = float(facts.get("eval_s") or 0.0)
    evaluate = facts.get("evaluate") or {}
    trials = evaluate.get("trials") or facts.get("trials") or []
    verdict["max_abs_err"] = _max_abs_err(trials)
    status, reason = classify(outcome, facts, compile_facts, evaluate, trials, settings)
    verdict.update(status=status, reason=_one_line(reason), correct=status == "correct")
    if status == "correct":
        verdict.update(timing_fields(evaluate))
    return verdict


def classify(outcome: ChildOutcome, facts, compile_facts, evaluate, trials, settings) -> tuple[str, str]:
    phase = "evaluate" if compile_facts.get("ok") else "compile"
    if outcome.timed_out:
        return "timeout", f"timeout after {settings['timeout_s']:g} s during {phase}"
    if facts.get("reference_error"):
        return "runtime_error", f"reference: {facts['reference_error']}"
    if not compile_facts or (compile_facts.get("ok") and not facts.get("complete")):
        return "runtime_error", f"crashed during {phase}: {_exit_description(outcome)}"
    if not compile_facts.get("ok"):
        if compile_facts.get("build_error") or compile_facts.get("syntax_error"):
            return "compile_error", compile_facts.get("build_error") or compile_facts["error"]
        return "runtime_error", f"import: {compile_facts.get('error')}"
    if not compile_facts.get("has_model_new"):
        return "runtime_error", "no ModelNew"
    if evaluate.get("error") and not trials:
        return "runtime_error", evaluate["error"]
    verdict = judge_trials(trials, settings)
    if verdict is not None:
        return verdict
    if evaluate.get("error"):
        return "runtime_error", evaluate["error"]
    if not evaluate.get("new_timing") or not evaluate.get("ref_timing"):
        return "runtime_error", "no timing reported"
    return "correct", ""


def judge_trials(trials: list[dict], settings: dict) -> tuple[str, str] | None:
    """The first failed check over the correctness trials, or None when all passed."""
    hardened = settings["mode"] == "hardened"
    if len(trials) < int(settings["correctness_trials"]) and not any(_trial_failed(t, hardened) for t in trials):
        return "runtime_error", f"only {len(trials)} of {settings['correctness_trials']} trials reported"
    for number, trial in enumerate(trials, start=1):
        if trial.get("reference_error"):
            return "runtime_error", f"reference: {trial['reference_error']}"
        for check in trial.get("checks", []):
            if check.get("error"):
                return "runtime_error", check["error"]
        if hardened and trial.get("mutated_inputs"):
            return "rejected", f"check:input_mutation: ModelNew changed input(s) {trial['mutated_inputs']}"
        checks = {c["name"]: c for c in trial.get("checks", [])}
        after = _check_failure(checks.get("candidate", {}))
        if after:
            return "incorrect", f"trial {number}: {after}"
        if hardened and _check_failure(checks.get("candidate_first", {})):
            first = _check_failure(checks["candidate_first"])
            return "rejected", f"check:order_candidate_ref_candidate: trial {number} wrong before the reference ({first})"
    return None


def _trial_failed(trial: dict, hardened: bool) -> bool:
    checks = trial.get("checks", [])
    return bool(
        trial.get("reference_error")
        or any(c.get("error") or _check_failure(c) for c in checks)
        or (hardened and trial.get("mutated_inputs"))
    )


def _check_failure(check: dict) -> str:
    """Empty when the check passed, else the failed check's name and detail."""
    if not check:
        return "not run"
    detail = check.get("detail", "")
    if not check.get("ok_shape", False):
        return f"shape_mismatch {detail}".strip()
    if not check.get("ok_dtype", False):
        return f"dtype_mismatch {detail}".strip()
    if not check.get("ok_finite", False):
        return f"non_finite {detail}".strip()
    if not check.get("allclose", False):
        return f"value_mismatch max_abs_err={check.get('max_abs_err', math.nan):.3g} {detail}".strip()
    return ""


def _max_abs_err(trials: list[dict]) -> float:
    errors = [c["max_abs_err"] for t in trials for c in t.get("checks", []) if c.get("max_abs_err") is not None]
    return float(max(errors)) if errors else math.nan


def timing_fields(evaluate: dict) -> dict:
    ref, new = evaluate["ref_timing"], evaluate["new_timing"]
    speedup = ref["mean_ms"] / new["mean_ms"] if new["mean_ms"] > 0 else math.inf
    return {
        "ref_ms": ref["mean_ms"], "new_ms": new["mean_ms"],
        "ref_median_ms": ref["median_ms"], "new_median_ms": new["median_ms"], "speedup": speedup,
    }  # fmt: skip


def _exit_description(outcome: ChildOutcome) -> str:
    code = outcome.returncode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} before reporting"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."

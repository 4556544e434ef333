"""Verify candidate kernels: each in its own process (hard timeout), facts from the child, verdict decided here.

Two steps with one contract. `compile_frame` builds every candidate's extension in a pool of CPU processes into a
content-addressed build cache (docs/data.md section 4a); `verify_frame` then loads, checks and times each candidate
(section 4) — on a GPU it finds its module in the cache and never waits on a compiler. `verify_one` does both for a
single solution, plus the task's degenerate-check probe. The child (`verify_child.py`) reports raw facts
(compiled?, per-trial checks, timings, profiler kernels) in a nonce-stamped JSON; the verdict is decided here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from concur import contracts
from concur.io import write_parquet, write_text
from concur.screen import screen

log = logging.getLogger(__name__)

CHILD_SCRIPT = Path(__file__).with_name("verify_child.py")
NONCE_ENV = "CONCUR_VERIFY_NONCE"
GPU_LOCK_ENV = "CONCUR_GPU_LOCK"  # the lock file through which the children of one GPU take turns on it
DEFAULT_SETTINGS = {
    "device": "auto",
    "mode": "kernelbench",
    "timeout_s": 300,
    "workers": 2,
    "compile_workers": None,  # None: one per core
    "cuda_arch": None,  # e.g. "9.0"; None: the GPU present (required to compile CUDA on a machine without one)
    "build_cache": None,  # None: <workdir>/build-cache
    "correctness_trials": 5,
    "signed_trials": 2,
    "warmup": 3,
    "timing_trials": 100,
    "timing_min_s": 0.1,  # hardened: time more trials until each side has run this long
    "atol": 1.0e-2,
    "rtol": 1.0e-2,
    "audit_speedup": 10.0,
    "memory_limit_mb": 16384,
    "max_processes": 64,
    "host_compiler": "auto",  # C++ compiler of the extensions' host code: auto (clang++ when found), clang or gcc
}
PCH_TIMEOUT_S = 900
UNTIMED_SHARE, UNTIMED_FLOOR_MS = 0.25, 0.005  # side-stream work counted once it is this much of the candidate's time
POLL_S = 0.2
TERMINAL_BUILDS = ("no_code", "rejected", "compile_error", "timeout")
BUILD_ENV_KEYS = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME")
VERDICT_FIELDS = [c for c in contracts.VERDICTS if c not in ("candidate_id", "task_id")]


@dataclass
class Job:
    index: int
    candidate_id: str
    task_id: str
    reference: str
    solution: str
    build: dict | None = None  # this candidate's row of the builds table, when compiled beforehand


@dataclass
class ChildOutcome:
    returncode: int | None
    timed_out: bool
    facts: dict | None
    wall_s: float
    killed_for: str | None = None  # the limit the watchdog enforced (memory, processes)


# ---------------------------------------------------------------- public API


def compile_frame(candidates: pd.DataFrame, settings: dict, workdir: Path, progress: bool = True) -> pd.DataFrame:
    """Build every candidate's extension into the build cache, in a pool of CPU processes (contracts.BUILDS)."""
    settings = normalize_settings(settings, for_compile=True)
    jobs = [Job(i, str(r.candidate_id), str(r.task_id), "", _code(r)) for i, r in enumerate(candidates.itertuples())]
    builds = run_builds(jobs, settings, Path(workdir), progress)
    frame = pd.DataFrame([{"candidate_id": j.candidate_id, "task_id": j.task_id, **b} for j, b in zip(jobs, builds)],
                         columns=list(contracts.BUILDS))  # fmt: skip
    return contracts.conform(frame, contracts.BUILDS, "builds")


def verify_frame(
    candidates: pd.DataFrame,
    tasks: pd.DataFrame,
    settings: dict,
    workdir: Path,
    progress: bool = True,
    builds: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One verdict per candidate, in input order (contracts.VERDICTS). With `builds`, candidates whose build already
    decided the verdict (no code, rejected, compile error or timeout) are not run again."""
    settings = normalize_settings(settings)
    references = reference_programs(tasks)
    build_rows = {} if builds is None else builds.set_index("candidate_id").to_dict("index")
    jobs = []
    for index, row in enumerate(candidates.itertuples(index=False)):
        if row.task_id not in references:
            raise ValueError(f"candidate {row.candidate_id}: task {row.task_id!r} is not in the tasks frame")
        build = build_rows.get(str(row.candidate_id))
        jobs.append(Job(index, str(row.candidate_id), str(row.task_id), references[row.task_id], _code(row), build))
    degenerate = probe_tasks({j.task_id: j.reference for j in jobs}, settings, Path(workdir))
    verdicts = run_jobs(jobs, settings, Path(workdir), progress)
    rows = [{"candidate_id": j.candidate_id, "task_id": j.task_id, **v} for j, v in zip(jobs, verdicts)]
    for row in rows:
        mark_task_trust(row, degenerate.get(row["task_id"], []))
    frame = pd.DataFrame(rows, columns=list(contracts.VERDICTS))
    return contracts.conform(frame, contracts.VERDICTS, "verdicts")


def verify_one(reference_code: str, solution_code: str, settings: dict, workdir: Path) -> dict:
    """The verdict for one solution against one reference program (VERDICTS keys minus the ids), with the task's
    `degenerate` flag: the trivial outputs (zeros, identity, constant) that pass its check."""
    settings = normalize_settings(settings)
    kinds = probe_tasks({"one": reference_code}, settings, Path(workdir)).get("one", [])
    verdict = run_jobs([Job(0, "one", "one", reference_code, solution_code or "")], settings, Path(workdir), False)[0]
    mark_task_trust(verdict, kinds)
    return {**verdict, "degenerate": bool(kinds), "degenerate_outputs": kinds}


def run(candidates_path, tasks_path, settings: dict, workdir, out_path, builds_path=None) -> None:
    """The verify rule: verdicts for one candidates file, written atomically."""
    candidates = pd.read_parquet(candidates_path)
    tasks = pd.read_parquet(tasks_path)
    builds = pd.read_parquet(builds_path) if builds_path else None
    verdicts = verify_frame(candidates, tasks, settings, Path(workdir), progress=True, builds=builds)
    write_parquet(verdicts, out_path)
    log.info("verdicts: %s", verdicts["status"].value_counts().to_dict())


def compile_run(candidates_path, settings: dict, workdir, out_path) -> None:
    """The compile rule: build every candidate of one candidates file into the build cache."""
    builds = compile_frame(pd.read_parquet(candidates_path), settings, Path(workdir), progress=True)
    write_parquet(builds, out_path)
    log.info("builds: %s", builds["status"].value_counts().to_dict())


def _code(row) -> str:
    return row.code if isinstance(row.code, str) else ""


# ---------------------------------------------------------------- settings and inputs


def normalize_settings(settings: dict, for_compile: bool = False) -> dict:
    merged = {**DEFAULT_SETTINGS, **(settings or {})}
    if merged["mode"] not in ("kernelbench", "hardened"):
        raise ValueError(f"verify.mode must be kernelbench or hardened, got {merged['mode']!r}")
    if merged["device"] not in ("auto", "cpu", "cuda"):
        raise ValueError(f"verify.device must be auto, cpu or cuda, got {merged['device']!r}")
    merged["device"] = resolve_device(merged["device"], for_compile)
    if int(merged["workers"]) < 1 or float(merged["timeout_s"]) <= 0:
        raise ValueError("verify.workers must be >= 1 and verify.timeout_s > 0")
    if merged["device"] == "cuda":
        merged["cuda_arch"] = merged["cuda_arch"] or detected_cuda_arch()
    merged["host_compiler"] = resolve_host_compiler(merged["host_compiler"])
    return merged


def resolve_host_compiler(name: str) -> str:
    """clang: clang++ through concur.pch_cxx (a shared template-instantiating PCH: builds ~2.5x faster than gcc).
    auto picks it when clang++ is on PATH and CXX is not set; gcc: the system c++ (and torch's own PCH on CPU)."""
    if name not in ("auto", "clang", "gcc"):
        raise ValueError(f"verify.host_compiler must be auto, clang or gcc, got {name!r}")
    if name == "auto":
        return "clang" if shutil.which("clang++") and not os.environ.get("CXX") else "gcc"
    if name == "clang" and not shutil.which("clang++"):
        raise ValueError("verify.host_compiler is clang but clang++ is not on PATH")
    return name


def resolve_device(name: str, for_compile: bool = False) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not for_compile and not torch.cuda.is_available():
        raise ValueError("verify.device is cuda but torch sees no CUDA device")
    return name


def detected_cuda_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise ValueError("verify.cuda_arch must be set (e.g. '9.0') to compile CUDA candidates on a machine without a GPU")
    return "%d.%d" % torch.cuda.get_device_capability(0)


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


def build_env(settings: dict) -> dict[str, str]:
    """The environment variables that change a build, as the children will see them."""
    env = {k: os.environ.get(k, "") for k in BUILD_ENV_KEYS}
    if settings.get("host_compiler") == "clang":
        env["CXX"] = f"concur.pch_cxx:{shutil.which('clang++')}"  # the key names the front and the compiler
    if settings["device"] == "cuda":
        env["TORCH_CUDA_ARCH_LIST"] = str(settings["cuda_arch"])
    return env


def build_cache_root(settings: dict, workdir: Path) -> Path:
    root = Path(settings.get("build_cache") or workdir / "build-cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


# ---------------------------------------------------------------- orchestration


def run_builds(jobs: list[Job], settings: dict, workdir: Path, progress: bool) -> list[dict]:
    """Build rows for `jobs` in order: screened here, built by a pool of `compile_workers` children."""
    builds: list[dict | None] = [None] * len(jobs)
    to_build = []
    for job in jobs:
        early = pre_verdict(job, settings, "")
        builds[job.index] = None if early is None else build_row(early["status"], early["reason"], "", 0.0)
        if early is None:
            to_build.append(job)
    if to_build:
        cache_root = build_cache_root(settings, workdir)
        if uses_torch_pch(settings) and any(needs_build(job, settings, cache_root) for job in to_build):
            prepare_pch(settings, workdir)
        workers = int(settings["compile_workers"] or len(os.sched_getaffinity(0)))
        settings = {**settings, "workers": workers}  # each build's share of the cores (MAX_JOBS, threads)
        build = lambda job, gpu: compile_job(job, settings, workdir, cache_root)  # noqa: E731
        for job, row in pool_map(build, to_build, workers, [None] * workers, progress, "compile"):
            builds[job.index] = row
    return builds  # type: ignore[return-value]


def run_jobs(jobs: list[Job], settings: dict, workdir: Path, progress: bool) -> list[dict]:
    """Verdicts for `jobs` in order: decided here when possible, else by a child each (one per GPU at a time)."""
    verdicts: list[dict | None] = [None] * len(jobs)
    label = device_label(settings["device"])
    to_run = []
    for job in jobs:
        verdicts[job.index] = pre_verdict(job, settings, label) or verdict_from_build(job, settings, label)
        if verdicts[job.index] is None:
            to_run.append(job)
    if to_run:
        cache_root = build_cache_root(settings, workdir)
        if uses_torch_pch(settings) and any(needs_build(job, settings, cache_root) for job in to_run):
            prepare_pch(settings, workdir)
        slots = gpu_slots(settings)
        workers = min(int(settings["workers"]), len(slots))
        check = lambda job, gpu: run_job(job, settings, workdir, cache_root, gpu)  # noqa: E731
        for job, verdict in pool_map(check, to_run, workers, slots, progress, "verify"):
            verdicts[job.index] = verdict
    return verdicts  # type: ignore[return-value]


def gpu_slots(settings: dict) -> list[str | None]:
    """`workers` slots; on CUDA spread over the visible GPUs (a child sees only its GPU, and the children of one GPU
    take turns on it for everything they run there, so they overlap only their CPU work)."""
    workers = int(settings["workers"])
    if settings["device"] != "cuda":
        return [None] * workers
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        gpus = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import torch

        gpus = [str(i) for i in range(torch.cuda.device_count())]
    return [gpus[i % len(gpus)] for i in range(max(workers, len(gpus)))]


def pool_map(fn, jobs: list[Job], workers: int, slots: list, progress: bool, desc: str):
    """Yield (job, fn(job, slot)) as jobs finish; each running job holds one slot (a GPU id, or None)."""
    free = queue.Queue()
    for slot in slots:
        free.put(slot)

    def with_slot(job):
        slot = free.get()
        try:
            return fn(job, slot)
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(with_slot, job): job for job in jobs}
        for future in _progress(as_completed(futures), len(futures), progress, desc):
            yield futures[future], future.result()


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="cand", file=sys.stderr)


def pre_verdict(job: Job, settings: dict, label: str) -> dict | None:
    """The verdict when no process is needed (no code, or rejected by the static screen), else None."""
    if not job.solution.strip():
        return blank_verdict("no_code", "no code block in the answer", settings, label)
    if settings["mode"] == "hardened":
        findings = screen(job.solution)
        if findings:
            return blank_verdict("rejected", f"screen:{findings[0].rule}", settings, label)
    return None


def verdict_from_build(job: Job, settings: dict, label: str) -> dict | None:
    """The verdict its build already decided (compile error, compile timeout), else None."""
    if not job.build or job.build["status"] not in TERMINAL_BUILDS:
        return None
    verdict = blank_verdict(job.build["status"], job.build["reason"], settings, label)
    verdict["compile_s"] = float(job.build["compile_s"])
    return verdict


def blank_verdict(status: str, reason: str, settings: dict, label: str) -> dict:
    nan = math.nan
    return {
        "status": status, "reason": reason, "compiled": False, "correct": False,
        "ref_ms": nan, "new_ms": nan, "ref_median_ms": nan, "new_median_ms": nan,
        "speedup": 0.0, "max_abs_err": nan, "device": label, "verify_mode": settings["mode"],
        "compile_s": 0.0, "eval_s": 0.0, "flags": "", "trusted": True,
    }  # fmt: skip


def build_row(status: str, reason: str, key: str, seconds: float) -> dict:
    return {"status": status, "reason": reason, "cache_key": key, "compile_s": seconds}


def mark_task_trust(verdict: dict, degenerate_kinds: list[str]) -> None:
    """A task whose check a trivial output passes makes every verdict on it untrustworthy."""
    if degenerate_kinds:
        verdict["trusted"] = False
        verdict["flags"] = ",".join(f for f in (verdict["flags"], "degenerate_task:" + "+".join(degenerate_kinds)) if f)


def job_dir_for(job: Job, workdir: Path, phase: str) -> Path:
    job_dir = workdir / "jobs" / phase / f"{job.index:06d}-{_safe(job.candidate_id)}"
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "reference.py").write_text(job.reference)
    (job_dir / "solution.py").write_text(job.solution)
    return job_dir


def compile_job(job: Job, settings: dict, workdir: Path, cache_root: Path) -> dict:
    key = build_cache_key(job.solution, settings)
    job_dir = job_dir_for(job, workdir, "compile")
    write_spec(job_dir, settings)
    outcome = run_locked_child(job_dir, "compile", settings, cache_root, key, gpu=None)
    return classify_build(outcome, settings, key)


def classify_build(outcome: "ChildOutcome", settings: dict, key: str) -> dict:
    facts = (outcome.facts or {}).get("compile") or {}
    seconds = float(facts.get("seconds") or 0.0)
    if outcome.timed_out:
        return build_row("timeout", f"timeout after {settings['timeout_s']:g} s during compile", key, seconds)
    if outcome.killed_for:
        return build_row("runtime_error", f"killed during compile: {outcome.killed_for}", key, seconds)
    if not facts:
        return build_row("runtime_error", f"crashed during compile: {_exit_description(outcome)}", key, seconds)
    if facts.get("build_error") or facts.get("syntax_error"):
        return build_row("compile_error", _one_line(facts.get("build_error") or facts["error"]), key, seconds)
    if not facts.get("load_calls"):
        return build_row("no_build", "no load_inline/load call", key, seconds)
    reason = f"import: {_one_line(facts['error'])}" if facts.get("error") else ""
    return build_row("built" if facts.get("built") else "cached", reason, key, seconds)


def run_job(job: Job, settings: dict, workdir: Path, cache_root: Path, gpu: str | None) -> dict:
    key = build_cache_key(job.solution, settings)
    job_dir = job_dir_for(job, workdir, "verify")
    write_spec(job_dir, settings)
    outcome = run_locked_child(job_dir, "all", settings, cache_root, key, gpu)
    verdict = decide_verdict(outcome, settings, device_label(settings["device"]))
    compile_facts = (outcome.facts or {}).get("compile") or {}
    if job.build is not None and not compile_facts.get("built"):
        verdict["compile_s"] = float(job.build["compile_s"])  # the build ran in the compile step
    return verdict


def run_locked_child(job_dir: Path, phase: str, settings: dict, cache_root: Path, key: str, gpu) -> "ChildOutcome":
    build_dir = cache_root / key
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f"{key}.lock", "a") as key_lock:
        fcntl.flock(key_lock, fcntl.LOCK_EX)  # one child per build dir at a time, across threads and processes
        _remove_stale_batons(build_dir)
        return run_child(job_dir, phase, settings, float(settings["timeout_s"]), build_dir, gpu)


def probe_tasks(references: dict[str, str], settings: dict, workdir: Path) -> dict[str, list[str]]:
    """task_id -> the trivial outputs that pass its check (empty: the check is sound). Cached per reference."""
    cache = build_cache_root(settings, workdir) / "probes"
    cache.mkdir(parents=True, exist_ok=True)
    jobs = [Job(i, task_id, task_id, code, "") for i, (task_id, code) in enumerate(sorted(references.items()))]

    def probe(job: Job, gpu) -> list[str]:
        spec_keys = ("device", "correctness_trials", "atol", "rtol")
        key = hashlib.sha256(json.dumps([job.reference, [settings[k] for k in spec_keys]]).encode()).hexdigest()[:32]
        cached = cache / f"{key}.json"
        if cached.exists():
            return json.loads(cached.read_text())
        job_dir = job_dir_for(job, workdir, "probe")
        write_spec(job_dir, settings)
        outcome = run_child(job_dir, "probe", settings, float(settings["timeout_s"]), None, gpu)
        kinds = (outcome.facts or {}).get("degenerate")
        if kinds is None:  # the reference itself fails: its candidates get runtime errors, nothing to flag
            return []
        write_text(json.dumps(kinds), cached)
        return kinds

    slots = gpu_slots(settings)
    return {job.task_id: kinds for job, kinds in pool_map(probe, jobs, len(slots), slots, False, "probe")}


def gpu_lock_path(gpu: str) -> Path:
    """The lock file through which this process's children take turns on one GPU."""
    folder = Path(tempfile.gettempdir()) / f"concur-gpu-locks-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    return folder / f"gpu-{_safe(gpu)}.lock"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]


def _remove_stale_batons(build_dir: Path) -> None:
    # torch's FileBaton left behind by a killed build would make the next load_inline wait forever
    for baton in build_dir.glob("*/lock"):
        baton.unlink(missing_ok=True)


SPEC_KEYS = ("device", "mode", "correctness_trials", "signed_trials", "warmup", "timing_trials", "atol", "rtol")


def write_spec(job_dir: Path, settings: dict) -> None:
    spec = {k: settings[k] for k in SPEC_KEYS}
    spec["threads"] = thread_count(settings)
    spec["memory_limit_mb"] = settings["memory_limit_mb"] if settings["device"] == "cpu" else None
    (job_dir / "job.json").write_text(json.dumps(spec))


def thread_count(settings: dict) -> int:
    """Threads per child so that `workers` concurrent children do not oversubscribe the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(settings["workers"]))


def build_cache_key(solution: str, settings: dict) -> str:
    """sha256 of everything that changes the built extension: code, torch/python versions, build env, device kind."""
    import torch

    env = build_env(settings)
    parts = [solution, torch.__version__, sys.version, json.dumps(env, sort_keys=True), settings["device"]]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def needs_build(job: Job, settings: dict, cache_root: Path) -> bool:
    """Whether the child will probably run a C++ build: it calls load_inline/load and its cache holds no module."""
    if "cpp_extension" not in job.solution and "load_inline" not in job.solution:
        return False
    return not any((cache_root / build_cache_key(job.solution, settings)).glob("*/*.so"))


def uses_torch_pch(settings: dict) -> bool:
    """torch's own (gcc) precompiled header serves CPU builds with gcc; clang builds use concur.pch_cxx's. CUDA builds
    go without: on an H100 node gcc refused the header for their binding unit ("created by a different GCC
    executable"), so building it cost 49 s and saved nothing."""
    return settings["device"] == "cpu" and settings.get("host_compiler", "gcc") == "gcc"


def prepare_pch(settings: dict, workdir: Path) -> None:
    """Build torch's shared precompiled header once, in a single child, before parallel builds could race on it."""
    import torch

    if (Path(torch.__file__).resolve().parent / "include" / "torch" / "extension.h.gch").exists():
        return
    job_dir = workdir / "jobs" / "pch"
    job_dir.mkdir(parents=True, exist_ok=True)
    write_spec(job_dir, settings)
    outcome = run_child(job_dir, "pch", settings, max(PCH_TIMEOUT_S, float(settings["timeout_s"])), None, None)
    if not (outcome.facts and outcome.facts.get("complete")):
        log.warning("building the precompiled header failed (see %s); builds will be slower", job_dir / "child.log")


def child_env(settings: dict, build_dir: Path | None, nonce: str, phase: str, gpu: str | None) -> dict:
    env = dict(os.environ)
    threads = str(thread_count(settings))
    env.update({NONCE_ENV: nonce, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "MAX_JOBS": threads})
    env.update({k: v for k, v in build_env(settings).items() if v and k != "CXX"})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if build_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(build_dir)
        if settings.get("host_compiler") == "clang":  # build_dir is <cache root>/<key>: the PCHs are shared beside it
            env.update(CXX=str(pch_front(build_dir.parent / "pch")), CONCUR_PCH_DIR=str(build_dir.parent / "pch"),
                       CONCUR_REAL_CXX=shutil.which("clang++") or "clang++")
    if settings["device"] == "cpu" or phase in ("compile", "pch"):
        env["CUDA_VISIBLE_DEVICES"] = ""  # builds never touch a GPU: they may run on a node without one
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env[GPU_LOCK_ENV] = str(gpu_lock_path(gpu))
    return env


def pch_front(pch_dir: Path) -> Path:
    """An executable that runs concur.pch_cxx with this interpreter: torch's builds take CXX as one command."""
    shim = pch_dir / "concur-c++"
    text = f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("pch_cxx.py")}" "$@"\n'
    if not shim.is_file() or shim.read_text() != text:
        pch_dir.mkdir(parents=True, exist_ok=True)
        partial = pch_dir / f".concur-c++.{os.getpid()}.{threading.get_ident()}"
        partial.write_text(text)
        partial.chmod(0o755)
        os.replace(partial, shim)
    return shim


class ForkServer:
    """The parent's end of `verify_child.py serve`: start a job in a forked child, wait for its exit code."""

    def __init__(self):
        env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # a CUDA query here must not initialise CUDA
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD_SCRIPT), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env,
        )  # fmt: skip
        self.lock = threading.Lock()
        self.started: dict[int, queue.Queue] = {}
        self.exits: dict[int, queue.Queue] = {}
        self.next_id = 0
        threading.Thread(target=self._read_replies, daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, job_dir: Path, phase: str, env: dict, log_file: Path) -> int:
        with self.lock:
            self.next_id += 1
            request_id, reply = self.next_id, self.started.setdefault(self.next_id, queue.Queue())
            request = {"id": request_id, "job_dir": str(job_dir), "phase": phase, "env": env, "log": str(log_file)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        pid = reply.get(timeout=120)
        with self.lock:
            del self.started[request_id]
        return pid

    def wait(self, pid: int, timeout: float) -> int | None:
        """The child's exit code (minus the signal that killed it), or None while it still runs."""
        try:
            code = self._exit_queue(pid).get(timeout=timeout)
        except queue.Empty:
            return None
        with self.lock:
            self.exits.pop(pid, None)
        return code

    def _exit_queue(self, pid: int) -> queue.Queue:
        with self.lock:
            return self.exits.setdefault(pid, queue.Queue())

    def _read_replies(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            if "exit" in message:
                self._exit_queue(message["pid"]).put(message["exit"])
            else:
                with self.lock:
                    target = self.started.get(message["id"])
                target.put(message["pid"])


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()


def fork_server() -> ForkServer:
    """The process-wide fork server, started on first use (and again if it died)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive():
            _SERVER = ForkServer()
        return _SERVER


def run_child(job_dir: Path, phase: str, settings: dict, timeout_s: float, build_dir: Path | None,
              gpu: str | None = None) -> ChildOutcome:  # fmt: skip
    """Run one job in a forked child of its own session under a watchdog; kill its whole process group on timeout
    or over a limit."""
    job_dir = job_dir.resolve()  # the child works in its own folder: relative paths would point elsewhere
    build_dir = build_dir.resolve() if build_dir is not None else None
    nonce = secrets.token_hex(16)
    result_path = job_dir / "result.json"
    result_path.unlink(missing_ok=True)
    start = time.perf_counter()
    server = fork_server()
    pid = server.start(job_dir, phase, child_env(settings, build_dir, nonce, phase, gpu), job_dir / "child.log")
    code, timed_out, killed_for = watch(server, pid, start + timeout_s, settings)
    _kill_group(pid)  # strays of an ended child, or the child itself
    if code is None:
        code = server.wait(pid, timeout=60)
    facts = read_facts(result_path, nonce)
    return ChildOutcome(code, timed_out, facts, time.perf_counter() - start, killed_for)


def watch(server: ForkServer, pid: int, deadline: float, settings: dict) -> tuple[int | None, bool, str | None]:
    """Wait for the child: (exit code or None, timed out?, limit exceeded). Limits: memory summed over its process
    group, and its number of processes."""
    limit_kb = int(settings["memory_limit_mb"]) * 1024
    while True:
        code = server.wait(pid, POLL_S)
        if code is not None:
            return code, False, None
        if time.perf_counter() > deadline:
            return None, True, None
        processes, memory_kb = group_usage(pid)
        if processes > int(settings["max_processes"]):
            return None, False, f"{processes} processes (limit {settings['max_processes']})"
        if memory_kb > limit_kb:
            return None, False, f"out of memory: {memory_kb // 1024} MB in use (limit {settings['memory_limit_mb']} MB)"


def group_usage(pgid: int) -> tuple[int, int]:
    """(processes, memory KB) of the process group `pgid`, read from /proc.

    Memory is the proportional set size: forked children share their parent's pages, and summing resident sizes
    would count those pages once per child."""
    processes = memory_kb = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the command name: state, ppid, pgrp, ...
                continue
            processes += 1
            memory_kb += _pss_kb(entry.name, int(fields[21]))
        except (OSError, IndexError, ValueError):
            continue
    return processes, memory_kb


def _pss_kb(pid: str, rss_pages: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return rss_pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


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
        verdict.update(timing_fields(evaluate, settings["mode"]))
        verdict["flags"] = ",".join(audit_flags(verdict, evaluate, settings))
    return verdict


def classify(outcome: ChildOutcome, facts, compile_facts, evaluate, trials, settings) -> tuple[str, str]:
    phase = "evaluate" if compile_facts.get("ok") else "compile"
    if outcome.timed_out:
        return "timeout", f"timeout after {settings['timeout_s']:g} s during {phase}"
    if outcome.killed_for:
        return "runtime_error", f"killed during {phase}: {outcome.killed_for}"
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
    if settings["mode"] == "hardened" and evaluate.get("tampered"):
        return "rejected", f"check:tampering: replaced {', '.join(evaluate['tampered'][:5])}"
    if evaluate.get("error") and not trials:
        return "runtime_error", evaluate["error"]
    verdict = judge_trials(trials, settings)
    if verdict is not None:
        return verdict
    if evaluate.get("error"):
        return "runtime_error", evaluate["error"]
    if not evaluate.get("new_timing") or not evaluate.get("ref_timing"):
        return "runtime_error", "no timing reported"
    if settings["mode"] == "hardened":
        return kernel_checks(compile_facts, trials, evaluate.get("profile"))
    return "correct", ""


def kernel_checks(compile_facts: dict, trials: list[dict], profile: dict | None) -> tuple[str, str]:
    """Hardened: the candidate's own code did the work (its extension was called; on CUDA, its kernels ran)."""
    if compile_facts.get("counted_modules"):
        calls = [c.get("kernel_calls", 0) for t in trials for c in t.get("checks", [])]
        if calls and not any(calls):
            return "rejected", "check:kernel_not_called: forward never called into the compiled extension"
    if profile and profile.get("kernels") and not profile.get("own_kernels"):
        return "rejected", f"check:profiler_no_own_kernel: {profile['kernels']} kernel(s), all from torch or libraries"
    return "correct", ""


def judge_trials(trials: list[dict], settings: dict) -> tuple[str, str] | None:
    """The first failed check over the correctness trials, or None when all passed."""
    hardened = settings["mode"] == "hardened"
    random_trials = [t for t in trials if t.get("kind", "random") == "random"]
    if len(random_trials) < int(settings["correctness_trials"]) and not any(_trial_failed(t, hardened) for t in trials):
        return "runtime_error", f"only {len(random_trials)} of {settings['correctness_trials']} trials reported"
    for number, trial in enumerate(trials, start=1):
        if trial.get("reference_error"):
            return "runtime_error", f"reference: {trial['reference_error']}"
        for check in trial.get("checks", []):
            if check.get("error"):
                return "runtime_error", check["error"]
        if hardened and trial.get("mutated_inputs"):
            return "rejected", f"check:input_mutation: ModelNew changed input(s) {trial['mutated_inputs']}"
        checks = {c["name"]: c for c in trial.get("checks", [])}
        after = _check_failure(checks.get("candidate", {})) if checks else ""
        prefix = "check:signed_inputs: " if trial.get("kind") == "signed" else ""
        if after:
            return "incorrect", f"{prefix}trial {number}: {after}"
        if hardened and checks and _check_failure(checks.get("candidate_first", {})):
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


def timing_fields(evaluate: dict, mode: str) -> dict:
    """kernelbench: speedup of the means (KernelBench's runtime). hardened: of the medians, which one preempted or
    interrupted trial does not move; on CUDA, of the current stream's times unless the candidate left work on other
    streams (`untimed_stream_work`), then of the device-wide times of both models."""
    ref, new = evaluate["ref_timing"], evaluate["new_timing"]
    prefix = "device_" if untimed_stream_work(ref, new) else ""
    stat = f"{prefix}median_ms" if mode == "hardened" else "mean_ms"
    speedup = ref[stat] / new[stat] if new[stat] > 0 else math.inf
    return {
        "ref_ms": ref[f"{prefix}mean_ms"], "new_ms": new[f"{prefix}mean_ms"],
        "ref_median_ms": ref[f"{prefix}median_ms"], "new_median_ms": new[f"{prefix}median_ms"], "speedup": speedup,
    }  # fmt: skip


def untimed_stream_work(ref: dict, new: dict) -> bool:
    """True when the device-wide time exceeds the current stream's time by more for the candidate than for the
    reference: the gap is one host round trip for work on one stream, and grows by whatever ran on side streams."""
    if "device_median_ms" not in ref or "device_median_ms" not in new:
        return False
    ref_gap = ref["device_median_ms"] - ref["median_ms"]
    new_gap = new["device_median_ms"] - new["median_ms"]
    return new_gap - ref_gap > max(UNTIMED_SHARE * new["median_ms"], UNTIMED_FLOOR_MS)


def audit_flags(verdict: dict, evaluate: dict, settings: dict) -> list[str]:
    """Marks on a correct verdict that a person should look at; they never change the status."""
    flags = []
    if verdict["speedup"] > float(settings["audit_speedup"]):
        flags.append(f"audit:speedup>{settings['audit_speedup']:g}")
    if untimed_stream_work(evaluate["ref_timing"], evaluate["new_timing"]):
        flags.append("timing:untimed_stream_work")
    profile = evaluate.get("profile")
    if profile is not None and not profile.get("kernels"):
        flags.append("profiler_saw_no_kernels")
    return flags


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

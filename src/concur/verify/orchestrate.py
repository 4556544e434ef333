"""The verify and compile steps as the workflow runs them: candidates in, builds and verdicts out.

`compile_frame` builds every candidate's extension in a pool of sandboxed builder children into the build cache
(docs/data.md §4a), those its ModelNew's __init__ loads included (made on the task's init inputs). `verify_frame`
hands each candidate to a referee (concur.verify.referee: one per GPU, or `workers` on the CPU), the candidates of
one task in a row so the task's reference process is made once, and hands their reports (concur.verify.report)
back to be judged (concur.verify.verdict, §4). Referees and the builders' zygote live as long as
this process and are reused by later calls with the same settings.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from concur.verify import compiling, modes, procs
from concur.verify import settings as verify_settings
from concur.verify.report import Failure, Report
from concur.verify.verdict import before_run

log = logging.getLogger("concur.verify")
REFEREE_START_S = 600.0
DOORBELL = True  # timed steps signalled on a shared-memory doorbell; False: the socket alone (benchmarks compare)
# where a mode with a launch core holds a judged side's main thread on it (referee.Referee.place): "timed", while the
# side is timed; "taken", from its take to its dismissal (benchmarks compare)
LAUNCH_CORE = "timed"


@dataclass
class Job:
    index: int
    candidate_id: str
    task_id: str
    reference: str
    solution: str
    build: dict | None = None  # this candidate's row of the builds table


def cache_root_of(settings: dict, workdir: Path) -> Path:
    root = Path(settings.get("build_cache") or Path(workdir) / "build-cache").resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def device_label(device: str) -> str:
    if device == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(0)}"
    return "cpu"


# ---------------------------------------------------------------- builds


_BUILDERS: procs.Zygote | None = None
_LOCK = threading.Lock()


def builders() -> procs.Zygote:
    global _BUILDERS
    with _LOCK:
        if _BUILDERS is None or not _BUILDERS.alive():
            _BUILDERS = procs.Zygote(env=trusted_env(), clean=True)
        return _BUILDERS


def run_builds(jobs: list[Job], settings: dict, workdir: Path, progress: bool) -> list[dict]:
    """Build rows for `jobs` in order: decided here when possible, else built by a pool of `compile_workers`."""
    rows: list[dict | None] = [None] * len(jobs)
    to_build = []
    for job in jobs:
        early = before_run(job.solution, None, settings)
        rows[job.index] = None if early is None else compiling.row(early[0], early[1], "", 0.0)
        if early is None:
            to_build.append(job)
    if not to_build:
        return rows  # type: ignore[return-value]
    cache_root = cache_root_of(settings, workdir)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="concur-build-", dir=Path(workdir).resolve()))
    zygote = builders()
    workers = int(settings.get("compile_workers") or verify_settings.cores())
    threads = max(1, verify_settings.cores() // workers)
    shared = {**settings, "timeout_s": max(compiling.PCH_TIMEOUT_S, float(settings["timeout_s"]))}
    warm = compiling.warm_programs([j.solution for j in to_build], settings)
    trusted = settings["sandbox"] == "off"

    def warm_up(i: int) -> dict:  # a trusted build that leaves a flag set's shared PCH behind (pch_cxx)
        return compiling.build(zygote, warm[i], shared, cache_root, scratch / f"warm-{i}", threads, trusted=True)

    def build(job: Job) -> dict:
        return compiling.build(
            zygote, job.solution, settings, cache_root, scratch / f"{job.index:06d}", threads, trusted, job.reference
        )

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(warm_up, range(len(warm))))  # every shared PCH before any candidate's build
        futures = {pool.submit(build, job): job for job in to_build}
        for future in _progress(as_completed(futures), len(futures), progress, "compile"):
            rows[futures[future].index] = future.result()
    shutil.rmtree(scratch, ignore_errors=True)
    return rows  # type: ignore[return-value]


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="cand", file=sys.stderr)


# ---------------------------------------------------------------- referees


class RefereeDied(RuntimeError):
    pass


TRUSTED_ENV = (
    "HOME",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "CUDA_MODULE_LOADING",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TORCH_HOME",
    "XDG_CACHE_HOME",
    "CXX",
    "CC",
    "CFLAGS",
    "CXXFLAGS",
    "LDFLAGS",
    "CPPFLAGS",
    "MAX_JOBS",
)


def trusted_env() -> dict[str, str]:
    """The environment of the referees and zygotes: what CUDA, torch and the compilers need, nothing else (a
    candidate can read a process's environment; API keys and tokens stay in the job's own process)."""
    from concur.verify.runner import PASSED_ENV

    return {k: v for k, v in os.environ.items() if k in PASSED_ENV or k in TRUSTED_ENV or k.startswith("CONCUR_")}


class RefereeHandle:
    """A referee process (concur.verify.referee) on one device."""

    def __init__(
        self,
        device: str,
        gpu: str | None,
        cache_root: Path,
        threads: int,
        workers: int,
        confine: bool,
        profiler: bool,
        cpus: list[int] | None,
        doorbell: bool = True,
        launch_core: str = "off",
    ):
        self.args = (device, gpu, cache_root, threads, workers, confine, profiler, cpus, doorbell, launch_core)
        self.root = Path(tempfile.mkdtemp(prefix="concur-referee-"))
        self.log = self.root / "referee.log"
        env = trusted_env()
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.proc, self.channel = procs.start_module("concur.verify.referee", env, self.log)
        try:
            self.channel.send(
                {
                    "device": device,
                    "workdir": str(self.root),
                    "cache_root": str(cache_root),
                    "threads": threads,
                    "workers": workers,
                    "confine": confine,
                    "profiler": profiler,
                    "cpus": cpus,
                    "doorbell": doorbell,
                    "launch_core": launch_core,
                }
            )
            reply, _ = self.channel.recv(timeout=REFEREE_START_S)
        except (procs.ChannelClosed, TimeoutError, OSError) as err:
            raise RuntimeError(f"the referee did not start ({type(err).__name__}); see {self.log}") from None
        if not reply.get("ok"):
            raise RuntimeError(f"the referee did not start: {reply.get('error')}")
        self.label = reply["device"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def evaluate(self, job: dict, timeout: float) -> Report:
        try:
            self.channel.send({"op": "job", "job": job})
            reply, _ = self.channel.recv(timeout=timeout)
        except (procs.ChannelClosed, TimeoutError, OSError) as err:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            self.close()
            raise RefereeDied(f"the referee stopped ({type(err).__name__}): {tail.strip()[-300:]}") from None
        return Report.from_data(reply["report"])

    def restarted(self) -> RefereeHandle:
        self.close()
        return RefereeHandle(*self.args)

    def close(self) -> None:
        try:
            self.channel.send({"op": "quit"})
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        procs._kill_group(self.proc.pid)
        self.channel.close()
        shutil.rmtree(self.root, ignore_errors=True)


_POOL: tuple[tuple, list[RefereeHandle]] | None = None


def gpu_shares(workers: int) -> tuple[list[str], int, list[list[int]]]:
    """On a GPU node: the visible GPUs, each contestant's threads, and each GPU's referee's own cores (this
    process's cores split evenly between them)."""
    gpus = verify_settings.visible_gpus()
    threads = max(1, verify_settings.cores() // (len(gpus) * (workers + 1)))
    mine = sorted(os.sched_getaffinity(0))
    share = max(1, len(mine) // len(gpus))
    return gpus, threads, [mine[i * share : (i + 1) * share] for i in range(len(gpus))]


def referees(settings: dict, cache_root: Path) -> list[RefereeHandle]:
    """One referee per visible GPU (each keeping `workers` contestants ready), or `workers` on the CPU; reused while
    the settings that shape them stay the same."""
    global _POOL
    workers, cuda = int(settings["workers"]), settings["device"] == "cuda"
    if cuda:
        slots, threads, cpus = gpu_shares(workers)
    else:
        slots, threads, cpus = [None] * workers, max(1, verify_settings.cores() // workers), [None] * workers
    shape = {  # what the referees are started with besides their GPU and cores; a change starts them again
        "device": settings["device"],
        "cache_root": cache_root,
        "threads": threads,
        "workers": workers,
        "confine": settings["sandbox"] != "off",
        "profiler": cuda and modes.of(settings).profile,
        "doorbell": DOORBELL,
        "launch_core": LAUNCH_CORE if cuda and modes.of(settings).launch_core else "off",
    }
    key = (tuple(str(s) for s in slots), *shape.values())
    with _LOCK:
        if _POOL is not None and _POOL[0] == key and all(h.proc.poll() is None for h in _POOL[1]):
            return _POOL[1]
        close_referees()
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            handles = list(pool.map(lambda slot: RefereeHandle(gpu=slot[0], cpus=slot[1], **shape), zip(slots, cpus)))
        _POOL = (key, handles)
        return handles


def close_referees() -> None:
    global _POOL
    if _POOL is not None:
        for handle in _POOL[1]:
            handle.close()
        _POOL = None


@atexit.register
def _shutdown() -> None:
    close_referees()
    if _BUILDERS is not None:
        _BUILDERS.close()


def evaluate_all(payloads: list[dict], settings: dict, cache_root: Path, progress: bool, on_done) -> None:
    """Evaluate every payload on the referees, each taking its candidates from one `TaskBoard`."""
    handles = referees(settings, cache_root)
    board = TaskBoard(task_groups(payloads))
    bar = _progress(None, len(payloads), progress, "verify") if progress else None
    timeout = 3 * float(settings["timeout_s"]) + REFEREE_START_S

    def drain(slot: int) -> None:
        while (payload := board.take(slot)) is not None:
            on_done(payload, evaluate_with_retry(handles, slot, payload, timeout))
            if bar is not None:
                bar.update(1)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if bar is not None:
        bar.close()


def task_groups(payloads: list[dict]) -> list[list[dict]]:
    """The payloads by task, in the order a pool of referees should take them: most candidates first (the greedy
    longest-first rule; a task's cost is mostly its candidates' fixed trials), ties in the order given."""
    groups: dict[str, list[dict]] = {}
    for payload in payloads:
        groups.setdefault(payload["task_id"], []).append(payload)
    return sorted(groups.values(), key=len, reverse=True)


class TaskBoard:
    """The candidates left, for a pool of referees. A referee takes the candidates of one task in a row (the task's
    reference is set up once there) and then the next task in `groups`' order. Once every task is taken, a referee
    left without work takes the last candidate of the task with the most left on another referee: the job's tail
    is one candidate long, not one task, for one more set-up of that task's reference."""

    def __init__(self, groups: list[list[dict]]):
        self.untaken = deque(list(group) for group in groups)
        self.held: dict[int, list[dict]] = {}  # a referee's task: its candidates not yet taken
        self.lock = threading.Lock()

    def take(self, slot: int) -> dict | None:
        with self.lock:
            own = self.held.get(slot)
            if not own and self.untaken:
                own = self.held[slot] = self.untaken.popleft()
            if own:
                return own.pop(0)
            fullest = max(self.held.values(), key=len, default=[])
            return fullest.pop() if fullest else None


def evaluate_with_retry(handles: list[RefereeHandle], slot: int, payload: dict, timeout: float) -> Report:
    """A referee that dies (a bug, a node problem) is restarted and the candidate tried once more."""
    for attempt in (1, 2):
        try:
            return handles[slot].evaluate(payload, timeout)
        except RefereeDied as err:
            log.warning("referee %d died on %s (attempt %d): %s", slot, payload["candidate_id"], attempt, err)
            handles[slot] = handles[slot].restarted()
    return Report(failure=Failure("referee", "evaluate", "the referee died twice on this candidate"))

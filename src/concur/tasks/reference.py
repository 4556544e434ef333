"""Each task's reference checked once, in a forked child with a time and memory limit: first on the meta device
(structure, bytes and FLOPs, no memory and no compute), then, when small enough, run for real on the CPU.

A checker process imports torch once and forks a fresh child per program, so a program costs a fork rather than a
new interpreter; the child's verdict comes back through a pipe.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import re
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..logs import Progress
from ..verify.build import exec_program
from .programs import REQUIRED_NAMES, error_line

log = logging.getLogger("concur.tasks")
_SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
_MB = 2**20
_OUTCOMES = {
    "ok": "run",
    "meta_only": "meta only",
    "timeout": "cut short",
    "too_large": "cut short",
    "rejected": "rejected",
}


def validate_programs(
    codes: list[str],
    timeout_s: float,
    max_input_mb: float,
    max_gflop: float,
    workers: int,
    started: list | None = None,
) -> list[dict]:
    """One verdict per program, in order: {"status", "reason", "seconds"}; status is ok (run on the CPU), meta_only
    (over max_input_mb or max_gflop on the meta device: not run), rejected, too_large (out of memory) or timeout.

    Each checker process imports torch once and forks a fresh child per program, so a program costs a fork rather
    than a new interpreter. `started`: checkers started earlier (their torch import overlaps the caller's work).
    """
    checkers = list(started or [])
    # a checker costs a torch import (seconds): small suites share one
    wanted = max(1, min(workers, len(codes) // 64))
    checkers += [Checker() for _ in range(wanted - len(checkers))]
    idle = queue.SimpleQueue()
    for checker in checkers:
        idle.put(checker)

    progress = Progress(log, "validated", "programs", len(codes), list(_OUTCOMES.values()))
    job = {"timeout_s": timeout_s, "max_input_mb": max_input_mb, "max_gflop": max_gflop}

    def check(code: str) -> dict:
        checker = idle.get()
        try:
            verdict = checker.check({**job, "code": code})
        finally:
            idle.put(checker)
        progress.add(_OUTCOMES[verdict["status"]])
        return verdict

    try:
        with ThreadPoolExecutor(max_workers=len(checkers)) as pool:
            verdicts = list(pool.map(check, codes))
        progress.finish()
        return verdicts
    finally:
        for checker in checkers:
            checker.close()


class Checker:
    """A long-lived `serve_checks` process; restarted if it dies."""

    def __init__(self, start: bool = False):
        self.proc: subprocess.Popen | None = self._start() if start else None

    def check(self, job: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self.close()
            return {"status": "rejected", "reason": "the checker process died", "seconds": 0.0}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:  # the checker already died
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    @staticmethod
    def _start() -> subprocess.Popen:
        src = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            **_SINGLE_THREAD_ENV,
            "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
        }
        return subprocess.Popen(
            [sys.executable, "-c", "from concur.tasks.reference import serve_checks; serve_checks()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )


def serve_checks() -> None:
    """Checker process: one JSON job per stdin line, one JSON verdict per stdout line."""
    import torch

    # Lazy initialisation (dispatch tables, the meta device) happens once here rather than in every child:
    # ~0.5 s per program otherwise.
    with torch.device("meta"):
        torch.nn.Linear(2, 2)(torch.rand(1, 2))
    torch.nn.Linear(2, 2)(torch.rand(1, 2)).relu().sum()
    for line in sys.stdin:
        print(json.dumps(_check_in_fork(json.loads(line))), flush=True)


def _check_in_fork(job: dict) -> dict:
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: never outlive the checker
        _child(job, write_fd)
    os.close(write_fd)
    payload, finished = _read_until(read_fd, started + job["timeout_s"])
    os.close(read_fd)
    try:
        os.killpg(pid, signal.SIGKILL)  # the child and anything it started; it is not reaped yet, so pid is ours
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    seconds = round(time.monotonic() - started, 3)
    if not finished:
        return {"status": "timeout", "reason": f"ran longer than {job['timeout_s']} s on the CPU", "seconds": seconds}
    if payload:
        return {**json.loads(payload), "seconds": seconds}
    how = (
        f"signal {-os.waitstatus_to_exitcode(status)}"
        if os.WIFSIGNALED(status)
        else f"exit code {os.waitstatus_to_exitcode(status)}"
    )
    return {
        "status": "rejected",
        "reason": f"the reference process ended without a verdict ({how})",
        "seconds": seconds,
    }


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to fd until EOF, and whether EOF came before the deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), False
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _child(job: dict, write_fd: int) -> None:
    """Forked child: run the reference, write the verdict, exit without returning to the checker's loop."""
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        verdict = _run_reference(job["code"], job["max_input_mb"], job["max_gflop"])
    except BaseException as err:  # the program may raise anything, SystemExit included
        verdict = {"status": "rejected", "reason": error_line(err)}
    try:
        os.write(write_fd, json.dumps(verdict).encode())
    finally:
        os._exit(0)


def _run_reference(code: str, max_input_mb: float, max_gflop: float) -> dict:
    import torch

    torch.set_num_threads(1)
    _limit_memory((4 * max_input_mb + 2048) * _MB)
    namespace = exec_program(code, "<task>", "concur_task")  # its lines in linecache: TorchScript reads its source
    missing = [name for name in REQUIRED_NAMES if name not in namespace]
    if missing:
        return {"status": "rejected", "reason": f"does not define {', '.join(missing)}"}
    size_mb, gflop = _meta_cost(namespace)
    if (size_mb or 0) > max_input_mb or (gflop or 0) > max_gflop:
        return {"status": "meta_only", "reason": _meta_only_reason(size_mb, gflop, max_input_mb, max_gflop)}
    # Small enough, or the meta run failed: only a real run may reject a program (a meta failure can be an artefact
    # of meta tensors, which cannot run data-dependent code such as nonzero or .item()).
    torch.manual_seed(0)
    try:
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        with torch.no_grad():
            model(*inputs)
            stateful = _keeps_state(model, namespace["get_inputs"], inputs)
    except MemoryError:
        return {"status": "too_large", "reason": "ran out of memory on the CPU"}
    except RuntimeError as err:
        if "alloc" in str(err) and "memory" in str(err):
            return {"status": "too_large", "reason": f"ran out of memory on the CPU: {error_line(err)}"}
        raise
    if stateful:
        return {"status": "rejected", "reason": STATEFUL, "ran": True}  # it ran: its reason needs no prefix
    return {"status": "ok", "reason": ""}


# Two calls on copies of the same inputs, each after the same seed (so dropout and other random draws agree), with a
# call on other inputs between them, differ: forward keeps state across calls (observers' running ranges in
# quantization modules, counters, caches). The verifier calls the reference on other inputs and more often than the
# candidate, so an honest candidate's outputs cannot match.
STATEFUL = "stateful: a call on other inputs changes what later calls return (forward updates the model's state)"


def _keeps_state(model, get_inputs, inputs: list) -> bool:
    """Whether a call on other inputs (drawn under another seed, floating ones tripled: a wider range) changes the
    outputs of a call on `inputs`. Not judged (False) where forward fails on those other inputs."""
    import torch

    from concur.verify import comparisons

    before = _seeded_call(model, inputs)
    torch.manual_seed(2)
    other = [x * 3 if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in get_inputs()]
    try:
        _seeded_call(model, other)
    except Exception:
        return False
    return not comparisons.identical(before, _seeded_call(model, inputs))


def _seeded_call(model, inputs: list) -> list:
    """Outputs of one call on copies of `inputs` (a forward that writes into its inputs changes no later call)."""
    import torch

    torch.manual_seed(1)
    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in _flatten(model(*copies))]


def _meta_cost(namespace: dict) -> tuple[float | None, float | None]:
    """(MB of parameters, buffers and inputs; GFLOP of one forward), both on the meta device (no memory, no compute);
    None where that fails. FlopCounterMode counts matmuls, convolutions and attention, not elementwise ops (the
    bytes cap and the time limit bound those)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            model = namespace["Model"](*namespace["get_init_inputs"]())
            inputs = namespace["get_inputs"]()
    except Exception:  # data-dependent code cannot run on meta tensors; the real run is still limited
        return None, None
    tensors = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
    tensors += [t for t in _flatten(inputs) if isinstance(t, torch.Tensor)]
    size_mb = sum(t.numel() * t.element_size() for t in tensors) / _MB
    try:
        with torch.device("meta"), torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*inputs)
    except Exception:  # data-dependent, or an op without a meta kernel: unknown, the real run decides
        return size_mb, None
    return size_mb, counter.get_total_flops() / 1e9


def _meta_only_reason(size_mb: float, gflop: float | None, max_input_mb: float, max_gflop: float) -> str:
    caps = (("max_input_mb", size_mb, max_input_mb), ("validate_max_gflop", gflop, max_gflop))
    over = " and ".join(name for name, value, cap in caps if (value or 0) > cap)
    if gflop is None:
        measured = f"{size_mb:.0f} MB (over {over}; its forward does not run on the meta device)"
    else:
        measured = f"{_num(gflop)} GFLOP, {size_mb:.0f} MB (over {over})"
    return f"checked on the meta device only: {measured}; the verify job runs it on the GPU"


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)
    else:
        yield value


def _limit_memory(limit_bytes: float) -> None:
    """Address space: what the checker already maps (torch) plus `limit_bytes`."""
    import resource

    status = Path("/proc/self/status").read_text()
    mapped_kb = int(re.search(r"VmSize:\s+(\d+)", status).group(1))
    soft = int(mapped_kb * 1024 + limit_bytes)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

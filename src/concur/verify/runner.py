"""The referee's handle on one contestant process: spawn it sandboxed, give it arenas, ask it things under a
deadline and a watchdog (memory and processes of its session), and end it."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import time
from pathlib import Path

from concur.verify import doorbell, exchange, procs
from concur.verify.report import Failure

READY_TIMEOUT_S = 120.0
PASSED_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "TORCH_CUDA_ARCH_LIST",
    "NVIDIA_VISIBLE_DEVICES",
    # a GPU shared through MPS (SLURM's gres/mps): without its pipe folder a client cannot find the daemon, and on a
    # GPU in exclusive-process mode it then gets no context at all
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


class RunnerFailed(Exception):
    """A contestant stopped answering: timeout, crash, or killed over a limit."""

    def __init__(self, kind: str, stage: str, detail: str, seconds: float = 0.0):
        super().__init__(f"{kind} during {stage}: {detail}")
        self.kind, self.stage, self.detail, self.seconds = kind, stage, detail, seconds

    def failure(self) -> Failure:
        return Failure(self.kind, self.stage, self.detail, self.seconds)


def contestant_env(folder: Path, threads: int) -> dict:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    tmp = folder / "tmp"
    env.update(
        HOME=str(tmp),
        TMPDIR=str(tmp),
        CUDA_CACHE_PATH=str(tmp / "nv"),
        TRITON_CACHE_DIR=str(tmp / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),  # the profiler imports inductor, which makes it at import
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        # torch's profiler (kineto) detaches CUPTI once a profiled call ends: left attached, every later launch of
        # either side pays its callbacks (measured on an H200: a 3-launch eager call 24 -> 46 us a call)
        TEARDOWN_CUPTI="1",
    )
    return env


def is_notice(frame: dict) -> bool:
    """A timed step's notice on the socket (contestant.Contestant._answer), not a reply."""
    return set(frame) == {"answered", "nonce"}


class Runner:
    """One contestant process, started at once; `ready()` waits for it to have made its CUDA context. `devices`:
    the GPU device files its sandbox lets it open (sandbox.gpu_nodes)."""

    def __init__(
        self,
        zygote: procs.Zygote,
        folder: Path,
        device: str,
        threads: int,
        hidden: list[str] | None,
        readable: list[str],
        memory_mb: int,
        max_processes: int,
        profiler: bool = False,
        spin_s: float = 0.0,
        doorbell: bool = True,
        devices: list[str] = (),
    ):
        self.zygote, self.folder, self.device = zygote, folder, device
        self.spin_s, self.doorbell = spin_s, doorbell
        self.fastest: dict[tuple[int, int], float] = {}  # per timed step and size, its quickest answer
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        self.memory_kb, self.max_processes = memory_mb * 1024, max_processes
        spec = {
            "role": "contestant",
            "cwd": str(folder),
            "env": contestant_env(folder, threads),
            "log": str(folder / "contestant.log"),
            "device": device,
            "threads": threads,
            "profiler": profiler,
            "spin_s": spin_s,
            "sandbox": None
            if hidden is None
            else {"write": [str(folder)], "read": readable, "hidden": hidden, "devices": list(devices)},
        }
        self.pid, self.channel = zygote.spawn(spec)
        self.arenas: dict[str, exchange.Arena | None] = {"in": None, "out": None}
        self.sandbox: str | None = None
        self.killed = False
        self.bell: doorbell.Bell | None = None
        self.owed: list[str] = []  # nonces of the commands sent whose replies are not read yet
        self.read_ahead: list[dict] = []  # replies read while a timed step's notice was awaited (ring), in order

    def ready(self) -> None:
        if self.sandbox is None:
            reply = self.collect("start", READY_TIMEOUT_S)
            if not reply.get("ok"):
                raise RunnerFailed("crash", "start", reply.get("error", "contestant did not start"))
            self.sandbox = reply["sandbox"]
            self.startup_s = float(reply.get("startup_s") or 0.0)
            if self.spin_s > 0 and self.doorbell:  # the timed steps are signalled on a doorbell both ends spin on
                bell = doorbell.Bell()
                if self.ask({"op": "bell"}, "start", 60.0, [bell.fd]).get("ok"):
                    self.bell = bell
                else:
                    bell.close()

    def ask(
        self,
        message: dict,
        stage: str,
        timeout: float,
        fds: list[int] = (),
        spin: bool = False,
        after_launch: float | None = None,
    ) -> dict:
        """Send a command, wait for its reply under a deadline; kill the process over a limit. `spin`: a timed
        command, whose reply is awaited without sleeping (procs.Channel.recv). `after_launch`: a call whose
        deadline shrinks to this many seconds once its forward has returned (procs.await_reply)."""
        if self.owed:
            raise RuntimeError(f"{len(self.owed)} replies not read before a new command")
        if after_launch is not None:
            message = {**message, "launched": True}
        self.send(message, stage, fds)
        return self.collect(stage, timeout, spin, after_launch)

    def send(self, message: dict, stage: str, fds: list[int] = ()) -> None:
        """Send a command whose reply `collect` reads later (replies come in the order of their commands)."""
        nonce = secrets.token_hex(8)
        try:
            self.channel.send({**message, "nonce": nonce}, fds)
        except (BrokenPipeError, ConnectionResetError):
            raise RunnerFailed("crash", stage, procs.describe_exit(self.zygote.wait(self.pid, 5.0))) from None
        self.owed.append(nonce)

    def collect(self, stage: str, timeout: float, spin: bool = False, after_launch: float | None = None) -> dict:
        """The reply to the oldest command sent (the ready message, before any); a timed step's notices (`noticed`)
        are passed over, a second one included (a candidate's harness can send any)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.read_ahead:
                reply = self.read_ahead.pop(0)
            else:
                left = max(0.0, deadline - time.monotonic())
                reply = self._receive(stage, left, self.spin_s if spin else 0.0, after_launch)
            if not is_notice(reply):
                break
        if self.owed and reply.get("nonce") != self.owed.pop(0):  # a reply written before the command was read
            self.end()
            raise RunnerFailed("protocol", stage, "a reply that does not answer the command sent")
        return reply

    def _receive(self, stage: str, timeout: float, spin_s: float = 0.0, after_launch: float | None = None) -> dict:
        """The next message on the socket, within the limits (procs.await_reply)."""
        try:
            return procs.await_reply(
                self.channel,
                self.zygote,
                self.pid,
                timeout,
                self.memory_kb,
                self.max_processes,
                spin_s=spin_s,
                after_launch=after_launch,
            )
        except procs.Stopped as err:
            raise RunnerFailed(err.kind, stage, err.detail, err.seconds) from None

    def ring(
        self,
        slot: int,
        answer: int,
        message: dict,
        payload: list[int] | None,
        stage: str,
        size: int = 0,
        timeout: float = 600.0,
    ) -> float | None:
        """A timed step: ring `slot` on the doorbell with a fresh token and send the same command over the socket;
        spin until the contestant rings `answer` with that token. When it did, or None (no answer there within the
        spin: the reply on the socket ends the step). The reply is left to `collect`. Without a doorbell, the
        contestant's notice on the socket ends the step instead (`noticed`).
        Before spinning, the referee sleeps through the first part of the step (doorbell.idle_s), as judged by the
        quickest answer to the same step of the same `size` (calls in the batch) so far: a spinning core slowed the
        contestant's own by up to 4x on virtual machines whose cores share physical ones."""
        token = secrets.randbits(62)
        if self.bell is not None:
            self.bell.ring(slot, token, payload)
        begin = time.perf_counter()
        self.send({**message, "token": token}, stage)
        if self.bell is None:
            return self.noticed(token, stage, timeout)
        step = (slot, size)
        idle = doorbell.idle_s(self.fastest.get(step))
        if idle > 0:
            time.sleep(idle)
        answered = self.bell.await_token(answer, token, self.spin_s, self.channel.sock)
        if answered is not None:
            self.fastest[step] = min(self.fastest.get(step, math.inf), answered - begin)
        return answered

    def noticed(self, token: int, stage: str, timeout: float) -> float:
        """When the step of `token` was answered on the socket: its notice (`{"answered": token}`, sent before the
        reply), or the command's reply itself where none came first (a failed step). What else is read on the way
        (replies to earlier commands, that reply) is kept for `collect`; notices of other tokens are passed over."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._receive(stage, max(0.0, deadline - time.monotonic()), self.spin_s)
            at = time.perf_counter()
            if is_notice(frame):
                if frame["answered"] == token and frame["nonce"] == self.owed[-1]:
                    return at
                continue
            self.read_ahead.append(frame)
            if frame.get("nonce") == self.owed[-1]:
                return at

    def arena(self, slot: str, nbytes: int, stage: str) -> exchange.Arena:
        """The arena of this slot, replaced by a larger one (and shared again) when it is too small."""
        current = self.arenas[slot]
        if current is not None and current.nbytes >= nbytes:
            return current
        fresh = exchange.Arena(self.device, nbytes)
        message, fds = fresh.share()
        reply = self.ask({"op": "arena", "slot": slot, **message}, stage, 60.0, fds)
        if not reply.get("ok"):
            fresh.close()
            raise RunnerFailed("crash", stage, f"could not map shared memory: {reply.get('error')}")
        if current is not None:
            current.close()
        self.arenas[slot] = fresh
        return fresh

    def memory_used_kb(self) -> int:
        return procs.session_usage(self.pid)[1]

    def kill(self) -> None:
        """Kill the process (its whole session) without waiting for it: `end` finishes."""
        if self.pid and not self.killed:
            self.zygote.kill(self.pid)
            self.killed = True

    def end(self) -> None:
        """Kill the process (its whole session) and wait until it is gone, then free its arenas and folder."""
        if self.pid:
            self.kill()
            self.zygote.wait(self.pid, 30.0)
            self.channel.close()
            self.pid = 0
        if self.bell is not None:
            self.bell.close()
            self.bell = None
        for slot, arena in self.arenas.items():
            if arena is not None:
                arena.close()
            self.arenas[slot] = None
        shutil.rmtree(self.folder, ignore_errors=True)

"""The referee: the trusted process that judges candidates on one device (one GPU, or the CPU).

`python -m concur.verify.referee <fd>` takes jobs from the orchestrator over its socket and answers each with a report
of what it measured (concur.verify.report; concur.verify.verdict decides). Per job it never runs a line of the
candidate's code itself: the reference and the candidate each run in a contestant process (concur.verify.contestant)
forked from its zygote, sandboxed, on views of arenas it owns. It draws every input itself (on the device, from seeds
only it knows in hardened mode), keeps the reference's outputs and its private copy of the inputs, compares, and times
both models with its own clock (concur.verify.timing), each side alone, the other stopped (`alone`); a candidate process
is killed as its job ends, and gone, with every process it started, before another contestant is taken or anything is
timed: a leftover that cannot be killed fails the job instead (`settle`), and so does a scheduling change to the judging
processes that cannot be undone (`guard`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import NoReturn

from concur.text import describe
from concur.verify import doorbell, exchange, procs, sandbox
from concur.verify.reference import CallFailed
from concur.verify.report import Failure, Report
from concur.verify.runner import Runner, RunnerFailed

SPIN_S = 0.2  # timed replies are awaited without sleeping, on cores of the referee's own (procs.Channel.recv)
# drain: a probe on a clean device answered in 13-84 us (H200), one behind another context's kernels in 0.9-2.4 ms
PROBES, PROBE_FACTOR, PROBE_FLOOR_MS = 21, 10.0, 0.2  # the clean bar: 10x the clean median, at least 0.2 ms
DRAIN_CLEAN = 3  # probes in a row within it: a device free of another context's work


class DeviceBusy(CallFailed):
    """The device still ran other work long after every other side was stopped (Referee.drain); raised out of a
    job only once the candidate is gone and the work with it (Referee.alone): it was the candidate's."""


def split_cores(cpus: list[int] | None, threads: int) -> tuple[list[int], list[int]]:
    """(active, spare): the cores for this referee and the contestant it times, and the cores on which the next
    contestants start (CUDA and CUPTI start-up takes seconds of CPU). Nothing is split on fewer than 4 cores."""
    if not cpus or len(cpus) < 4:
        return [], []
    active = max(3, min(threads + 2, len(cpus) // 2))
    return list(cpus[:active]), list(cpus[active:])


def siblings(core: int) -> set[int]:
    """The hardware threads that share `core`'s physical core (SMT), itself excluded; none where the system does
    not say (a virtual machine may not)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return set()
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found - {core}


def timing_core(active: list[int]) -> tuple[int | None, list[int]]:
    """(main, rest) on a GPU: the core on which the judged side's main thread runs, the same for the reference and
    every candidate, and the cores for everything else of the referee and the judged side, main's SMT siblings left
    out. A microsecond kernel's time is mostly its side's launches, at the pace of the core that makes them; cores
    of a virtual machine differ in pace, so two sides on two cores would differ by their cores, not their kernels.
    No main core (None, active) on fewer than 3 cores."""
    if len(active) < 3:
        return None, list(active)
    main = active[-1]
    rest = [c for c in active if c != main and c not in siblings(main)]
    return main, rest or [c for c in active if c != main]


class Referee:
    def __init__(self, hello: dict):
        self.device = hello["device"]
        self.workdir = Path(hello["workdir"])
        self.cache_root = Path(hello["cache_root"])
        self.threads, self.workers = int(hello["threads"]), int(hello["workers"])
        self.confine = bool(hello.get("confine", True))
        self.active, self.spare = split_cores(hello.get("cpus"), self.threads)
        # hardened on a GPU: a timed side's main thread on a core of its own, the same for both sides (`place`)
        self.pin = str(hello.get("launch_core") or "off") if self.device == "cuda" else "off"  # orchestrate.LAUNCH_CORE
        self.main_core, self.rest = timing_core(self.active) if self.pin != "off" else (None, self.active)
        if self.rest:  # this process and the contestant being judged never share cores with starting ones
            os.sched_setaffinity(0, self.rest)
        self.cores, self.nice = os.sched_getaffinity(0), os.getpriority(os.PRIO_PROCESS, 0)
        self.doorbell = bool(hello.get("doorbell", True))  # off: timed steps on the socket alone (benchmarks)
        self.profiler = bool(hello.get("profiler", False))  # hardened jobs on CUDA profile their candidates
        # every contestant profiles (hardened): the profiler's imports are made once, in the zygote
        zygote_env = {
            "CUDA_MODULE_LOADING": "LAZY",
            "CONCUR_PRELOAD_INDUCTOR": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(self.workdir / "inductor"),
        }
        if self.spare:
            zygote_env["CONCUR_CPUS"] = ",".join(map(str, self.spare))
        if self.device == "cuda":
            # the CUDA driver does not start in a new PID namespace (cudaGetDeviceCount: error 304, on an H100 node):
            # on a GPU the subreaper's tree kill, the scheduling filter and the judges' guard hold instead
            # (docs/verifier.md, Processes a candidate starts)
            zygote_env["CONCUR_NO_PIDNS"] = "1"
        self.zygote = procs.Zygote(str(self.workdir / "zygote.log"), env=zygote_env)
        import torch

        self.torch = torch
        torch.set_num_threads(self.threads)
        self.label = "cpu"
        self.flush_buffer = None
        self.gpu_nodes: list[str] = []  # the device files its contestants may open: this GPU's, no other's
        self.arena_budget = exchange.arena_budget(None)
        if self.device == "cuda":
            torch.cuda.init()
            props = torch.cuda.get_device_properties(0)
            self.arena_budget = exchange.arena_budget(props.total_memory)
            self.label = f"cuda:{props.name}"
            uuid = str(getattr(props, "uuid", ""))
            minor = sandbox.gpu_minor(uuid) if uuid else None
            self.gpu_nodes = sandbox.gpu_nodes(minor)
            if minor is not None:  # confined to its node, a contestant knows its GPU by UUID
                os.environ["CUDA_VISIBLE_DEVICES"] = sandbox.cuda_name(uuid)
            self.flush_buffer = torch.empty(
                2 * (getattr(props, "L2_cache_size", 0) or 64 << 20), dtype=torch.uint8, device="cuda"
            )
        self.pool: deque[Runner] = deque()
        self.ending: list[Runner] = []  # killed, not yet known gone: `settle` waits for them before anything is timed
        self.judged: list[Runner] = []  # taken, not dismissed: placed on the cores by `place`
        self.timing = 0  # `quiet` stretches entered and not left
        self.serial = 0
        self.task = None
        self.probe_cell = torch.zeros(1, device="cuda") if self.device == "cuda" else None
        self.clean_probe_ms: float | None = None  # drain's bar (calibrate_drain)
        self.positions = torch.Generator(device="cuda" if self.device == "cuda" else "cpu")
        self.positions.manual_seed(secrets.randbits(63))
        self.refill()

    # ------------------------------------------------------------ contestants

    def spawn(self, memory_mb: int, max_processes: int = 64) -> Runner:
        self.serial += 1
        folder = self.workdir / "contestants" / f"{os.getpid()}-{self.serial}"
        hidden = [str(self.workdir), str(self.cache_root)] if self.confine else None
        return Runner(
            self.zygote,
            folder,
            self.device,
            self.threads,
            hidden,
            [str(self.cache_root)],
            memory_mb,
            max_processes,
            self.profiler,
            SPIN_S if self.active else 0.0,
            self.doorbell,
            self.gpu_nodes,
        )

    def refill(self, memory_mb: int = 16384, max_processes: int = 64) -> None:
        while len(self.pool) < self.workers:
            self.pool.append(self.spawn(memory_mb, max_processes))

    @contextlib.contextmanager
    def quiet(self):
        """While a side is timed, the contestants waiting in the pool are stopped (SIGSTOP): one that is starting
        creates its CUDA context and starts CUPTI, which slowed timed kernels on the same GPU by 10-200% for
        seconds. Their start resumes afterwards; none of them has loaded a program yet. The judged sides are placed
        for timing (`place`) for the outermost stretch."""
        self.settle()
        stopped = procs.stop_all([runner.pid for runner in self.pool])
        self.timing += 1
        if self.timing == 1:
            self.place(timing=True)
        try:
            yield
        finally:
            self.timing -= 1
            if not self.timing:
                self.place(timing=False)
            procs.resume_all(stopped)

    def dismiss(self, runner: Runner) -> None:
        """Kill a judged candidate and go on: its GPU context is torn down while the next job is sent, and `settle`
        waits until it is gone before another contestant is taken or anything is timed (a dying context's kernels
        still run)."""
        runner.kill()
        self.ending.append(runner)
        if runner in self.judged:
            self.judged.remove(runner)

    def settle(self) -> None:
        """Every dismissed contestant gone, and every process one left behind (none survives its contestant where
        PID namespaces are allowed; elsewhere the zygote kills its tree): nothing is timed beside a leftover. One
        that cannot be killed fails the job, and so does any job while it lives. Then `guard`."""
        while self.ending:
            self.ending.pop().end()
        left = self.zygote.clear_leftovers()
        if left:
            raise RuntimeError(f"processes left by an earlier candidate could not be killed ({left}): not timed")
        self.guard()

    def guard(self) -> None:
        """The judging processes' scheduling as it was set: this process's cores and nice value on each of its
        threads, and the nice value of the task's reference (its cores are set by `place`). A candidate in a PID
        namespace cannot name them; elsewhere (same user) it could re-nice or pin them. Cores are set back; a nice
        value raised by someone else cannot be lowered again without privilege, so the job fails rather than time
        beside it."""
        runners = [self.task.runner] if self.task is not None and getattr(self.task, "runner", None) else []
        changed = []
        for pid in [os.getpid(), *[r.pid for r in runners if r.pid]]:
            for tid in threads_of(pid):
                with contextlib.suppress(OSError):
                    if pid == os.getpid() and os.sched_getaffinity(tid) != self.cores:
                        os.sched_setaffinity(tid, self.cores)
                    if os.getpriority(os.PRIO_PROCESS, tid) != self.nice:
                        try:
                            os.setpriority(os.PRIO_PROCESS, tid, self.nice)
                        except OSError:
                            changed.append(tid)
        if changed:
            raise RuntimeError(f"the judging processes were re-niced (threads {changed}) and cannot be set back")

    def take(self, memory_mb: int, max_processes: int) -> Runner:
        self.settle()
        runner = self.pool.popleft() if self.pool else self.spawn(memory_mb, max_processes)
        runner.memory_kb, runner.max_processes = memory_mb * 1024, max_processes
        runner.ready()
        if self.rest:
            procs.move_threads(runner.pid, self.rest)
        if self.main_core is not None and self.pin == "taken":  # threads it starts from now on start there too
            with contextlib.suppress(OSError):
                os.sched_setaffinity(runner.pid, [self.main_core])
        self.judged.append(runner)
        return runner

    def place(self, timing: bool) -> None:
        """Where the judged sides (the reference and candidates taken, not dismissed) run when a launch core is set
        apart (`timing_core`): every thread on the rest of the cores, and while a side is timed, each side's main
        thread on the launch core. Only then: threads and compile workers a side starts at other times, which
        inherit its main thread's cores, keep the rest."""
        if self.main_core is None or self.pin == "taken":  # "taken": placed once, by `take`
            return
        self.judged = [r for r in self.judged if r.pid and os.path.isdir(f"/proc/{r.pid}")]
        for runner in self.judged:
            procs.move_threads(runner.pid, self.rest)
            if timing:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(runner.pid, [self.main_core])

    # ------------------------------------------------------------ inputs and outputs

    def draw(self, task, seed: int, kind: str) -> list:
        """get_inputs() under `seed`, made on the device (fast, and no host memory for large tasks); `signed` trials
        draw from signed distributions. On a GPU the numbers differ from a CPU draw of the same seed."""
        torch = self.torch
        torch.manual_seed(seed)
        if self.device == "cuda":
            torch.cuda.manual_seed_all(seed)
        with other_distributions(torch) if kind == "signed" else contextlib.nullcontext(), torch.device(self.device):
            values = list(task.namespace["get_inputs"]())
        values = [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]
        if getattr(task, "dtype", None) is not None:  # the task's precision, cast as KernelBench casts
            values = [v.to(task.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]
        return values

    def stage(self, runner: Runner, calls: list[list], stage: str) -> list[list[dict]]:
        """Write each call's inputs into the runner's input arena; returns their specs."""
        specs = self.layout(runner, calls, stage)
        self.write(runner, calls, specs)
        return specs

    def layout(self, runner: Runner, calls: list[list], stage: str) -> list[list[dict]]:
        """Where each call's inputs go in the runner's input arena (grown if need be); nothing is written yet."""
        specs, end = [], 0
        for values in calls:
            spec = exchange.specs_of(values)
            end = exchange.place(spec, end)
            specs.append(spec)
        runner.arena("in", end, stage)
        return specs

    def write(self, runner: Runner, calls: list[list], specs: list[list[dict]]) -> None:
        """The inputs into the arena, and wait for them. On a GPU by kernels of this process's context, which no
        kernel of the contestant's context runs beside (exchange.write)."""
        exchange.write(runner.arenas["in"].bytes, [s for spec in specs for s in spec], [v for c in calls for v in c])
        self.sync()

    def staged(self, calls: list[list], specs: list[list[dict]]) -> tuple:
        """(buffer, calls): a timed batch's inputs laid out as `write` lays them out in the arena, in a buffer of
        this process, before the clock starts (exchange.staging), and the calls' inputs as views of it (the drawn
        tensors freed once copied); the clock then times one copy of it (write_staged), which the
        device's pace sets, not the host's: a microsecond task's batch has hundreds of tensors. (None, calls) where
        its tensors are large (exchange.STAGE_TENSOR_BYTES): few, each written at the device's pace already."""
        flat = [s for spec in specs for s in spec]
        tensors = [s for s in flat if s["t"] == "tensor"]
        end = max((s["off"] + exchange.nbytes(s) for s in tensors), default=0)
        if end == 0 or end > exchange.STAGE_TENSOR_BYTES * len(tensors):
            return None, calls
        buffer = exchange.staging(flat, [v for c in calls for v in c], end, self.torch.device(self.device))
        view = lambda spec, value: exchange.view(buffer, spec) if spec["t"] == "tensor" else value  # noqa: E731
        return buffer, [[view(s, v) for s, v in zip(spec, call)] for spec, call in zip(specs, calls)]

    def write_staged(self, runner: Runner, staged) -> None:
        """A staged batch into the runner's arena, and wait for it (exchange.write_span)."""
        exchange.write_span(runner.arenas["in"].bytes, staged)
        self.sync()

    def handoff(
        self, runner: Runner, metas: list[list[dict]], stage: str, timeout: float, start: int = 0, grow: bool = True
    ) -> tuple[list, float]:
        """Have the runner copy its kept outputs into its output arena, from `start` plus a random offset; returns
        the outputs as views of the arena, and the seconds the hand-off took. Views from earlier hand-offs stay
        valid unless the arena has to grow (`grow=False` refuses to)."""
        _, end = exchange.handoff_layouts(metas, start)
        current = runner.arenas["out"]
        if not grow and (current is None or current.nbytes < end + exchange.OUT_SLACK):
            raise CallFailed("no room in the output arena")
        arena = runner.arena("out", end + exchange.OUT_SLACK, stage)
        layouts, _ = exchange.handoff_layouts(metas, start, self.offset())
        begin = time.perf_counter()
        reply = runner.ask({"op": "handoff", "specs": layouts}, stage, timeout, spin=True)
        seconds = time.perf_counter() - begin
        if not reply.get("ok"):
            raise CallFailed(reply.get("error", "hand-off failed"))
        return [exchange.values_of(arena.bytes, layout) for layout in layouts], seconds

    def timed_handoff(
        self, runner: Runner, timeout: float, go_reply: dict | None, land=None, n: int = 0, since: float | None = None
    ) -> dict:
        """A timed batch's hand-off, rung on the doorbell right as its forward ended: the runner lays its outputs out
        itself from a random offset (exchange.handoff_layouts). Its clock runs from `since`, when the forward's clock
        stopped, so the two spans meet: work a candidate left running past its ring is timed even while the referee
        is between them (a core preempted there for milliseconds, where the quickest batch would otherwise reward
        it). The clock stops only once `land(offset)` (the referee reading what it checks of the outputs) has run on
        the device: a kernel the candidate left running past its answer delays that reading, since the GPU runs one
        process's kernels at a time, and is timed; one launched after it finds the sample taken. The output arena is
        sized beforehand; the forward's reply is read only now. Returns the forward's reply, the hand-off's, the
        offset, what `land` returned, the seconds the hand-off took, whether it was answered on the doorbell
        (`rung`), and when it was asked and answered (`sent_at`, `replied_at`)."""
        base = self.offset()
        begin = time.perf_counter()
        since = begin if since is None else since
        message = {"op": "handoff", "start": 0, "base": base}
        rung = runner.ring(doorbell.HANDOFF, doorbell.HANDED, message, [0, base], "timing", n, timeout)
        if rung is None:
            go_reply = go_reply or runner.collect("timing", timeout)
            reply = runner.collect("timing", timeout, spin=True)
        landed = land(base) if land is not None else None
        self.sync()
        end = time.perf_counter()
        if rung is not None:
            go_reply = go_reply or runner.collect("timing", timeout)
            reply = runner.collect("timing", timeout)
        return {"go": go_reply, "handoff": reply, "base": base, "landed": landed, "seconds": end - since,
                "rung": rung is not None and runner.bell is not None, "sent_at": begin,
                "replied_at": end}  # fmt: skip

    def offset(self) -> int:
        """Where in its room a hand-off lands: chosen as it is asked for, so it cannot be written in advance."""
        return secrets.randbelow(exchange.OUT_SLACK // exchange.ALIGN) * exchange.ALIGN

    def hold(self, runner: Runner) -> list[int]:
        """On the CPU, every contestant's process stopped, the runner's children and orphans included (their threads
        could read the arena while it is written, on cores of their own); on a GPU nothing: the inputs are on the
        device, where only kernels reach them."""
        return procs.stop_descendants(self.zygote.proc.pid) if self.device == "cpu" else []

    def release(self, held: list[int]) -> None:
        procs.resume_all(held)

    @contextlib.contextmanager
    def alone(self, runner: Runner, limit_s: float):
        """While one judged side is timed (`runner`): every other judged side's processes stopped, their children
        and orphans too (procs.stop_tree), so nothing of them runs on a core or launches (an idle side's harness,
        waiting for its next command, spins on the launch core); then the device drained of what they left running
        (`drain`). Yields a list holding the milliseconds the drain waited."""
        others = [other for other in self.judged if other is not runner and other.pid]
        held = [pid for other in others for pid in procs.stop_tree(other.pid)]
        try:
            try:
                waited = self.drain(limit_s)
            except DeviceBusy:
                self.blame(limit_s)
            yield [waited]
        finally:
            self.release(held)

    def blame(self, limit_s: float) -> NoReturn:
        """Whose work kept the device busy past the drain's limit: every judged candidate is dismissed and settled
        (killed, waited for, and whatever its tree left behind killed too: a process's context, and the work queued
        in it, goes with it) and the device drained again. Clean now, the work was the candidate's: DeviceBusy, a
        failure of its timing. Still busy, it is another process's on this GPU: RunnerFailed("referee"), the
        verifier's own failure (verdict `verifier: …`), never the candidate's."""
        for candidate in [r for r in self.judged if self.task is None or r is not self.task.runner]:
            self.dismiss(candidate)
        self.settle()
        try:
            self.drain(limit_s)
        except DeviceBusy:
            raise RunnerFailed(
                "referee",
                "timing",
                f"the GPU stayed busy {limit_s:.0f} s with the candidate gone: another process "
                "is using it, nothing was judged",
            ) from None
        raise DeviceBusy(
            f"work the candidate left on the device kept it busy {limit_s:.0f} s (gone with the candidate)"
        )

    def calibrate_drain(self) -> None:
        """Once, with nothing else on the device (at a task's setup, the pool stopped): the round trip of a probe
        on a clean device, which sets `drain`'s bar."""
        if self.device != "cuda" or self.clean_probe_ms is not None:
            return
        self.probe()
        times = sorted(self.probe() for _ in range(PROBES))
        self.clean_probe_ms = max(PROBE_FACTOR * times[len(times) // 2], PROBE_FLOOR_MS)

    def probe(self) -> float:
        """Milliseconds for a one-element kernel of this process to run and be waited for."""
        begin = time.perf_counter()
        self.probe_cell.add_(1)
        self.torch.cuda.synchronize()
        return 1000.0 * (time.perf_counter() - begin)

    def drain(self, limit_s: float) -> float:
        """On a GPU, with the other sides stopped (`alone`): wait until the device runs this process's work at once,
        DRAIN_CLEAN probes in a row each answered within the clean bar (calibrate_drain). The GPU runs one context's
        kernels at a time and switches between contexts with work every timeslice (2.4 ms on the H200 measured), so
        a probe waits while another context's kernels run or are queued: whatever a stopped candidate left on the
        device, which would otherwise run beside the reference's next batch. Returns the milliseconds waited before
        the clean probes (0 on a clean device, and on the CPU, where the stopped processes are all there is).
        Raises DeviceBusy past `limit_s`."""
        if self.device != "cuda" or self.clean_probe_ms is None:
            return 0.0
        begin = time.perf_counter()
        clean = 0.0
        run = 0
        while run < DRAIN_CLEAN:
            took = self.probe()
            run, clean = (run + 1, clean + took) if took <= self.clean_probe_ms else (0, 0.0)
            if run < DRAIN_CLEAN and time.perf_counter() - begin > limit_s:
                raise DeviceBusy(
                    f"the device was still running other work {limit_s:.0f} s after the other side was stopped (work "
                    "it left on the device, or another process on this GPU)"
                )
        return max(0.0, 1000.0 * (time.perf_counter() - begin) - clean)

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def flush(self) -> None:
        """Cold caches for the next timed batch: persisting L2 lines made normal, then 2x L2 overwritten."""
        if self.flush_buffer is not None:
            exchange.driver().reset_persisting_l2()
            self.flush_buffer.zero_()
            self.sync()

    # ------------------------------------------------------------ jobs

    def evaluate(self, job: dict) -> Report:
        from concur.verify import evaluation

        return evaluation.evaluate(self, job)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.settle()
        if self.task is not None:
            self.task.close()
        for runner in self.pool:
            runner.end()
        self.zygote.close()


def threads_of(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


@contextlib.contextmanager
def other_distributions(torch):
    """get_inputs() with torch.rand drawing from [-1, 1) and torch.randn twice as wide: the same structure (a
    triangular mask stays triangular) on values of both signs and larger magnitude."""
    originals = {name: getattr(torch, name) for name in ("rand", "rand_like", "randn", "randn_like")}
    torch.rand = lambda *a, **k: originals["rand"](*a, **k).mul_(2).sub_(1)
    torch.rand_like = lambda *a, **k: originals["rand_like"](*a, **k).mul_(2).sub_(1)
    torch.randn = lambda *a, **k: originals["randn"](*a, **k).mul_(2)
    torch.randn_like = lambda *a, **k: originals["randn_like"](*a, **k).mul_(2)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def serve(fd: int) -> int:
    sandbox.hide_memory()
    channel = procs.Channel(socket.socket(fileno=fd))
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    hello, _ = channel.recv()
    try:
        referee = Referee(hello)
    except BaseException as err:
        channel.send({"ok": False, "error": describe(err)})
        return 1
    channel.send({"ok": True, "device": referee.label, "landlock": sandbox.landlock_abi()})
    try:
        while True:
            try:
                message, _ = channel.recv()
            except procs.ChannelClosed:
                break
            if message.get("op") == "quit":
                break
            try:
                report = referee.evaluate(message["job"])
            except BaseException as err:  # a bug here must not look like the candidate's fault
                import traceback

                traceback.print_exc()
                report = Report(failure=Failure("referee", "evaluate", describe(err)))
            channel.send({"report": report.to_data()})
    finally:
        referee.close()
    return 0


def _exit_with_parent(parent: int) -> None:
    """The orchestrator died without saying goodbye (killed): leave now; the zygote kills the contestants when
    this process's end of its socket closes."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))

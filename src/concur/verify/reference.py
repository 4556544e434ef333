"""A task's reference on the referee: its program, the contestant that runs it, and what is measured of it once.

Everything that fails while the reference runs (its program raising, its process dying) is the task's failure,
never a candidate's: `reference_side` turns such failures into ReferenceFailed, which every candidate of the task
reports as `reference: ...`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from typing import TYPE_CHECKING

from concur import contracts
from concur.text import describe
from concur.verify import comparisons, doorbell, exchange, modes, procs, timing
from concur.verify.build import exec_program
from concur.verify.report import Baseline
from concur.verify.runner import RunnerFailed

if TYPE_CHECKING:
    from concur.verify.referee import Referee

SEED = 42
CALL_FLOOR_S, CALL_FACTOR, FIRST_CALL_EXTRA_S = 5.0, 100.0, 10.0  # a call's deadline, from the reference's time
FLOOR_CALLS = 64
OWN_FACTOR = 10.0  # and from the candidate's own slowest call: what a busier machine may stretch it by
HOTSPOTS = 5  # names of the reference's profile kept in a verdict
FLOOR_MAX_BYTES = 256 << 20  # write_floor_ms fills at most this much and scales
FLOOR_BATCHES = 5  # batches of fills that find the least time writing a task's outputs takes (write_floor_ms)
PROFILE_EXTRA_S = 30.0  # on top, for a profiled call: the profiler's start and the reading of its events
LOAD_FLOOR_S = 60.0
REFERENCE_MEMORY_MB = 65536
FP64_MAX_BYTES = 4 << 30  # the float64 check runs for tasks whose inputs and outputs take at most this much


class ReferenceFailed(Exception):
    """The task's own program failed: every candidate of the task gets the same runtime error."""


class CallFailed(Exception):
    """A command the contestant answered with an error (its exception, or a CUDA fault)."""


class TaskState:
    """A task's reference program, loaded in the referee (for get_inputs) and in a reference contestant."""

    def __init__(self, referee, job: dict):
        self.key = task_key(job)
        self.code = job["reference"]
        self.mode = modes.of(job["settings"])
        self.precision = job["settings"].get("precision") or "fp32"
        self.dtype = None  # the dtype floating inputs are drawn in (referee.draw): None for fp32, drawn as written
        self.baselines: dict[str, Baseline] = {}  # what the reference took under each compiled baseline (baselines.py)
        self.referee, self.runner, self.error = referee, None, None
        self.meta = self.kb_times = self.profile = None
        self.stochastic = True
        self.degenerate: list[str] | None = None  # the probe's answer, once per task
        self.call_ms = None
        self.jitter_ms = timing.JITTER_FLOOR_MS  # how much the round trip of an empty batch varies
        self.calls = 1  # per timed batch (hardened)
        self.hotspots = ""  # where the reference's time goes, from its profile (hardened; hotspots)
        self.floor_ms: float | None = None  # the least time a call writing its outputs takes here (write_floor_ms)
        self.setup_s: dict[str, float] = {}  # where setting the task up went (benchmarks); emptied once reported
        self.has_double = None
        self.signed_finite: bool | None = None  # the reference's outputs finite on signed inputs (measure.signed_ok)
        self.writes: set[int] = set()  # positions of inputs its own calls changed: an in-place program's
        self.init: list = []
        self.init_crosses = True  # the init inputs cross as plain data; else each side makes its own (init_inputs)
        try:
            self.namespace = exec_program(job["reference"], "reference.py", "concur_reference_" + self.key[:12])
            missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in self.namespace]
            if missing:
                raise NameError(f"reference does not define {', '.join(missing)}")
            torch = referee.torch
            if self.precision != "fp32":
                self.dtype = getattr(torch, contracts.PRECISIONS[self.precision])
            torch.manual_seed(SEED)
            self.init = list(self.namespace["get_init_inputs"]())
            self.init_crosses = crosses(self.init)
        except BaseException as err:
            self.error = describe(err)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.end()
            self.runner = None
        if self.referee.device == "cuda":  # the next task's tensors have other sizes: give the cached blocks back
            self.referee.torch.cuda.empty_cache()


def crosses(values: list) -> bool:
    """Whether values can cross to a contestant as plain data (tensors, numbers, strings and lists of them)."""
    try:
        exchange.specs_of(values)
    except (TypeError, ValueError):
        return False
    return True


def init_inputs(referee: Referee, task: TaskState, runner, stage: str) -> tuple[list, str | None]:
    """How a side gets the task's init inputs: (specs in its input arena, None) where they cross as plain data;
    else ([], a copy of the task's program in its folder), from which the side calls get_init_inputs itself under
    the same seed as the referee did (KernelBook's programs pass config objects and modules to __init__). The init
    inputs only make a side's own model, so what the side could do to them changes no verdict but its own."""
    if not task.init:
        return [], None
    if task.init_crosses:
        return referee.stage(runner, [task.init], stage)[0], None
    program = runner.folder / "task_init.py"
    program.write_text(task.code)
    return [], str(program)


def task_key(job: dict) -> str:
    settings = job["settings"]
    parts = [job["task_id"], job["reference"], settings["mode"], settings.get("precision") or "fp32"]
    return hashlib.sha256("\0".join(parts + sorted(settings.get("baselines") or [])).encode()).hexdigest()


def limit(deadline: float, seconds: float) -> float:
    """A step's time limit, within what is left of the candidate's own budget."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RunnerFailed("timeout", "evaluate", "time budget spent", 0.0)
    return min(seconds, left)


def call_timeout(task, calls: int, first: bool = False, own_s: float = 0.0) -> float:
    """A command's deadline: CALL_FACTOR times the reference's time for its calls, or OWN_FACTOR times the side's
    own slowest call so far (`own_s`: a correct kernel far slower than the reference is timed, not cut off where a
    busy machine stretches its batch past the reference's deadline), at least CALL_FLOOR_S for every
    FLOOR_CALLS of them (a batch grown for the clock's resolution leaves a slow honest candidate the same time a
    call that a batch of FLOOR_CALLS gave it). The candidate's `timeout_s` bounds them all (limit)."""
    floor = CALL_FLOOR_S * max(1.0, calls / FLOOR_CALLS)
    paced = max(CALL_FACTOR * task.call_ms / 1000.0, OWN_FACTOR * own_s) * calls
    return max(floor, paced) + (FIRST_CALL_EXTRA_S if first else 0.0)


def task_for(referee: Referee, job: dict) -> TaskState:
    if referee.task is None or referee.task.key != task_key(job):
        if referee.task is not None:
            referee.task.close()
        referee.task = TaskState(referee, job)
        if referee.task.error is None:
            try:
                setup_reference(referee, referee.task, job["settings"])
                from concur.verify import baselines  # it times through measure, which imports this module

                baselines.setup(referee, referee.task, job["settings"])
            except (RunnerFailed, CallFailed, ReferenceFailed) as err:
                referee.task.error = str(err)
    if referee.task.error:
        raise ReferenceFailed(referee.task.error)
    return referee.task


@contextlib.contextmanager
def reference_side():
    """Whatever fails while the reference runs is the task's failure, never the candidate's."""
    try:
        yield
    except (RunnerFailed, CallFailed) as err:
        raise ReferenceFailed(str(err)) from None


def ref_ask(task, message: dict, stage: str, timeout: float = 600.0, spin: bool = False) -> dict:
    with reference_side():
        reply = task.runner.ask(message, stage, timeout, spin=spin)
    if not reply.get("ok"):
        raise ReferenceFailed(reply.get("error", f"{stage} failed"))
    return reply


def ref_handoff(referee: Referee, task: TaskState, metas: list) -> tuple[list, float]:
    with reference_side():
        return referee.handoff(task.runner, metas, "reference", 600.0)


class Clock:
    """Seconds per step into a dict: each call closes the step before it."""

    def __init__(self, into: dict):
        self.into, self.last = into, time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.into[step] = self.into.get(step, 0.0) + now - self.last
        self.last = now


def setup_reference(referee: Referee, task: TaskState, settings: dict) -> None:
    """Load Model in a contestant, measure one call, profile it (hardened), time it KernelBench's way
    (kernelbench mode): all before any candidate of the task runs."""
    clock = Clock(task.setup_s)
    task.runner = runner = referee.take(REFERENCE_MEMORY_MB, 256)
    clock("start")
    program = runner.folder / "reference.py"
    program.write_text(task.code)
    with reference_side():
        init, init_program = init_inputs(referee, task, runner, "reference")
    reply = ref_ask(
        task, load_message(settings, "reference", "Model", program, init, None, None, init_program), "reference"
    )
    if reply.get("error") or not reply.get("has_class"):
        raise ReferenceFailed(reply.get("error") or "no Model")
    clock("load")
    values = referee.draw(task, SEED, "random")
    with reference_side():
        specs = referee.stage(runner, [values], "reference")
    reply = ref_ask(task, {"op": "call", "calls": [{"args": specs[0], "seed": SEED}]}, "reference")
    task.meta = reply["outs"][0]
    ref_handoff(referee, task, reply["outs"])
    clock("first_call")
    samples = [ref_round(referee, task, [specs[0]])["go_ms"] for _ in range(3)]
    task.stochastic = stochastic(referee, task, specs[0])
    with referee.quiet():  # subtracted from every timed batch of the task
        task.overhead_ms, task.jitter_ms = overhead_ms(referee, task)
        referee.calibrate_drain()
    task.call_ms = sorted(samples)[1] - task.overhead_ms  # at or below 0 for calls quicker than the round trip
    task.input_bytes = sum(exchange.nbytes(s) for s in specs[0])
    task.output_bytes = sum(exchange.nbytes(s) for s in exchange.output_layout(task.meta, 0))
    task.memory_mb = runner.memory_used_kb() // 1024
    clock("calibrate")
    if task.input_bytes + task.output_bytes <= FP64_MAX_BYTES:  # room for the float64 output beside the float32 one
        with reference_side():
            runner.arena("out", 3 * task.output_bytes + 4 * exchange.OUT_SLACK, "reference")
    clock("arena")
    if task.mode.batches:
        with referee.quiet():
            task.calls = batch_calls(referee, task, specs[0])
        clock("calibrate")
    else:
        with referee.quiet():
            task.kb_times = ref_ask(task, kb_time_message(specs[0], settings), "reference")["times_ms"]
        clock("kb_time")
    if task.mode.profile:
        profiled = ref_ask(task, {"op": "profile", "args": specs[0]}, "reference")
        task.profile, task.hotspots = profiled["names"], hotspots(profiled.get("times") or {})
        clock("profile")
    with referee.quiet():
        task.floor_ms = write_floor_ms(referee, task.output_bytes, task.calls if task.mode.batches else 64)
    clock("floor")


def kb_time_message(specs: list[dict], settings: dict) -> dict:
    """KernelBench's timing of a side's model on one call's inputs (Contestant.kb_time): `warmup` calls, then
    `timing_trials` timed ones after one dropped."""
    trials = settings["timing_trials"]
    return {"op": "kb_time", "args": specs, "warmup": settings["warmup"], "trials": trials, "discard": 1}


def hotspots(times: dict[str, float], top: int = HOTSPOTS) -> str:
    """The `top` names a forward spent the most time in, with their shares of it: "name 61%; name 30%" (the
    verdict's `ref_hotspots`, which refinement feedback quotes)."""
    total = sum(times.values())
    if total <= 0:
        return ""
    ranked = sorted(times.items(), key=lambda item: -item[1])[:top]
    return "; ".join(f"{name} {100.0 * spent / total:.0f}%" for name, spent in ranked)


def write_floor_ms(referee: Referee, output_bytes: int, calls: int) -> float | None:
    """The least time per call that writing `output_bytes` takes on this device, one launch a call: `calls` fills
    back to back into one buffer (which stays in cache where it fits, so the floor is if anything too low), by CUDA
    events on a GPU and the host clock on the CPU (the referee's threads, as a contestant's), the quickest of
    FLOOR_BATCHES batches. Outputs past FLOOR_MAX_BYTES are filled that far and scaled (a write that long runs at the
    memory's bandwidth). None for outputs without tensor bytes (nothing a call must write)."""
    if output_bytes <= 0:
        return None
    torch = referee.torch
    cuda = referee.device == "cuda"
    size = min(output_bytes, FLOOR_MAX_BYTES)
    buffer = torch.empty(size, dtype=torch.uint8, device="cuda" if cuda else "cpu")
    best = math.inf
    for batch in range(FLOOR_BATCHES + 1):  # the first warms up
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        begin = time.perf_counter()
        for i in range(calls):
            buffer.fill_(i % 251)
        if cuda:
            end.record()
            end.synchronize()
            elapsed_ms = start.elapsed_time(end)
        else:
            elapsed_ms = 1000.0 * (time.perf_counter() - begin)
        if batch:
            best = min(best, elapsed_ms / calls)
    return best * output_bytes / size


def batch_calls(referee: Referee, task: TaskState, specs: list[dict]) -> int:
    """Calls per timed batch, from the time per call of a batch of back-to-back calls: a single call's time carries
    launch and wake-up latency of its own, which sized the batches of one task anywhere from 11 to 21 calls."""
    sized = lambda call_ms: timing.batch_size(  # noqa: E731
        call_ms, task.input_bytes, task.output_bytes, referee.arena_budget, timing.sized_ms(task.jitter_ms)
    )
    calls = sized(task.call_ms)
    if calls == 1:
        return 1
    times = [ref_round(referee, task, [specs] * calls)["go_ms"] for _ in range(2)]
    return sized(timing.per_call_ms(min(times), task.overhead_ms, calls))


def stochastic(referee: Referee, task: TaskState, specs: list[dict]) -> bool:
    """Whether the reference draws random numbers in forward (dropout, torch.rand): then every call is seeded, the
    same way for both models; otherwise timed calls skip the reseeding."""
    outputs = []
    for seed in (1, 2):
        reply = ref_ask(task, {"op": "call", "calls": [{"args": specs, "seed": seed}]}, "reference")
        got, _ = ref_handoff(referee, task, reply["outs"])
        outputs.append([o.clone() if isinstance(o, referee.torch.Tensor) else o for o in got[0]])
    return not comparisons.identical(*outputs)


TAKEN_PER_BATCH = 2  # calls of a batch read as they return, on average (contestant.take); all of a batch of 2 or 1


def load_message(
    settings: dict,
    role: str,
    class_name: str,
    program,
    init: list,
    build_dir,
    compile_mode: str | None = None,
    init_program: str | None = None,
) -> dict:
    """Both models are made the same way: seed 42, then the class on the same init inputs (KernelBench's order);
    models and floating inputs are cast to the task's precision as KernelBench does (kernelbench mode: float32 too,
    as KernelBench's default casts them). `compile_mode`: the reference under torch.compile (baselines.py). `taken`:
    where a call is done once its outputs are ready on the caller's stream, how many calls a batch are read as they
    return (0: done at a device-wide synchronisation). `init_program`: init inputs that cannot cross (init_inputs)."""
    precision = settings.get("precision") or "fp32"
    cast = modes.of(settings).cast_float32 or precision != "fp32"
    return {
        "op": "load",
        "role": role,
        "class_name": class_name,
        "program": str(program),
        "seed": SEED,
        "init": init,
        "init_program": init_program,
        "fixed_backend": modes.of(settings).fixed_backend,
        "taken": TAKEN_PER_BATCH if modes.of(settings).ready_check else 0,
        "cast": contracts.PRECISIONS[precision] if cast else None,
        "build_dir": build_dir,
        "compile": compile_mode,
    }


def overhead_ms(referee: Referee, task: TaskState) -> tuple[float, float]:
    """The round trip of an empty batch on the reference's process, after a flush as in a timed batch (on a GPU the
    switch back to the contestant's context is part of it), subtracted from both sides; and its jitter
    (timing.jitter_ms), which sets the shortest batch the clock resolves."""
    times = [ref_round(referee, task, [])["go_ms"] for _ in range(11)]
    return sorted(times)[len(times) // 2], timing.jitter_ms(times)


def ref_round(referee: Referee, task: TaskState, calls: list[list[dict]]) -> dict:
    """A calibration batch of the reference on inputs already in its arena, run and timed as a timed batch is (its
    outputs are handed off and not kept)."""
    ref_ask(task, {"op": "prepare", "calls": [{"args": specs} for specs in calls]}, "reference", spin=True)
    with reference_side():
        return timed_round(referee, task.runner, {"op": "go"}, 600.0, task.meta, len(calls))


def timed_round(
    referee,
    runner,
    go: dict,
    timeout: float,
    meta: list[dict],
    n: int,
    calls=None,
    specs=None,
    gather=None,
    staged=None,
) -> dict:
    """A timed batch of `n` calls after the runner's `prepare`: its forward (timed_go), then the hand-off of its
    outputs (referee.timed_handoff), on the referee's clock, the second span starting where the first stopped.
    `calls`, `specs`: the inputs written on the clock, in one copy of `staged` where Referee.staged made it.
    `meta`: the reference's output metadata of one call, which sizes the output arena beforehand; `gather(arena,
    base)` reads the outputs on the hand-off's clock (the arena's bytes, the hand-off's random offset:
    measure.Sampler). Returns timed_go's readings with the forward's reply (`reply`, naming its outputs),
    `handoff_ms`, what `gather` returned (`gathered`), the outputs as the reply lays them out (None where that is
    not as `meta`, comparisons.batch_structure: the caller judges), and the hand-off's reply and clock readings
    (`handoff`). Raises CallFailed on an error reply."""
    _, end = exchange.handoff_layouts([meta] * n)
    arena = runner.arena("out", end + exchange.OUT_SLACK, "timing")

    def land(base: int):
        return gather(arena.bytes, base) if gather else None

    timed = timed_go(referee, runner, go, timeout, calls, specs, n, staged)
    handed = referee.timed_handoff(runner, timeout, timed["reply"], land, n, since=timed["replied_at"])
    reply = timed["reply"] = handed["go"]
    if not reply.get("ok"):
        raise CallFailed(reply.get("error", "call failed"))
    outputs = None
    if comparisons.batch_structure(reply.get("outs"), meta, n) is None:
        if not handed["handoff"].get("ok"):
            raise CallFailed(handed["handoff"].get("error", "hand-off failed"))
        layouts, _ = exchange.handoff_layouts(reply["outs"], 0, handed["base"])
        outputs = [exchange.values_of(arena.bytes, layout) for layout in layouts]
    rung = {"go": timed["rung"], "handoff": handed["rung"]}
    handoff = {key: handed[key] for key in ("sent_at", "replied_at")} | {"reply": handed["handoff"]}
    return {**timed, "handoff_ms": 1000.0 * handed["seconds"], "outputs": outputs, "gathered": handed["landed"],
            "rung": rung, "handoff": handoff}  # fmt: skip


def timed_go(
    referee,
    runner,
    go: dict,
    timeout: float,
    calls: list | None = None,
    specs: list | None = None,
    n: int = 0,
    staged=None,
):
    """The forward of a timed batch, on the referee's clock: the batch's inputs written into the runner's arena (in
    one copy where they were `staged`: Referee.staged; the contestant has made its views of it already, but nothing
    it could compute on before this clock started), the caches flushed, then `go` rung and sent, until the
    contestant rings back (without the doorbell: sends its notice, Runner.ring).
    On the CPU the runner's processes are stopped while it is written. Returns the reply (None where it is still to
    be read: see timed_round), `stage_ms` (writing and flush), `go_ms` (the rest: the batch's forward), the
    runner's `cpu_s` during go, when `go` was sent and answered (`sent_at`, `replied_at`: the monotonic clock), and
    whether the answer came on the doorbell (`rung`)."""
    held = referee.hold(runner)
    begin = time.perf_counter()
    try:
        if staged is not None:
            referee.write_staged(runner, staged)
        elif calls:
            referee.write(runner, calls, specs)
        referee.flush()
    finally:
        referee.release(held)
    written = time.perf_counter()
    # on the clock: a referee held up here (a slow read of a large process tree) leaves no untimed gap after the
    # writing in which work a candidate deferred could run; the round trip calibrated on the reference holds it too
    cpu = procs.cpu_seconds(runner.pid)
    sent = time.perf_counter()
    rung = runner.ring(doorbell.GO, doorbell.DONE, go, go.get("seeds"), "timing", n, timeout)
    reply = None if rung is not None else runner.collect("timing", timeout, spin=True)
    end = rung or time.perf_counter()
    return {
        "reply": reply,
        "stage_ms": 1000.0 * (written - begin),
        "go_ms": 1000.0 * (end - written),
        "cpu_s": procs.cpu_seconds(runner.pid) - cpu,
        "sent_at": sent,
        "replied_at": end,
        "rung": rung is not None and runner.bell is not None,
    }


# ---------------------------------------------------------------- the candidate: load and correctness trials


def mutated(torch, runner, specs: list[dict], values: list) -> list[int]:
    """Positions of the tensor inputs the side's last call changed, as they lie in its input arena now."""
    arena = runner.arenas["in"].bytes
    changed = []
    for i, (spec, value) in enumerate(zip(specs, values)):
        if spec["t"] == "tensor":
            now = exchange.view(arena, spec)
            if not torch.equal(now, value) and not torch.equal(torch.nan_to_num(now), torch.nan_to_num(value)):
                changed.append(i)
    return changed

"""The timed part of a job: the reference's timed batches, the candidate's replay of them with its outputs
checked, KernelBench's timing in kernelbench mode, and what the candidate's forward ran (profile, backend state).
The rules are in concur.verify.timing; this module does the measuring."""

from __future__ import annotations

import contextlib
import math
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from concur.verify import comparisons, exchange, modes, procs, timing
from concur.verify.reference import (
    PROFILE_EXTRA_S,
    SEED,
    CallFailed,
    TaskState,
    call_timeout,
    kb_time_message,
    mutated,
    ref_ask,
    reference_side,
    timed_round,
)
from concur.verify.report import Profile, State, Timed, Times, Timing, Trial

if TYPE_CHECKING:
    from concur.verify.evaluation import Bout
    from concur.verify.referee import Referee
    from concur.verify.runner import Runner

# Output elements checked per tensor leaf of a timed batch, spread over all of its calls (at least SAMPLES_MIN each):
# a call left undone fails at any of its positions, and the referee keeps positions and values of every batch
SAMPLES_PER_BATCH, SAMPLES_MIN = 4096, 64
DRAIN_LIMIT_S = 60.0  # the longest wait for the device to be free of what a stopped candidate left on it
CLOCKED = ("forward", "stage", "handoff", "prepare")  # a timed batch's readings on the referee's clock (ms)


def samples_per_call(calls: int) -> int:
    return max(SAMPLES_MIN, -(-SAMPLES_PER_BATCH // max(1, calls)))


def draw_kinds(calls: int, settings: dict, task) -> list[str]:
    """How each call of a batch draws its inputs, in secret: in hardened mode as the correctness trials' mix does
    (`signed_trials` signed among `correctness_trials` random, call by call at random), so no call's inputs tell a
    timed call from a graded one; all random where the reference's outputs are not finite on signed inputs
    (signed_ok), since such calls could not be checked."""
    signed = int(settings["signed_trials"]) if modes.of(settings).signed and task.signed_finite else 0
    total = int(settings["correctness_trials"]) + signed
    return ["signed" if signed and secrets.randbelow(total) < signed else "random" for _ in range(calls)]


def signed_ok(referee: Referee, task: TaskState, settings) -> None:
    """Once per task (hardened, with signed trials): whether the reference's outputs are finite on signed inputs
    (`task.signed_finite`), from one call of it on a signed draw, before its first timed batch."""
    if task.signed_finite is not None:
        return
    if not modes.of(settings).signed or not int(settings["signed_trials"]):
        task.signed_finite = False
        return
    from concur.verify.evaluation import reference_outputs

    seed = secrets.randbits(62)
    outputs = reference_outputs(referee, task, referee.draw(task, seed, "signed"), seed)
    task.signed_finite = comparisons.leaf_peaks(outputs) is not None


@dataclass(frozen=True)
class Drawn:
    """One timed call's draw and how its sampled outputs are checked: a signed call's against its leaves' largest
    magnitudes in the reference's whole outputs (`peaks`, as a signed trial counts its tolerance), and not at all
    where the reference's outputs are not finite on its inputs (`checked`, as a signed trial is then skipped)."""

    kind: str = "random"
    peaks: list | None = None
    checked: bool = True


def drawn(kind: str, outputs: list) -> Drawn:
    if kind != "signed":
        return Drawn()
    peaks = comparisons.leaf_peaks(outputs)
    return Drawn(kind, peaks, peaks is not None)


EXPECTED_BACKEND = {
    "matmul.allow_tf32": False,
    "cudnn.allow_tf32": False,
    "float32_matmul_precision": "highest",
    "cudnn.benchmark": False,
    "cudnn.deterministic": False,
    "deterministic_algorithms": False,
}


@dataclass
class Plan:
    """The reference's timed batches, grown one at a time as the candidate replays each right after it: per batch
    its seeds, what its calls drew and how each is checked (`drawn`), where its outputs are read (`samplers`) and
    what the reference's held there (`samples`), the referee's clock readings (ms: `forward`, the writing of the
    inputs `stage`, the `handoff`, `prepare`) and the reference's own (`own_clock`: benchmarks). `planned`: how
    many batches run (timing.planned_batches, from the first)."""

    calls: int
    planned: int = 0
    batches: list[list[int]] = field(default_factory=list)
    samples: list = field(default_factory=list)
    samplers: list = field(default_factory=list)
    drawn: list = field(default_factory=list)
    forward: list[float] = field(default_factory=list)
    stage: list[float] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    own_clock: list[dict] = field(default_factory=list)

    def per_call(self, task: TaskState) -> list[float]:
        return timing.per_call_times(self.forward, task.overhead_ms, self.calls)

    def summary(self, task: TaskState) -> Times:
        """The reference's timing summary over its batches so far, each with its copies' excess over their medians
        (none for the reference itself but what its own drift adds: timing.charged)."""
        per_call, copies = self.per_call(task), [self.stage, self.handoff]
        charged_ms = timing.charged(per_call, copies, copies, self.calls)
        return timing.summary(per_call, charged_ms, self.calls, timing.resolvable_ms(task.jitter_ms))


def start_reference(referee: Referee, task: TaskState, settings) -> Plan:
    """Warm the reference up and run its first timed batch, which plans how many run (`Plan.planned`); within the
    referee's timing stretch (`quiet`), after signed_ok."""
    plan = Plan(task.calls)
    ask = lambda m, s, t=600.0, spin=False: ref_ask(task, m, s, t, spin)  # noqa: E731
    with reference_side():
        warm_up(referee, task, task.runner, task.calls, settings, ask)
    reference_batch(referee, task, settings, plan)
    plan.planned = timing.planned_batches(plan.per_call(task)[0] * plan.calls, float(settings["timing_min_s"]))
    return plan


def reference_batch(referee: Referee, task: TaskState, settings, plan: Plan) -> None:
    """One more timed batch of the reference on fresh secret inputs, every call's outputs sampled for the
    candidate's replay of it (`Sampler`), kept in `plan`. Whatever fails is the task's failure (ReferenceFailed)."""
    calls = plan.calls
    ask = lambda m, s, t=600.0, spin=False: ref_ask(task, m, s, t, spin)  # noqa: E731
    seeds, kinds = [secrets.randbits(62) for _ in range(calls)], draw_kinds(calls, settings, task)
    with reference_side():
        sampler = Sampler(referee, task.meta, positions(referee, task.meta, calls), calls)
        batch = timed_batch(referee, task, task.runner, seeds, ask, gather=sampler.read, kinds=kinds)
        if batch["outputs"] is None:  # its outputs changed kind, dtype or shape between calls
            raise CallFailed("the reference's outputs are not laid out as in its first call")
    read = sampler.split(batch["gathered"])
    plan.samples.append([kept_sample(got, out) for got, out in zip(read, batch["outputs"])])
    plan.drawn.append([drawn(kind, out) for kind, out in zip(kinds, batch["outputs"])])
    plan.samplers.append(sampler)
    plan.batches.append(seeds)
    for key in CLOCKED:
        getattr(plan, key).append(batch[f"{key}_ms"])
    plan.own_clock.append(batch["own_clock"])


def time_reference(referee: Referee, task: TaskState, settings) -> Plan:
    """The reference's timed batches alone, all of them (a compiled baseline's timing: baselines.py)."""
    signed_ok(referee, task, settings)
    with referee.quiet(), referee.alone(task.runner, DRAIN_LIMIT_S), reference_side():
        plan = start_reference(referee, task, settings)
        while len(plan.batches) < plan.planned:
            reference_batch(referee, task, settings, plan)
    return plan


class Sampler:
    """Where every call of a timed batch has its outputs checked, as element offsets into the output arena where the
    hand-off lays them out (exchange.handoff_layouts), one index per dtype: read on the hand-off's clock in one
    gather per dtype, the same way for both sides, only the hand-off's random `base` added there. Made before the
    batch from positions drawn in secret (`positions`; a leaf small enough is read whole)."""

    def __init__(self, referee, meta: list[dict], where: list, calls: int):
        torch, device = referee.torch, referee.device
        self.calls, self.leaves = calls, len(meta)
        layouts, _ = exchange.handoff_layouts([meta] * self.calls)
        parts: dict[str, list] = {}
        for leaf, at in enumerate(where):
            spec = layouts[0][leaf]
            if spec["t"] != "tensor":
                continue
            size = exchange.dtype_of(spec["dtype"]).itemsize  # leaves are aligned and contiguous
            firsts = torch.tensor([layout[leaf]["off"] // size for layout in layouts], device=device)
            at = torch.arange(spec["span"], device=device).expand(self.calls, -1) if at is None else at
            parts.setdefault(spec["dtype"], []).append((leaf, (at + firsts[:, None]).reshape(-1)))
        self.groups = {
            name: (torch.cat([at for _, at in items]), [(leaf, len(at) // self.calls) for leaf, at in items])
            for name, items in parts.items()
        }

    def read(self, arena, base: int) -> dict:
        """On the clock: the checked elements of every call, by dtype, from the arena's bytes."""
        found = {}
        for name, (offsets, _) in self.groups.items():
            dtype = exchange.dtype_of(name)
            flat = arena[: arena.numel() - arena.numel() % dtype.itemsize].view(dtype)
            found[name] = flat[offsets + base // dtype.itemsize]
        return found

    def split(self, found: dict) -> list[list]:
        """What `read` found, per call and leaf (None for a value leaf: its reply says)."""
        picked = [[None] * self.leaves for _ in range(self.calls)]
        for name, (_, plan) in self.groups.items():
            for (leaf, count), values in zip(plan, found[name].split([self.calls * count for _, count in plan])):
                for call, row in enumerate(values.view(self.calls, count)):
                    picked[call][leaf] = row
        return picked


def warm_up(referee: Referee, task: TaskState, runner: Runner, calls, settings, ask, limit=None) -> None:
    """`warmup` batches and at least WARMUP_MIN_S; past one batch, no longer than `timing_min_s` (a kernel whose
    batch takes seconds is warm after one, and its speedup is decided by the timed batches)."""
    begin, done = time.perf_counter(), 0
    while done < max(1, int(settings["warmup"])) or time.perf_counter() - begin < timing.WARMUP_MIN_S:
        if done and time.perf_counter() - begin >= max(timing.WARMUP_MIN_S, float(settings["timing_min_s"])):
            break
        seeds = [secrets.randbits(62) for _ in range(calls)]
        timed_batch(referee, task, runner, seeds, ask, limit, kinds=draw_kinds(calls, settings, task))
        done += 1


def timed_batch(
    referee: Referee, task: TaskState, runner: Runner, seeds, ask, limit=None, gather=None, kinds: list | None = None
) -> dict:
    """One timed batch: fresh inputs drawn (each call as `kinds` says: draw_kinds), the contestant's views of the
    arena made, then on the referee's clock the inputs written and the caches flushed, the calls run, and their
    outputs handed off, with what `gather` reads of them (timed_round). `limit(calls)`: the seconds the batch may
    take (a candidate's: Bout.call_limit; the reference's: call_timeout).
    `forward_ms`: the clock less the writing (whose excess over the reference's counts, timing.charged)."""
    kinds = kinds or ["random"] * len(seeds)
    values = [referee.draw(task, s, kind) for s, kind in zip(seeds, kinds)]
    specs = referee.layout(runner, values, "timing")
    staged, values = referee.staged(values, specs)
    begin = time.perf_counter()  # recorded, not counted: nothing of this batch's inputs is in the arena yet
    answered(ask({"op": "prepare", "calls": [{"args": sp} for sp in specs]}, "timing", 60.0, spin=True))
    prepare_ms = 1000.0 * (time.perf_counter() - begin)
    go = {"op": "go", "seeds": seeds if task.stochastic else None}
    timeout = call_timeout(task, len(seeds)) if limit is None else limit(len(seeds))
    timed = timed_round(referee, runner, go, timeout, task.meta, len(seeds), values, specs, gather, staged)
    reply = timed["reply"]
    return {
        "forward_ms": timed["go_ms"],
        "stage_ms": timed["stage_ms"],
        "handoff_ms": timed["handoff_ms"],
        "prepare_ms": prepare_ms,
        "metas": reply.get("outs") or [],
        "outputs": timed["outputs"],
        "gathered": timed["gathered"],
        "specs": specs,
        "values": values,
        "kinds": kinds,
        "cpu_s": timed["cpu_s"],
        "kernel_calls": reply.get("kernel_calls", 0),
        "taken": reply.get("taken"),
        "own_clock": own_clock(reply, timed),
    }


def own_clock(reply: dict, timed: dict) -> dict:
    """The contestant's own reading of a batch (benchmarks only: a candidate could forge it), numbers kept only;
    the path of the forward's command: to the contestant, until its work began, the work, after it ended, back to
    the referee (ms), and the same of the hand-off's (`handoff_path_ms`); which timed steps were answered on the
    doorbell (`rung`)."""
    found = reply.get("own_clock")
    keep: dict = {"rung": timed["rung"]}
    if not isinstance(found, dict):
        return keep
    keep.update({k: float(v) for k, v in found.items() if k in ("wall_ms", "events_ms") and isinstance(v, float)})
    if all(isinstance(found.get(k), float) for k in ("begin_at", "launched_at")):  # the host's share of the batch
        keep["launch_ms"] = 1000.0 * (found["launched_at"] - found["begin_at"])
    handed = timed["handoff"]["reply"].get("own_clock")
    for key, path in (
        ("path_ms", message_path(timed, found)),
        ("handoff_path_ms", message_path(timed["handoff"], handed if isinstance(handed, dict) else {})),
    ):
        if path:
            keep[key] = path
    return keep


def message_path(referee: dict, own: dict) -> dict:
    """Milliseconds of each leg of a timed command's path, from the referee's and the contestant's stamps."""
    stamps = [referee["sent_at"], *(own.get(k) for k in ("received_at", "begin_at", "end_at", "sent_at"))]
    stamps.append(referee["replied_at"])
    if not all(isinstance(t, (int, float)) for t in stamps):
        return {}
    legs = ("to_contestant", "before_work", "work", "after_work", "to_referee")
    return {leg: 1000.0 * (b - a) for leg, a, b in zip(legs, stamps, stamps[1:])}


def answered(reply: dict) -> dict:
    if not reply.get("ok"):
        raise CallFailed(reply.get("error", "call failed"))
    return reply


def positions(referee: Referee, meta: list[dict], calls: int) -> list:
    """Where a batch of `calls` calls has its outputs checked, drawn in secret before it: per tensor leaf, a
    (calls, samples_per_call) tensor of positions in each call's leaf, or None where the leaf is small enough to
    check whole (or not a tensor)."""
    count, found = samples_per_call(calls), []
    for leaf in meta:
        numel = math.prod(leaf["shape"]) if leaf["t"] == "tensor" else 0
        if numel <= count:
            found.append(None)
            continue
        at = referee.torch.randint(0, numel, (calls, count), generator=referee.positions, device=referee.device)
        found.append(at)
    return found


def kept_sample(picked: list, outputs: list) -> list:
    """The reference's sample of a call, per leaf: the elements read, or a value leaf as its reply gave it."""
    return [value if got is None else got for got, value in zip(picked, outputs)]


def time_candidate(bout: Bout) -> None:
    """The reference's timed batches and the candidate's replay of each, in turn (`replay`), then the candidate
    inspected (kernelbench mode: KernelBench's timing instead). In turn, so that both sides are timed through the
    same stretch of the machine: a microsecond call's time is its core's launches, and their pace moved by up to a
    third within seconds on the machines measured. The reference's work does not spend the candidate's
    `timeout_s`."""
    referee, task, candidate, job, facts = bout.referee, bout.task, bout.candidate, bout.job, bout.report
    settings = job["settings"]
    if not modes.of(settings).batches:
        return time_kernelbench(bout)
    torch, calls = referee.torch, task.calls
    timed = Timed()
    resolve_ms = timing.resolvable_ms(task.jitter_ms)
    steady = timing.per_call_times([1000.0 * s for s in facts.steady_call_s], task.overhead_ms, 1)
    with alone(bout, task.runner):
        signed_ok(referee, task, settings)
    with referee.quiet():
        with alone(bout, task.runner):
            plan = start_reference(referee, task, settings)
        median_ms = plan.summary(task).median_ms
        settled = referee.device == "cuda" and timing.slower_by_calls(steady, settings["timing_min_s"], median_ms)
        if settled:  # the reference's batches alone
            with alone(bout, task.runner):
                while len(plan.batches) < plan.planned:
                    reference_batch(referee, task, settings, plan)
        else:
            ran = replay(bout, plan, timed)
    reference = plan.summary(task)
    if settled:
        timed.settled_by = "correctness calls"  # each checked whole, the pool stopped
        facts.timed = timed
        new = timing.summary(steady, calls=1, resolve_ms=resolve_ms)
        facts.timing = Timing(reference, new, calls_per_batch=1, settled_by="correctness calls")
        if job.get("trace"):
            facts.trace["per_call_ms"] = {"ref": plan.per_call(task), "new": steady}
        return inspect(bout)
    if ran.whole is None and ran.last is not None:  # timing stopped before the drawn batch: the last one's, in place
        number, seeds, batch = ran.last
        ran.whole = whole_call(torch, number, calls, ran.whole_at[1], seeds, batch, copy=False)
    if ran.whole is not None and not timed.mismatch:
        timed.mismatch = check_whole(bout, *ran.whole)
    if not timed.profiled and ran.last is not None and not timed.mismatch:  # after the whole check: the last
        timed.profiled = True  # batch's outputs are checked in place
        timed.mismatch = profile_timed(bout, timed)
    facts.timed = timed
    if ran.forward:
        per_call = timing.per_call_times(ran.forward, task.overhead_ms, calls)
        facts.timing = Timing(
            reference,
            timing.summary(per_call, ran.billed, calls, resolve_ms),  # every batch that ran, as last charged
            calls_per_batch=calls,
            resolve_ms=resolve_ms,
            deferred=timing.deferred(ran.handoff, plan.handoff, ran.forward),
            # over all batches' calls together (where the CPU clock is read in ticks, one short batch is too coarse)
            cores=sum(ran.cpu_s) / (sum(ran.forward) / 1000.0),
            cores_resolution=procs.cpu_resolution_s(candidate.pid) * 2 / (sum(ran.forward) / 1000.0),
            cores_allowed=referee.threads,
        )
        if job.get("trace"):  # forward of every batch, the referee's clock readings, the processes' own
            facts.trace["per_call_ms"] = {"ref": plan.per_call(task), "new": per_call}
            facts.trace["batch_ms"] = {
                "ref": {key: getattr(plan, key) for key in CLOCKED},
                "new": {key: getattr(ran, key) for key in CLOCKED},
                "overhead": task.overhead_ms,
                "own_clock": {"ref": plan.own_clock, "new": ran.own_clock},
            }
    inspect(bout)


@dataclass
class Replay:
    """The candidate's replay of the reference's batches: per batch that ran, the referee's clock readings (ms; a
    hand-off's with what the drain after it waited: `alone`), its CPU seconds and own clock; every batch
    per call as last charged (`billed`); the timed call to check whole, drawn in secret (`whole_at`: batch, call)
    and kept (`whole`), and the last batch that ran (`last`)."""

    whole_at: tuple[int, int]
    forward: list[float] = field(default_factory=list)
    stage: list[float] = field(default_factory=list)
    handoff: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    own_clock: list[dict] = field(default_factory=list)
    billed: list[float] = field(default_factory=list)
    whole: tuple | None = None
    last: tuple | None = None


def replay(bout: Bout, plan: Plan, timed: Timed) -> Replay:
    """The planned batches in turn, from the reference's first (start_reference): the reference's next, then the
    candidate's replay of it on the same inputs, every call's sampled outputs compared with the reference's, until
    the candidate fails a check or is done (timing.candidate_done); what it found goes into `timed`. Within the
    referee's timing stretch (`quiet`)."""
    referee, task, candidate, settings = bout.referee, bout.task, bout.candidate, bout.settings
    torch, calls, budget_s = referee.torch, plan.calls, float(settings["timing_min_s"])
    ask = lambda m, s, t=600.0, spin=False: candidate.ask(m, s, bout.limit(t), spin=spin)  # noqa: E731
    # drawn in secret before any of the candidate's batches: the timed call checked whole (the last batch's, if
    # timing stops first), and the batch before which one more call like them is profiled (after the last, if
    # timing stops first)
    ran = Replay(whole_at=(secrets.randbelow(plan.planned), secrets.randbelow(calls)))
    profile_at = secrets.randbelow(plan.planned)
    if not timing.warm_already(bout.report.call_s, budget_s):
        with alone(bout, candidate):
            warm_up(referee, task, candidate, calls, settings, ask, bout.call_limit)
    for number in range(plan.planned):
        if number == len(plan.batches):
            with alone(bout, task.runner) as waited:
                reference_batch(referee, task, settings, plan)
            if ran.handoff:  # what the candidate left on the device ran past its last batch's hand-off
                ran.handoff[-1] += sum(waited)
        seeds, samples, sampler, draws = (
            plan.batches[number], plan.samples[number], plan.samplers[number], plan.drawn[number]
        )  # fmt: skip
        if number == profile_at:
            timed.profiled = True
            timed.mismatch = profile_timed(bout, timed)
            if timed.mismatch or timed.unready:
                break
        with alone(bout, candidate):
            batch = timed_batch(
                referee, task, candidate, seeds, ask, bout.call_limit, sampler.read, [d.kind for d in draws]
            )
        outputs = batch["outputs"]
        if outputs is None:
            at, mismatch = comparisons.batch_structure(batch["metas"], task.meta, calls)
            timed.mismatch = f"call {number * calls + at + 1}: {mismatch.failure()}"
            break
        if number == ran.whole_at[0]:  # copied: later batches' hand-offs land in the same arena
            ran.whole = whole_call(torch, number, calls, ran.whole_at[1], seeds, batch, copy=True)
        ran.last = (number, seeds, batch)
        for key in CLOCKED:
            getattr(ran, key).append(batch[f"{key}_ms"])
        ran.cpu_s.append(batch["cpu_s"])
        ran.own_clock.append(batch["own_clock"])
        timed.calls += calls
        timed.signed += sum(d.kind == "signed" for d in draws)
        for i, (got, kept) in enumerate(zip(sampler.split(batch["gathered"]), samples)):
            if not draws[i].checked:  # signed inputs on which the reference's outputs are not finite
                timed.unchecked += 1
                continue
            failed = sample_mismatch(torch, got, outputs[i], kept, settings, draws[i].peaks)
            if failed and not timed.mismatch:
                timed.mismatch = f"call {number * calls + i + 1}: {failed}"
        timed.unready = timed.unready or comparisons.unready(batch["taken"], outputs, number * calls + 1)
        for i in range(calls):
            changed = mutated(torch, candidate, batch["specs"][i], batch["values"][i])
            timed.mutated += [j for j in changed if j not in timed.mutated and j not in task.writes]
        ran.billed = charged(ran.forward, ran.stage, ran.handoff, plan, task.overhead_ms)
        if timed.mismatch or timed.unready or replayed_enough(ran, plan, task, budget_s):
            break
    return ran


def replayed_enough(ran: Replay, plan: Plan, task: TaskState, budget_s: float) -> bool:
    """timing.candidate_done on the forwards alone, both sides': the copies' noise is the machine's, and charged
    it would stop an honest kernel as clearly slower on a batch or two that copied slowly (what the copies add
    still counts in every batch's time: `ran.billed`)."""
    forward = timing.per_call_times(ran.forward, task.overhead_ms, plan.calls)
    return timing.candidate_done(forward, plan.calls, budget_s, statistics.median(plan.per_call(task)))


@contextlib.contextmanager
def alone(bout: Bout, runner):
    """One side of the candidate's job timed alone (Referee.alone: the other stopped, the device drained of what it
    left); yields a list holding the milliseconds the drain waited (the candidate's, after its batch: replay
    charges them to it). The reference's own work is added to the candidate's deadline; stopping the candidate and
    the drain are not (a candidate slow to stop spends its own budget)."""
    with bout.referee.alone(runner, bout.limit(DRAIN_LIMIT_S)) as waited:
        begin = time.monotonic()
        try:
            yield waited
        finally:
            if runner is bout.task.runner:
                bout.deadline += time.monotonic() - begin


def charged(forward: list[float], stages: list[float], handoffs: list[float], plan: Plan, overhead_ms: float):
    """The candidate's batches per call, each with its copies' excess over the reference's (timing.charged)."""
    per_call = timing.per_call_times(forward, overhead_ms, plan.calls)
    return timing.charged(per_call, [stages, handoffs], [plan.stage, plan.handoff], plan.calls)


def whole_call(torch, number: int, calls: int, i: int, seeds: list, batch: dict, copy: bool) -> tuple:
    """check_whole's arguments for call `i` of timed batch `number`: its outputs copied where a later hand-off
    would overwrite them, and then its inputs too (views of the batch's staged buffer, which they would keep)."""
    outputs, values = (
        [v.clone() if copy and isinstance(v, torch.Tensor) else v for v in batch[key][i]]
        for key in ("outputs", "values")
    )
    return f"call {number * calls + i + 1}", seeds[i], values, outputs, batch["kinds"][i]


def check_whole(bout: Bout, where: str, seed: int, values: list, outputs: list, kind: str, precise: bool = True) -> str:
    """One timed call, drawn in secret, checked as a correctness trial of its kind is: every element against the
    reference's outputs on its inputs (none where a signed draw leaves those not finite), and the errors of both
    against the reference run in float64 (`precise`: the report's precision_timed; verdict.precision_flag reads the
    worse of it and the first trial's). So a candidate that told timed calls from graded ones, and cut corners
    only on the timed, is judged on one of them in full. Returns the mismatch, as the sampled check words it (empty:
    none)."""
    from concur.verify.evaluation import precision, reference_outputs

    referee, task, settings = bout.referee, bout.task, bout.settings
    ref = reference_outputs(referee, task, values, seed)
    peaks = comparisons.leaf_peaks(ref) if kind == "signed" else None
    if kind == "signed" and peaks is None:
        return ""
    found = comparisons.compare(outputs, ref, settings, strict_finite=True, peaks=peaks)
    if not found.passes():
        return f"{where}: {found.failure()}"
    if precise:
        bout.report.precision_timed = precision(referee, task, values, ref, outputs, seed)
    return ""


def profile_timed(bout: Bout, timed: Timed) -> str:
    """One more call, drawn as the timed calls are and made at a secret point among the timed batches, under the
    profiler as the first correctness call is (the report's `profiled`: the names of what it ran), its outputs
    checked whole and as it returned (`timed.unready`): a candidate that launches its own kernels only on its first
    call is seen launching others here. Returns the mismatch."""
    referee, task, candidate = bout.referee, bout.task, bout.candidate
    kind, seed = draw_kinds(1, bout.settings, task)[0], secrets.randbits(62)
    values = referee.draw(task, seed, kind)
    specs = referee.stage(candidate, [values], "profile")[0]
    message = {"op": "call", "calls": [{"args": specs, "seed": seed}], "profile": True}
    reply = answered(candidate.ask(message, "profile", bout.call_limit(1, extra_s=PROFILE_EXTRA_S)))
    bout.report.profiled.append(reply.get("names"))
    metas = reply["outs"][0]
    mismatch = comparisons.structure(metas, task.meta)
    if mismatch:
        return f"the profiled call: {mismatch.failure()}"
    outputs, _ = referee.handoff(candidate, [metas], "profile", bout.call_limit(1))
    found = comparisons.unready(reply.get("taken"), outputs)
    timed.unready = timed.unready or (f"the profiled call: {found}" if found else "")
    return check_whole(bout, "the profiled call", seed, values, outputs[0], kind, False)


def sample_mismatch(torch, picked: list, leaves: list, kept: list, settings: dict, peaks=None) -> str | None:
    """The first output whose checked elements (`picked` on the clock; a value leaf from the reply's `leaves`)
    differ from the reference's; a signed call's against its leaves' largest magnitudes (`peaks`: Drawn)."""
    for index, (got, leaf, expected) in enumerate(zip(picked, leaves, kept)):
        if not isinstance(expected, torch.Tensor):
            if leaf != expected:
                return f"output {index}: {leaf!r} != {expected!r}"
            continue
        peak = None if peaks is None else [peaks[index]]
        found = comparisons.compare([got], [expected], settings, strict_finite=True, peaks=peak)
        if not found.passes():
            return found.failure()
    return None


def time_kernelbench(bout: Bout) -> None:
    """KernelBench's timing of the candidate, in its process, on the seed-42 inputs (the reference's: once per
    task)."""
    referee, task, candidate, settings, facts = bout.referee, bout.task, bout.candidate, bout.settings, bout.report
    values = referee.draw(task, SEED, "random")
    specs = referee.stage(candidate, [values], "timing")[0]
    trials = int(settings["timing_trials"]) + 1 + int(settings["warmup"])
    with referee.quiet():
        reply = candidate.ask(kb_time_message(specs, settings), "timing", bout.call_limit(trials))
    if not reply.get("ok"):
        facts.trials.append(Trial(len(facts.trials) + 1, "timing", error=str(reply.get("error"))))
        return
    facts.timing = Timing(timing.kernelbench_summary(task.kb_times), timing.kernelbench_summary(reply["times_ms"]))


def inspect(bout: Bout) -> None:
    """What ran in the candidate's forward (profiler: its first correctness call and a timed one, else one call
    more: `names` all they ran, `launched_own` its own kernels launched on every profiled call) and the state it
    left (backend flags, harness functions)."""
    referee, task, candidate, facts = bout.referee, bout.task, bout.candidate, bout.report
    own_kernels = bout.job.get("kernels")  # the build's, less the library's (None: not known)
    profiled, facts.profiled = [n for n in facts.profiled if n is not None], []
    if not profiled:
        values = referee.draw(task, secrets.randbits(62), "random")
        specs = referee.stage(candidate, [values], "profile")[0]
        timeout = bout.call_limit(1, extra_s=PROFILE_EXTRA_S)
        reply = candidate.ask({"op": "profile", "args": specs}, "profile", timeout)
        profiled = [reply["names"]] if reply.get("ok") and reply.get("names") is not None else []
    own = None if own_kernels is None else set(own_kernels) - set(task.profile or {})
    names: dict | None = {} if profiled else None
    for found in profiled:
        for name, count in found.items():
            names[name] = names.get(name, 0) + count
    launched = set.intersection(*(set(found) & (own or set()) for found in profiled)) if profiled else set()
    facts.profile = Profile(referee.device, names, task.profile, None if own is None else sorted(own), sorted(launched))
    state = candidate.ask({"op": "state"}, "profile", bout.limit(30.0))
    backend = state.get("backend") or {}
    expected = {**EXPECTED_BACKEND, "num_threads": referee.threads}
    facts.state = State(
        sorted(k for k, v in expected.items() if backend.get(k, v) != v), [str(t) for t in state.get("tampered") or []]
    )

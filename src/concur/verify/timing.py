"""How the referee times both models (hardened mode): pure functions, so the rules can be tested without a GPU.

A timed batch is B calls of forward, each on inputs drawn fresh for it, run back to back by the contestant and ended
when the caller's stream is done (hardened; else the whole device). The contestant makes its views of the input arena
first; then the referee's clock starts, the inputs are written into the arena and the caches flushed, the batch is rung
(concur.verify.doorbell), and the clock stops when the contestant rings back. Nothing a candidate could compute on is in
its reach before that clock starts. The writing is taken off again, and whatever a batch's writing takes beyond the
reference's median (and COPY_SLACK of it) is added to that batch: the candidate's kernels time-share the GPU with the
referee's, so work that ran while its inputs landed lengthened the writing. B grows until a batch lasts TARGET_BATCH_MS,
so the message round trip (measured on the reference's process and subtracted from both) is a small share of it. The
outputs then move to the referee in a separate hand-off, rung at once and timed until the referee has read its sample:
work a candidate defers past its reply shows up there, and is added to its batch the same way, so work shifted between a
batch's forward and its copies is counted whole in that batch. Every call's outputs are checked (concur.verify.measure).
The two sides take turns, after the candidate's correctness trials: a batch of the reference, then the candidate's
replay of it on the same inputs, so both are timed through the same stretch of the machine's pace; while one side runs,
the other's processes are stopped and the device is drained of what they left running (Referee.alone; a wait after the
candidate's batch is charged to that batch). The reference's first batch plans how many run (planned_batches: until
`timing_min_s` is spent, at least MIN_BATCHES); the candidate stops early once it has spent that budget itself or is
clearly slower than eager, and runs none where its long correctness calls already show that (slower_by_calls). Speedup:
the ratio of the two sides' quickest batches, per call (summary).

Resolution. Nothing is floored: a batch's time is what the clock read less the round trip. The round trip varies
from batch to batch (its jitter, measured on the reference's empty batches); B grows until a batch lasts at least
SIZE_FACTOR times that jitter as well (the jitter at most 5 % of the reference's batch, and of a candidate's up to
SIZE_FACTOR / RESOLVE_FACTOR times quicker). A side whose quickest batch still lasts less than RESOLVE_FACTOR
jitters (calls too quick for the batch the arena allows, or a candidate far quicker than the reference on the same
batches) is unresolved: its time is reported, no speedup is made from it, and the verdict says `timing:unresolved`.
"""

from __future__ import annotations

import math
import statistics

from concur.verify.report import Times

MIN_BATCHES = 10
MAX_BATCHES = 2000
MAX_BATCH = 1024  # calls; small tasks (KernelBook's run in microseconds) need hundreds to outlast the jitter
# What the host adds to a batch (the wake-up on the bell, the first launch, the answer) follows the pace of the
# side's core, which on the H100 nodes measured changed in phases within and between processes; it is a smaller
# share of a longer batch: 10 ms instead of 5 took one fast kernel's speedup CV over 8 runs from 3.4-4.3 % to
# 0.8-2.2 % (CHANGELOG.md)
TARGET_BATCH_MS = 10.0
WARMUP_MIN_S = 0.05  # warm-up at least this long on the GPU, so its clocks have settled
SLOWER_STOP = 3.0  # the candidate stops once its median per-call time exceeds this many times the reference's
SLOWER_MIN_BATCHES = 3
SIZE_FACTOR = 20.0  # batches are sized to last this many times the round trip's jitter
RESOLVE_FACTOR = 4.0  # a batch shorter than this many jitters is unresolved: its error could pass 25 %
JITTER_FLOOR_MS = 1e-3  # the least jitter assumed: the clock and the wake-up are never better than a microsecond
DEFERRED_SHARE, DEFERRED_FLOOR_MS = 0.25, 0.02  # a hand-off this much slower than the reference's is flagged
# What the referee's copies for the candidate (its inputs written, its outputs handed off) may take beyond the same
# copies for the reference before the excess counts: medians of the same copy in two stretches of one run differ by
# 5-12 % (GPU drift; H100, 21 calls of 64 MB), and where the copy takes as long as the forward that alone put 2
# points on the speedup's CV. It is also what a candidate could hide: 5 % of a copy, at most 5 % of its time where
# its inputs or outputs take as long to copy as to compute, next to nothing otherwise.
COPY_SLACK = 0.05
# A candidate quicker per call than this share of writing its outputs once (beats_roofline) is flagged: the share
# leaves room for the floor's own noise and for a kernel that writes a little faster than a fill
ROOFLINE_SHARE = 0.5


def jitter_ms(round_trips_ms: list[float]) -> float:
    """How much the round trip of an empty batch varies: the spread of its middle 60 % (at least JITTER_FLOOR_MS)."""
    ordered = sorted(round_trips_ms)
    if len(ordered) < 2:
        return JITTER_FLOOR_MS
    low, high = ordered[round(0.2 * (len(ordered) - 1))], ordered[round(0.8 * (len(ordered) - 1))]
    return max(JITTER_FLOOR_MS, high - low)


def resolvable_ms(jitter: float) -> float:
    """The least net time of a batch the clock resolves."""
    return RESOLVE_FACTOR * jitter


def sized_ms(jitter: float) -> float:
    """The least net time a batch is sized for."""
    return SIZE_FACTOR * jitter


def batch_size(call_ms: float, input_bytes: int, output_bytes: int, budget_bytes: int, resolve_ms: float = 0.0) -> int:
    """Calls per batch: enough for TARGET_BATCH_MS and for the clock to resolve it (`resolve_ms`), within MAX_BATCH
    and the arena budget. A call that read no time at all (`call_ms` <= 0) gets the most calls allowed."""
    wanted = math.ceil(max(TARGET_BATCH_MS, resolve_ms) / max(call_ms, 1e-4))
    per_call = max(1, input_bytes + output_bytes)
    return int(max(1, min(wanted, MAX_BATCH, budget_bytes // per_call)))


def per_call_ms(forward_ms: float, overhead_ms: float, calls: int) -> float:
    """A batch's time per call, the round trip taken off; not floored (at or below 0 where the clock read nothing)."""
    return (forward_ms - overhead_ms) / max(1, calls)


def per_call_times(forward_ms: list[float], overhead_ms: float, calls: int) -> list[float]:
    """Per-call forward time of each batch, the round trip taken off."""
    return [per_call_ms(f, overhead_ms, calls) for f in forward_ms]


def charged(per_call: list[float], copies: list[list[float]], reference_copies: list[list[float]], calls: int):
    """Each batch's time per call with what its copies (the writing of its inputs, the hand-off of its outputs)
    took beyond COPY_SLACK over the median of the same copy for the reference, counted in that batch: work
    overlapped with a copy lengthens it as much as it shortens the batch's forward, so it is counted whole whichever
    batches it was moved in; a copy faster than the reference's earns no credit. Both sides are charged alike."""
    allowed = [(1.0 + COPY_SLACK) * statistics.median(ref) if ref else math.inf for ref in reference_copies]
    return [
        p + sum(max(0.0, copy[i] - limit) for copy, limit in zip(copies, allowed) if i < len(copy)) / max(1, calls)
        for i, p in enumerate(per_call)
    ]


def budget_spent(per_call: list[float], calls: int, budget_s: float) -> bool:
    """Timed long enough: MIN_BATCHES batches and `budget_s` of forward time, or, for batches that each take a
    good share of the budget, SLOWER_MIN_BATCHES of them and as long as MIN_BATCHES batches of the budget."""
    spent_ms, n = sum(per_call) * calls, len(per_call)
    if n >= MAX_BATCHES or (n >= MIN_BATCHES and spent_ms >= 1000.0 * budget_s):
        return True
    return n >= SLOWER_MIN_BATCHES and spent_ms >= 1000.0 * budget_s * MIN_BATCHES


def planned_batches(batch_ms: float, budget_s: float) -> int:
    """Timed batches a side runs, planned from its first batch's net time as budget_spent would stop batches of
    that time: MIN_BATCHES and `budget_s` of forward time, or for batches that each take a good share of the budget,
    SLOWER_MIN_BATCHES and as long as MIN_BATCHES batches of the budget; within MAX_BATCHES. Planned ahead, so that
    the candidate's checked call and profiled call are drawn among all of its batches before the first."""
    budget_ms = 1000.0 * budget_s
    usual = max(MIN_BATCHES, math.ceil(budget_ms / max(batch_ms, 1e-9)))
    long = max(SLOWER_MIN_BATCHES, math.ceil(MIN_BATCHES * budget_ms / max(batch_ms, 1e-9)))
    return int(min(MAX_BATCHES, usual, long))


def candidate_done(per_call: list[float], calls: int, budget_s: float, reference_median_ms: float) -> bool:
    """The candidate's speedup is known well enough: its own time budget is spent, or it is clearly slower (over
    SLOWER_MIN_BATCHES batches, or over `budget_s` of batches: one batch of a kernel that takes seconds).
    `per_call`: its batches' forward times per call, and `reference_median_ms` the reference's, copies not charged:
    the copies' noise is the machine's, and charged it would cut an honest kernel's timing short as slower."""
    settled = len(per_call) >= SLOWER_MIN_BATCHES or sum(per_call) * calls >= 1000.0 * budget_s
    if settled and statistics.median(per_call) > SLOWER_STOP * reference_median_ms:
        return True
    return budget_spent(per_call, calls, budget_s)


def long_call(seconds: float, budget_s: float) -> bool:
    """One untimed call that kept the device busy at least as long as a timed batch must run."""
    return seconds >= max(WARMUP_MIN_S, budget_s)


def slower_by_calls(call_ms: list[float], budget_s: float, reference_median_ms: float) -> bool:
    """Long untimed calls already settle a clearly slower candidate: SLOWER_MIN_BATCHES of them, each as long as a
    timed batch must run (their round trip a small share of it), with a median over SLOWER_STOP times the
    reference's. Its time is then the quickest of them, which, if anything, counts its round trip against it."""
    return (
        len(call_ms) >= SLOWER_MIN_BATCHES
        and long_call(min(call_ms) / 1000.0, budget_s)
        and statistics.median(call_ms) > SLOWER_STOP * reference_median_ms
    )


def warm_already(call_s: list[float], budget_s: float) -> bool:
    """Untimed calls that each kept the device busy this long (correctness trials) leave nothing to warm up."""
    return bool(call_s) and long_call(min(call_s), budget_s)


def summary(
    per_call: list[float], charged_ms: list[float] | None = None, calls: int = 1, resolve_ms: float = 0.0
) -> Times:
    """Per-call times over the batches, each with its copies' excess (`charged_ms`, timing.charged): `best_ms`,
    the quickest batch, is the side's time (hardened): what the machine adds to a batch (a preempted or slowed
    core, a context switch, another process's copy) only ever lengthens it, and every call of every batch had its
    outputs checked, so no batch can be quick by leaving work out. Mean and median beside it; `copy_excess_ms`:
    what the copies added to the quickest batch; cv: of the forward times; `resolved`: the quickest batch of
    `calls` calls lasted at least `resolve_ms` (resolvable_ms), so its time is the clock's reading, not its noise."""
    charged_ms = charged_ms or per_call
    mean = statistics.fmean(per_call)
    best = min(range(len(charged_ms)), key=charged_ms.__getitem__)
    return Times(
        resolved=charged_ms[best] > 0 and charged_ms[best] * calls >= resolve_ms,
        mean_ms=statistics.fmean(charged_ms),
        median_ms=statistics.median(charged_ms),
        best_ms=charged_ms[best],
        copy_excess_ms=charged_ms[best] - per_call[best],
        cv=statistics.pstdev(per_call) / mean if len(per_call) > 1 and mean > 0 else 0.0,
        batches=len(per_call),
    )


def deferred(
    candidate_handoff_ms: list[float], reference_handoff_ms: list[float], candidate_forward_ms: list[float]
) -> bool:
    """The candidate's hand-offs take clearly longer than the reference's for the same bytes, beyond their spread
    and as a share of its own batches: it left work running past its reply (the excess is counted either way)."""
    if not candidate_handoff_ms or not reference_handoff_ms:
        return False
    ref = statistics.median(reference_handoff_ms)
    spread = statistics.median(abs(h - ref) for h in reference_handoff_ms)
    excess = statistics.median(candidate_handoff_ms) - ref
    share = DEFERRED_SHARE * statistics.median(candidate_forward_ms)
    return excess > max(DEFERRED_SHARE * ref, 4 * spread, DEFERRED_FLOOR_MS, share)


def resolved(reference: Times, candidate: Times) -> bool:
    """Both sides' times are the clock's readings, not its noise (summary; kernelbench mode's always are)."""
    return reference.resolved and candidate.resolved


def beats_roofline(candidate: Times, floor_ms: float | None, reference: Times | None = None) -> bool:
    """Quicker per call than ROOFLINE_SHARE of the least any correct candidate takes: its outputs' bytes written
    once, by one launch a call, as the referee's own fills of that many bytes measured it on this device, batched as
    the task's calls are (reference.write_floor_ms). The task's FLOPs and input bytes give no such bound (an
    algebraic rewrite needs fewer FLOPs, a kernel may skip an input that cannot change the result); its outputs it
    must write. A time under it was not the work of each call (calls merged or overlapped, or a clock gamed). Unless
    the `reference` is as quick: then the task writes no outputs of its own (a view of its input, say), and neither
    need an honest candidate."""
    if not floor_ms or floor_ms <= 0 or not candidate.resolved or math.isnan(candidate.best_ms):
        return False
    bound = ROOFLINE_SHARE * floor_ms
    if reference is not None and reference.resolved and reference.best_ms < bound:
        return False
    return candidate.best_ms < bound


def speedup(reference: Times, candidate: Times, stat: str = "best_ms") -> float:
    """reference / candidate time; NaN where either side's time is unresolved: a time the clock could not resolve
    is never a speedup."""
    if not resolved(reference, candidate) or not getattr(candidate, stat) > 0:
        return math.nan
    return getattr(reference, stat) / getattr(candidate, stat)


def kernelbench_summary(times_ms: list[float]) -> Times:
    """KernelBench's statistic is the mean; the median and the quickest trial are reported beside it."""
    return Times(
        mean_ms=statistics.fmean(times_ms),
        median_ms=statistics.median(times_ms),
        best_ms=min(times_ms),
        batches=len(times_ms),
        cv=statistics.pstdev(times_ms) / statistics.fmean(times_ms) if len(times_ms) > 1 else 0.0,
    )

"""The referee's report on one job: what it measured, typed, every field documented; concur.verify.verdict reads it.

The referee (a trusted process) fills a `Report` as the job runs and sends it to the orchestrator as plain data
(`to_data`, JSON on the referee's socket); `Report.from_data` makes it again on the other side, keeping the
defaults for what a job never reached. No field holds a verdict: status, reason, flags and speedup are decided from
these facts in concur.verify.verdict alone. What the candidate's process said crosses into a report only as values
the referee copied out of its replies (strings, numbers, lists of them), never as objects.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field


@dataclass
class Failure:
    """Why a job stopped before its end: a contestant that stopped answering, or the referee itself."""

    kind: str  # timeout | crash | memory | processes | protocol | referee
    stage: str  # the stage it stopped in: load, correctness, timing, profile, ...
    detail: str  # one line: the signal, the limit, the broken protocol rule, the referee's error
    seconds: float = 0.0  # timeout: the limit that ran out


@dataclass
class Load:
    """The candidate's program loaded in its contestant, and ModelNew made on the task's init inputs."""

    ok: bool = False  # the program ran to its end (its module's top level)
    has_class: bool = False  # it defines ModelNew
    error: str | None = None  # why loading or ModelNew(*init) failed
    syntax_error: bool = False  # the program does not parse
    build_error: str | None = None  # the compiler's error, where loading failed on a build
    load_calls: int = 0  # extension loads (load_inline, load, ...) it made
    load_s: float = 0.0  # seconds to run the program's top level
    init_s: float = 0.0  # seconds for ModelNew(*init)


@dataclass
class Comparison:
    """Outputs against the reference's (concur.verify.comparisons.compare): KernelBench's rule, stricter in
    hardened mode (`ok_finite`)."""

    ok_shape: bool = False  # as many outputs, each of the reference's shape
    ok_dtype: bool = False  # each of the reference's dtype
    ok_finite: bool = False  # no NaN or inf where the rule forbids them
    allclose: bool = False  # within the tolerance of the task's precision
    max_abs_err: float | None = None  # the largest absolute error over all outputs
    detail: str = ""  # which output failed, and how

    def passes(self) -> bool:
        return self.ok_shape and self.ok_dtype and self.ok_finite and self.allclose

    def failure(self) -> str:
        """Empty when it passes, else the failed comparison's name and detail (a reason's words)."""
        if not self.ok_shape:
            return f"shape_mismatch {self.detail}".strip()
        if not self.ok_dtype:
            return f"dtype_mismatch {self.detail}".strip()
        if not self.ok_finite:
            return f"non_finite {self.detail}".strip()
        if not self.allclose:
            err = math.nan if self.max_abs_err is None else self.max_abs_err
            return f"value_mismatch max_abs_err={err:.3g} {self.detail}".strip()
        return ""


@dataclass
class Trial:
    """One correctness trial (reference and candidate on the same fresh inputs), or a timing call that failed."""

    number: int  # 1, 2, ... in the order run
    kind: str  # random (the task's own draw) | signed (inputs of both signs) | timing (a timing command failed)
    error: str | None = None  # the candidate's call raised (its one-line description)
    skipped: str = ""  # why the trial was not judged (a signed draw on which the reference is not finite)
    plain: bool | None = None  # every output a plain torch.Tensor (None: no outputs came back)
    mutated: list[int] = field(default_factory=list)  # positions of inputs it changed that the reference never does
    unready: str = ""  # its outputs were not ready on the caller's stream when it returned (comparisons.unready)
    comparison: Comparison | None = None  # the outputs against the reference's (None: never compared)


@dataclass
class Precision:
    """Relative errors against the reference run in float64, on the same inputs (the precision flag reads them)."""

    e_ref: float = math.nan  # the reference, run in the task's precision
    e_new: float = math.nan  # the candidate
    skipped: str = ""  # why there is no float64 run (too large, no floating output, no float64 reference)


@dataclass
class Times:
    """One side's time per call (concur.verify.timing.summary; kernelbench mode: timing.kernelbench_summary)."""

    mean_ms: float = math.nan
    median_ms: float = math.nan
    best_ms: float = math.nan  # the quickest batch's (hardened: the side's time)
    resolved: bool = True  # the quickest batch lasted long enough for the clock to resolve it
    copy_excess_ms: float = 0.0  # what the candidate's copies added to its quickest batch over the reference's
    cv: float = 0.0  # coefficient of variation of the batches' times
    batches: int = 0  # batches (kernelbench: trials) timed


@dataclass
class Timing:
    """The candidate's and the reference's times."""

    ref: Times
    new: Times
    calls_per_batch: int = 1  # calls a timed batch holds
    settled_by: str = ""  # "correctness calls": the candidate was timed by those, being clearly slower
    resolve_ms: float = 0.0  # the least net time of a batch the clock resolves on this device
    deferred: bool = False  # its hand-offs took clearly longer than the reference's: work left past its reply
    cores: float = 0.0  # CPU: cores the candidate's processes kept busy while timed
    cores_resolution: float = 0.0  # CPU: the error of that reading, from the CPU clock's tick
    cores_allowed: float = math.inf  # CPU: the threads it was given


@dataclass
class Timed:
    """What the checks of the candidate's timed calls found (hardened)."""

    calls: int = 0  # timed calls made
    signed: int = 0  # of them, drawn with inputs of both signs
    unchecked: int = 0  # signed calls left unchecked: the reference is not finite on their inputs
    mismatch: str = ""  # the first timed call whose checked outputs differ from the reference's, and how
    unready: str = ""  # the first timed call whose outputs were not ready when it returned (comparisons.unready)
    mutated: list[int] = field(default_factory=list)  # positions of inputs a timed call changed (as in Trial)
    settled_by: str = ""  # "correctness calls" when no batch was timed
    profiled: bool = False  # the profiled call among the timed ones was made


@dataclass
class Profile:
    """What ran in the candidate's forward under the profiler (CUDA: kernels; CPU: ATen operators)."""

    device: str = ""  # cuda | cpu
    names: dict[str, int] | None = None  # everything its profiled calls ran, with counts (None: not profiled)
    reference: dict[str, int] | None = None  # what the reference's forward runs
    own: list[str] | None = None  # kernels compiled from its source (None: not known)
    launched_own: list[str] = field(default_factory=list)  # its own kernels launched on every profiled call


@dataclass
class State:
    """What the candidate left changed in its process after its calls."""

    backend_changed: list[str] = field(default_factory=list)  # backend flags not as the referee set them
    tampered: list[str] = field(default_factory=list)  # harness functions replaced


@dataclass
class Baseline:
    """The task's reference compiled under one baseline (torch.compile mode), timed as eager is."""

    ref: Times | None = None  # its time (None: it failed)
    error: str = ""  # why it failed
    compile_s: float = 0.0  # the first call, which compiled it


@dataclass
class Report:
    """Everything the referee measured on one job; the fields a job never reached keep their defaults."""

    device: str = ""  # the referee's device: cpu, or cuda:<name>
    sandbox: str = ""  # how the candidate's process was confined (landlock | none)
    failure: Failure | None = None  # the job stopped early
    reference_error: str = ""  # the task's reference failed (its candidates get runtime errors)
    load: Load | None = None  # None: the candidate's program was never loaded
    counted_modules: int = 0  # extension modules loaded whose calls are counted
    kernel_calls: int = 0  # calls into those during the correctness trials
    trials: list[Trial] = field(default_factory=list)
    precision: Precision | None = None  # on the first correctness trial
    precision_timed: Precision | None = None  # on the timed call checked whole
    timing: Timing | None = None  # None: never timed
    timed: Timed | None = None  # hardened: the checks of the timed calls
    profile: Profile | None = None
    state: State | None = None
    degenerate: list[str] | None = None  # trivial outputs that pass the task's check (None: not probed)
    baselines: dict[str, Baseline] = field(default_factory=dict)
    floor_ms: float | None = None  # the least time a call can take: writing its outputs once (timing.beats_roofline)
    ref_hotspots: str = ""  # the reference's costliest kernels, for a person
    gpu_s: float = 0.0  # seconds the job held the device
    # the referee's own, read as the job goes (no verdict reads them):
    call_s: list[float] = field(default_factory=list)  # each correctness call's seconds
    steady_call_s: list[float] = field(default_factory=list)  # of them, warm unprofiled calls on random draws
    profiled: list[dict | None] = field(default_factory=list)  # what each profiled call ran, until inspected
    trace: dict = field(default_factory=dict)  # opt-in (a job's `trace`): benchmarks' stage seconds and readings

    def to_data(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_data(cls, data: dict) -> Report:
        return _build(cls, data)


def _build(cls, data: dict):
    """An instance of dataclass `cls` from plain data, recursively; keys it does not have are left out."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name])
    return cls(**values)


def _value(hint, value):
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _build(hint, value)
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return [_build(args[0], v) if isinstance(v, dict) else v for v in value]
    if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return {k: _build(args[1], v) if isinstance(v, dict) else v for k, v in value.items()}
    return value

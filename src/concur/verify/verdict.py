"""Every verdict decided in one place: status, reason, flags and speedup, from the referee's report.

The referee (concur.verify.referee) measures and reports (concur.verify.report); nothing there decides. `before_run`
settles the candidates no process needs to see (no code, the static screen, a failed build); `judge` walks CHECKS
in order and the first check that finds something decides the status and the one-line `reason`; `decide` makes the
verdict row: times, the speedup over eager and over each baseline, and FLAGS, which mark a correct verdict for a
person or for curation without changing its status. The referee stops a job once a trial settles it
(`trial_settles`, from the same table). Names in reasons (`screen:<rule>`, `check:<name>`) and flags are stable:
docs/data.md §4 lists them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from concur import contracts
from concur.text import one_line
from concur.verify import modes, timing
from concur.verify.report import Baseline, Precision, Report, Times, Trial
from concur.verify.screen import screen

REDUCED_FACTOR, REDUCED_FLOOR = 32.0, 1e-5  # precision: error over 32x the reference's own, and over 1e-5
TERMINAL_BUILDS = ("no_code", "rejected", "compile_error", "timeout", "runtime_error")  # a build that ends the job
# operators that move or allocate but compute nothing: a candidate may share these with the reference (CPU rule)
NON_COMPUTE_OPS = {
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "view",
    "reshape",
    "_reshape_alias",
    "_unsafe_view",
    "as_strided",
    "contiguous",
    "clone",
    "copy_",
    "to",
    "_to_copy",
    "detach",
    "t",
    "transpose",
    "permute",
    "expand",
    "select",
    "slice",
    "unsqueeze",
    "squeeze",
    "flatten",
    "narrow",
    "split",
    "chunk",
    "unbind",
    "resize_",
    "lift_fresh",
    "alias",
    "fill_",
    "zero_",
    "item",
    "_local_scalar_dense",
    "result_type",
    "set_",
    "is_nonzero",
    "numpy_T",
    "expand_as",
    "view_as",
    "reshape_as",
    "split_with_sizes",
    "unflatten",
    "movedim",
    "_has_compatible_shallow_copy_type",
    "dim",
    "size",
    "stride",
    "is_same_size",
}


# ---------------------------------------------------------------- before any process


def before_run(solution: str, build: dict | None, settings: dict) -> tuple[str, str] | None:
    """(status, reason) when no referee needs to see the candidate: no code, rejected by the static screen
    (hardened), or a build (concur.verify.compiling's row) that ended it; else None."""
    if not solution.strip():
        return "no_code", "no code block in the answer"
    if modes.of(settings).screen:
        findings = screen(solution)
        if findings:
            return "rejected", f"screen:{findings[0].rule}"
    if build is not None and build["status"] in TERMINAL_BUILDS:
        return build["status"], build["reason"]
    return None


# ---------------------------------------------------------------- the checks


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    hardened_only: bool  # applies where the mode's `strict_checks` says so
    judge: Callable[[Report], str | None]  # the reason when the check fails, else None


def _failure(kinds: tuple[str, ...]):
    def judge(report: Report) -> str | None:
        failure = report.failure
        if failure is None or failure.kind not in kinds:
            return None
        if failure.kind == "timeout":
            return f"timeout after {failure.seconds:g} s during {failure.stage}"
        if failure.kind in ("memory", "processes"):
            return f"killed during {failure.stage}: {failure.detail}"
        if failure.kind == "referee":
            return f"verifier: {failure.detail}"
        if failure.kind == "protocol":
            return f"check:protocol: during {failure.stage}: {failure.detail}"
        return f"crashed during {failure.stage}: {failure.detail}"

    return judge


def _reference(report: Report) -> str | None:
    return f"reference: {report.reference_error}" if report.reference_error else None


def _build(report: Report) -> str | None:
    load = report.load
    if load is not None and (load.syntax_error or load.build_error):
        return load.build_error or load.error
    return None


def _import(report: Report) -> str | None:
    load = report.load
    if load is None:
        return "crashed before loading the program"
    if not load.ok:
        return f"import: {load.error}"
    if not load.has_class:
        return "no ModelNew"
    return load.error  # ModelNew(*init) failed


def _trial_error(report: Report) -> str | None:
    return next((str(t.error) for t in report.trials if t.error), None)


def _output_type(report: Report) -> str | None:
    for trial in report.trials:
        if trial.plain is False:
            return f"check:output_type: trial {trial.number}: an output is not a plain torch.Tensor"
    return None


def _mutation(report: Report) -> str | None:
    timed = report.timed.mutated if report.timed is not None else []
    mutated = sorted({i for t in report.trials for i in t.mutated} | set(timed))
    return f"check:input_mutation: ModelNew changed input(s) {mutated}" if mutated else None


def _trial_failure(trial: Trial) -> str:
    """Empty when the trial was skipped or its comparison passed, else the failed comparison's name and detail."""
    if trial.skipped or trial.error:
        return ""
    return "no outputs compared" if trial.comparison is None else trial.comparison.failure()


def _trials(report: Report) -> str | None:
    for trial in report.trials:
        failed = _trial_failure(trial)
        if failed:
            prefix = "check:signed_inputs: " if trial.kind == "signed" else ""
            return f"{prefix}trial {trial.number}: {failed}"
    return None


def _not_ready(report: Report) -> str | None:
    trial = next((t for t in report.trials if t.unready), None)
    if trial is not None:
        return f"check:not_ready: trial {trial.number}: {trial.unready}"
    return f"check:not_ready: {report.timed.unready}" if report.timed is not None and report.timed.unready else None


def _timed_outputs(report: Report) -> str | None:
    mismatch = report.timed.mismatch if report.timed is not None else ""
    return f"check:timed_outputs: {mismatch}" if mismatch else None


def _timing(report: Report) -> str | None:
    return None if report.timing is not None else "no timing reported"


def _threads(report: Report) -> str | None:
    times = report.timing
    if report.device != "cpu" or times is None:
        return None
    if times.cores > times.cores_allowed + 0.5 + times.cores_resolution:
        return f"check:threads: used {times.cores:.1f} cores while timed, {times.cores_allowed:g} allowed"
    return None


def _backend_state(report: Report) -> str | None:
    changed = report.state.backend_changed if report.state is not None else []
    return f"check:backend_state: {', '.join(changed)} changed" if changed else None


def _tampering(report: Report) -> str | None:
    replaced = report.state.tampered if report.state is not None else []
    return f"check:tampering: replaced {', '.join(replaced[:5])}" if replaced else None


def _kernel_not_called(report: Report) -> str | None:
    if report.counted_modules and not report.kernel_calls:
        return "check:kernel_not_called: forward never called into the compiled extension"
    return None


def _no_own_kernel(report: Report) -> str | None:
    profile = report.profile
    if profile is None or profile.device != "cuda" or profile.own is None or not profile.names:
        return None
    if not profile.launched_own:
        count = sum(profile.names.values())
        return f"check:profiler_no_own_kernel: {count} kernel launch(es), none of a kernel compiled from its source"
    return None


def _replaced_nothing(report: Report) -> str | None:
    profile = report.profile
    if profile is None:
        return None
    reference = set(compute_steps(profile.reference or {}, profile.device))
    theirs = set(profile.names or {}) - set(profile.launched_own)
    if reference and reference <= theirs:
        what = "kernel" if profile.device == "cuda" else "operator"
        return f"check:replaced_nothing: ModelNew still runs every {what} the reference runs ({len(reference)})"
    return None


def compute_steps(names: dict, device: str | None) -> list[str]:
    """The reference's kernels (CUDA) or its computing ATen operators (CPU)."""
    if device == "cuda":
        return list(names)
    return [n for n in names if n.removeprefix("aten::") not in NON_COMPUTE_OPS]


CHECKS = [
    Check("referee", "runtime_error", False, _failure(("referee",))),
    Check("reference", "runtime_error", False, _reference),
    Check("timeout", "timeout", False, _failure(("timeout",))),
    Check("protocol", "rejected", False, _failure(("protocol",))),
    Check("crash", "runtime_error", False, _failure(("crash", "memory", "processes"))),
    Check("build", "compile_error", False, _build),
    Check("import", "runtime_error", False, _import),
    Check("trial_error", "runtime_error", False, _trial_error),
    Check("output_type", "rejected", True, _output_type),
    Check("input_mutation", "rejected", True, _mutation),
    Check("trials", "incorrect", False, _trials),
    Check("timed_outputs", "incorrect", True, _timed_outputs),
    Check("not_ready", "incorrect", True, _not_ready),  # after: an output reused by later calls fails both
    Check("timing", "runtime_error", False, _timing),
    Check("threads", "rejected", True, _threads),
    Check("backend_state", "rejected", True, _backend_state),
    Check("tampering", "rejected", True, _tampering),
    Check("kernel_not_called", "rejected", True, _kernel_not_called),
    Check("profiler_no_own_kernel", "rejected", True, _no_own_kernel),
    Check("replaced_nothing", "rejected", True, _replaced_nothing),
]
TRIAL_CHECKS = ("trial_error", "output_type", "input_mutation", "trials", "not_ready")  # decided by one trial alone


def applying(mode: str) -> list[Check]:
    """The checks `mode` applies, in order: the hardened-only ones where its checks are strict."""
    strict = modes.MODES[mode].strict_checks
    return [check for check in CHECKS if strict or not check.hardened_only]


def judge(report: Report, mode: str) -> tuple[str, str]:
    """(status, reason) of a verdict: the first check that fails, else ("correct", "")."""
    for check in applying(mode):
        reason = check.judge(report)
        if reason:
            return check.status, one_line(reason)
    return "correct", ""


def trial_settles(trial: Trial, mode: str) -> bool:
    """This correctness trial alone already fails the verdict (the referee runs no further trial, nor times it)."""
    alone = Report(trials=[trial])
    return any(check.judge(alone) for check in applying(mode) if check.name in TRIAL_CHECKS)


# ---------------------------------------------------------------- flags


PRECISION_NAMES = (
    ("bf16", r"(?i)bfloat16|\bbf16\b"),
    ("fp16", r"(?i)\bhalf\b|(?<![a-z])float16|\bfp16\b|__half\b|::half\b"),
    ("tf32", r"(?i)tf32"),
)


def precision_flag(report: Report, source: str, task_precision: str = "fp32") -> str | None:
    """`precision:<name>` when the candidate's error against a float64 reference is far above the reference's own
    (run in the task's precision), on the first correctness trial or on the timed call checked whole: named after
    the lower-precision type its source uses (never the task's own), else `reduced`."""
    if not any(_reduced(p) for p in (report.precision, report.precision_timed) if p is not None):
        return None
    changed = " ".join(report.state.backend_changed if report.state is not None else [])
    names = [  # the task's own precision is no reduction: an fp16 task's kernels are written in half
        name
        for name, pattern in PRECISION_NAMES
        if name != task_precision and re.search(pattern, source + " " + changed)
    ]
    return f"precision:{'+'.join(names) or 'reduced'}"


def _reduced(precision: Precision) -> bool:
    e_ref, e_new = precision.e_ref, precision.e_new
    floor = max(REDUCED_FACTOR * (e_ref if math.isfinite(e_ref) else 0.0), REDUCED_FLOOR)
    return math.isfinite(e_new) and e_new > floor


def flags(report: Report, speedup: float, settings: dict, source: str) -> list[str]:
    """Marks on a correct verdict; they never change its status (curation reads some of them)."""
    marks = []
    if speedup > float(settings["audit_speedup"]):
        marks.append(f"audit:speedup>{settings['audit_speedup']:g}")
    precision = precision_flag(report, source, settings.get("precision") or "fp32")
    if precision:
        marks.append(precision)
    times = report.timing
    if times is not None and times.deferred:
        marks.append("timing:deferred_work")
    if times is not None and not timing.resolved(times.ref, times.new):
        marks.append("timing:unresolved")  # no speedup was made (timing.speedup)
    if times is not None and timing.beats_roofline(times.new, report.floor_ms, times.ref):
        marks.append("timing:beats_roofline")  # curation leaves it out
    if report.profile is not None and report.profile.device == "cuda" and report.profile.names == {}:
        marks.append("profiler_saw_no_kernels")
    if modes.of(settings).strict_checks and report.sandbox == "none":
        marks.append("sandbox:none")
    return marks


# ---------------------------------------------------------------- the verdict row


def blank(status: str, reason: str, settings: dict, label: str) -> dict:
    """A verdict row (contracts.VERDICTS, less the ids) with no measurement in it."""
    nan = math.nan
    return {
        "status": status,
        "reason": reason,
        "compiled": False,
        "correct": False,
        "ref_ms": nan,
        "new_ms": nan,
        "ref_median_ms": nan,
        "new_median_ms": nan,
        "ref_best_ms": nan,
        "new_best_ms": nan,
        "speedup": 0.0,
        "max_abs_err": nan,
        "device": label,
        "verify_mode": settings["mode"],
        "compile_s": 0.0,
        "eval_s": 0.0,
        "flags": "",
        "trusted": True,
        "ref_hotspots": "",
        # a failed candidate is no faster than any baseline timed (NaN: one not timed)
        **{contracts.speedup_column(b): 0.0 for b in settings.get("baselines") or [] if b != "eager"},
    }


def baseline_speedups(baselines: dict[str, Baseline], candidate: Times, stat: str) -> dict[str, float]:
    """The candidate's speedup over each baseline that was timed (NaN where one failed or is unresolved)."""
    return {
        name: timing.speedup(found.ref, candidate, stat) if found.ref is not None else math.nan
        for name, found in baselines.items()
    }


def decide(report: Report, settings: dict, solution: str, compile_s: float, label: str) -> dict:
    """The verdict row from a referee's report (`settings`: the job's, its precision included)."""
    verdict = blank("runtime_error", "", settings, report.device or label)
    status, reason = judge(report, settings["mode"])
    errors = [t.comparison.max_abs_err for t in report.trials if t.comparison and t.comparison.max_abs_err is not None]
    verdict.update(
        status=status,
        reason=reason,
        correct=status == "correct",
        compiled=bool(report.load and report.load.ok),
        compile_s=float(compile_s or 0.0),
        eval_s=float(report.gpu_s or 0.0),
        max_abs_err=float(max(errors)) if errors else math.nan,
    )
    if status == "correct":
        ref, new, stat = report.timing.ref, report.timing.new, modes.of(settings).speedup_stat
        verdict.update(
            ref_ms=ref.mean_ms,
            new_ms=new.mean_ms,
            ref_median_ms=ref.median_ms,
            new_median_ms=new.median_ms,
            ref_best_ms=ref.best_ms,
            new_best_ms=new.best_ms,
            speedup=timing.speedup(ref, new, stat),
            ref_hotspots=report.ref_hotspots,
        )
        for name, value in baseline_speedups(report.baselines, new, stat).items():
            verdict[contracts.speedup_column(name)] = value
        verdict["flags"] = ",".join(flags(report, verdict["speedup"], settings, solution))
    elif modes.of(settings).strict_checks and report.sandbox == "none":
        verdict["flags"] = "sandbox:none"
    return verdict


def mark_task_trust(verdict: dict, degenerate_kinds: list[str]) -> None:
    """A task whose check a trivial output passes makes every verdict on it untrustworthy."""
    if degenerate_kinds:
        verdict["trusted"] = False
        verdict["flags"] = ",".join(f for f in (verdict["flags"], "degenerate_task:" + "+".join(degenerate_kinds)) if f)

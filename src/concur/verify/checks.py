"""Every check of a verdict, defined and judged in one place.

The referee measures (concur.verify.referee) and reports raw facts; `judge` walks CHECKS in order and the first
check that finds something decides the status and the one-line `reason`; FLAGS mark a correct verdict for a person
or for curation without changing its status. The comparisons themselves (`compare`, `relative_error`,
`degenerate_kinds`) live here too, so the referee's numbers and the rules that read them cannot drift apart.
Names in reasons (`screen:<rule>`, `check:<name>`) and flags are stable: docs/data.md §4 lists them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from concur.verify import timing
from concur.verify.build import one_line

KERNELBENCH_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}  # KernelBench, after torchbench
PRECISION_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # contracts.PRECISIONS
REDUCED_FACTOR, REDUCED_FLOOR = 32.0, 1e-5  # precision: error over 32x the reference's own, and over 1e-5
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


# ---------------------------------------------------------------- comparisons


def tolerance(dtype: str, settings: dict) -> tuple[float, float]:
    """(atol, rtol): the configured ones, else KernelBench's: for a floating output, its rule for the task's
    precision (`settings["precision"]`: fp32 1e-4, fp16 and bf16 1e-2), else for the output's dtype when the task
    has no precision; exact for integers and bools."""
    name = str(dtype).removeprefix("torch.")
    default = KERNELBENCH_TOLERANCE.get(name, 1e-4 if "float" in name or "complex" in name else 0.0)
    precision = settings.get("precision")
    if precision and default and "complex" not in name:
        default = KERNELBENCH_TOLERANCE[PRECISION_DTYPES[precision]]
    atol, rtol = settings.get("atol"), settings.get("rtol")
    return (default if atol is None else float(atol)), (default if rtol is None else float(rtol))


def compare(
    new: list, ref: list, settings: dict, strict_finite: bool, leaf_scale: bool = False, peaks: list | None = None
) -> dict:
    """Facts about output leaves against the reference's: count, shape, dtype, NaN/inf, allclose, largest error.

    KernelBench semantics: same number of outputs and shapes, `allclose` in the output's dtype (NaN never equals
    NaN); the dtype must match too. `strict_finite` (hardened): any NaN or inf in the candidate's output fails.
    `leaf_scale` (signed trials): rtol counts against the leaf's largest magnitude rather than each element's, since
    signed inputs cancel in sums and leave elements near zero whose float32 rounding alone exceeds an element-wise
    tolerance (a long dot product computed in another order); a kernel that mishandles signs is off by far more.
    `peaks`: those largest magnitudes given per leaf (leaf_peaks of the whole output, where `ref` is a sample)."""
    import torch

    if len(new) != len(ref):
        return {"ok_shape": False, "detail": f"{len(new)} outputs, expected {len(ref)}"}
    facts = {"ok_shape": True, "ok_dtype": True, "ok_finite": True, "allclose": True, "max_abs_err": 0.0}
    for i, (a, b) in enumerate(zip(new, ref)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                facts.update(allclose=False, detail=f"output {i}: {a!r} != {b!r}")
            continue
        if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            return {"ok_shape": False, "detail": f"output {i}: got {got}, expected {tuple(b.shape)}"}
        if a.dtype != b.dtype:
            facts.update(ok_dtype=False, detail=f"output {i}: got {a.dtype}, expected {b.dtype}")
            continue
        a = a.to(b.device)
        atol, rtol = tolerance(str(b.dtype), settings)
        if (leaf_scale or peaks) and b.is_floating_point():
            atol, rtol = atol + rtol * (_peak(b) if peaks is None else peaks[i]), 0.0
        finite, worst, close = _compare_tensor(a, b, atol, rtol)
        if strict_finite and not finite:
            facts.update(ok_finite=False, detail=f"output {i}: NaN or inf in the output")
        facts["max_abs_err"] = max(facts["max_abs_err"], worst)
        if not close:
            facts["allclose"] = False
    return facts


CHUNK = 1 << 26  # elements compared at a time: the temporaries of a comparison stay small for multi-GB outputs


def _compare_tensor(a, b, atol: float, rtol: float) -> tuple[bool, float, bool]:
    """(all finite, largest error, allclose) of two tensors of one shape, chunk by chunk."""
    import torch

    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    finite, worst, close = True, 0.0, True
    for start in range(0, flat_a.numel(), CHUNK):
        x, y = flat_a[start : start + CHUNK], flat_b[start : start + CHUNK]
        if x.is_floating_point() or x.is_complex():
            finite = finite and bool(torch.isfinite(x).all())
        worst = max(worst, max_abs_error(x, y))
        close = close and _allclose(x, y, atol, rtol)
    return finite, worst, close


def leaf_peaks(outputs: list) -> list[float | None] | None:
    """Each floating leaf's largest magnitude (None for other leaves); None where any leaf holds NaN or inf."""
    import torch

    floating = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point()]
    if not all(bool(torch.isfinite(o).all()) for o in floating):
        return None
    return [_peak(o) if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outputs]


def _peak(t) -> float:
    """Largest finite magnitude of a floating tensor, chunk by chunk (0 when it has none)."""
    import torch

    flat, peak = t.reshape(-1), 0.0
    for start in range(0, flat.numel(), CHUNK):
        part = flat[start : start + CHUNK].abs()
        part = part[torch.isfinite(part)]
        peak = max(peak, float(part.max()) if part.numel() else 0.0)
    return peak


def _allclose(a, b, atol: float, rtol: float) -> bool:
    import torch

    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, atol=atol, rtol=rtol))
    if atol == rtol == 0:
        return bool(torch.equal(a, b))
    return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol))


def max_abs_error(a, b) -> float:
    """Largest |a - b| over the elements, matching NaNs counting as equal, a NaN against a number as infinite."""
    import torch

    if a.numel() == 0:
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return float((a.double() - b.double()).abs().max())
    diff = (a - b).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if math.isfinite(worst):
        return worst
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return float(torch.nan_to_num(torch.where(same, torch.zeros_like(diff), diff), nan=math.inf).max())


def relative_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ over all floating leaves (NaN when there are none or b is zero)."""
    import torch

    num = den = 0.0
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and y.is_floating_point() and x.numel():
            y64 = y.to(torch.float64)
            num += float(((x.to(y.device, torch.float64) - y64) ** 2).sum())
            den += float((y64**2).sum())
    return math.sqrt(num / den) if den > 0 and math.isfinite(num) else math.nan


def structure(metas: list[dict], reference: list[dict]) -> str | None:
    """Why the candidate's outputs cannot be compared byte for byte with the reference's, or None."""
    if len(metas) != len(reference):
        return f"shape_mismatch {len(metas)} outputs, expected {len(reference)}"
    for i, (m, r) in enumerate(zip(metas, reference)):
        if m["t"] != r["t"]:
            return f"shape_mismatch output {i}: got a {m['t']}, expected a {r['t']}"
        if m["t"] == "tensor" and m["shape"] != r["shape"]:
            return f"shape_mismatch output {i}: got {tuple(m['shape'])}, expected {tuple(r['shape'])}"
        if m["t"] == "tensor" and m["dtype"] != r["dtype"]:
            return f"dtype_mismatch output {i}: got {m['dtype']}, expected {r['dtype']}"
    return None


def batch_structure(metas, reference: list[dict], calls: int) -> tuple[int, str] | None:
    """The first call of a batch whose outputs (metadata from the contestant's reply, in whatever form it sent)
    are not laid out as the reference's, and why; None when all are."""
    if not isinstance(metas, list) or len(metas) != calls:
        return 0, f"shape_mismatch outputs of {len(metas) if isinstance(metas, list) else 0} calls, expected {calls}"
    for i, call in enumerate(metas):
        try:
            mismatch = structure(call, reference) if isinstance(call, list) else "shape_mismatch no list of outputs"
        except (KeyError, TypeError):
            mismatch = "shape_mismatch outputs described in no known form"
        if mismatch:
            return i, mismatch
    return None


def passes(facts: dict) -> bool:
    return all(facts.get(k, False) for k in ("ok_shape", "ok_dtype", "ok_finite", "allclose")) and not facts.get(
        "error"
    )


def degenerate_kinds(ref: list, inputs: list, previous: list | None, settings: dict) -> set[str]:
    """Trivial answers that pass this trial's check without computing anything: all zeros, a constant, one of the
    inputs, or the reference's output on other inputs (`other_inputs`). A guess is tried on a sample of elements
    first: most fail there, and only those that pass it are compared everywhere (chunk by chunk, never made whole)."""
    import torch

    if not ref or not all(isinstance(r, torch.Tensor) and r.numel() for r in ref):
        return set()
    flat = [r.reshape(-1) for r in ref]
    means = [_mean64(f) for f in flat]
    guesses = {
        "zeros": lambda i, at: torch.zeros_like(flat[i][at]),
        "constant": lambda i, at: torch.full_like(flat[i][at], means[i]),
    }
    same = [x for x in inputs if isinstance(x, torch.Tensor) and len(ref) == 1 and x.shape == ref[0].shape]
    if same:
        source = same[0].reshape(-1)
        guesses["identity"] = lambda i, at: source[at].to(flat[i].device, flat[i].dtype)
    if previous is not None and [tuple(p.shape) for p in previous] == [tuple(r.shape) for r in ref]:
        before = [p.reshape(-1) for p in previous]
        guesses["other_inputs"] = lambda i, at: before[i][at]
    sample = [torch.randint(0, f.numel(), (min(f.numel(), 4096),), device=f.device) for f in flat]
    found = set()
    for kind, guess in guesses.items():
        if all(_passes_everywhere(guess, i, f, sample[i], settings) for i, f in enumerate(flat)):
            found.add(kind)
    return found


def _mean64(flat) -> float:
    """The mean in float64, chunk by chunk (a float64 copy of a multi-GB output would not fit beside it)."""
    total = sum(float(flat[s : s + CHUNK].double().sum()) for s in range(0, flat.numel(), CHUNK))
    return total / max(1, flat.numel())


def _passes_everywhere(guess, index: int, flat, sample, settings: dict) -> bool:
    atol, rtol = tolerance(str(flat.dtype), settings)
    if not _allclose(guess(index, sample), flat[sample], atol, rtol):
        return False
    for start in range(0, flat.numel(), CHUNK):
        part = slice(start, min(start + CHUNK, flat.numel()))
        if not _allclose(guess(index, part), flat[part], atol, rtol):
            return False
    return True


def degenerate_everywhere(per_trial: list[set[str]]) -> list[str]:
    """Kinds that passed every trial they could be tried on (`other_inputs` needs a previous trial)."""
    if not per_trial:
        return []
    kinds = set.intersection(*per_trial) - {"other_inputs"}
    later = per_trial[1:]
    if later and set.intersection(*later) >= {"other_inputs"}:
        kinds.add("other_inputs")
    return sorted(kinds)


# ---------------------------------------------------------------- the checks


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    hardened_only: bool
    judge: Callable[[dict], str | None]  # the reason when the check fails, else None


def _failure(kinds: tuple[str, ...]):
    def judge(facts: dict) -> str | None:
        failure = facts.get("failure") or {}
        if failure.get("kind") not in kinds:
            return None
        if failure["kind"] == "timeout":
            return f"timeout after {failure['seconds']:g} s during {failure['stage']}"
        if failure["kind"] in ("memory", "processes"):
            return f"killed during {failure['stage']}: {failure['detail']}"
        if failure["kind"] == "referee":
            return f"verifier: {failure['detail']}"
        if failure["kind"] == "protocol":
            return f"check:protocol: during {failure['stage']}: {failure['detail']}"
        return f"crashed during {failure['stage']}: {failure['detail']}"

    return judge


def _reference(facts: dict) -> str | None:
    return f"reference: {facts['reference_error']}" if facts.get("reference_error") else None


def _build(facts: dict) -> str | None:
    load = facts.get("load") or {}
    if load and (load.get("syntax_error") or load.get("build_error")):
        return load.get("build_error") or load.get("error")
    return None


def _import(facts: dict) -> str | None:
    load = facts.get("load") or {}
    if not load:
        return "crashed before loading the program"
    if not load.get("ok"):
        return f"import: {load.get('error')}"
    if not load.get("has_class"):
        return "no ModelNew"
    return load.get("error")  # ModelNew(*init) failed


def _trial_error(facts: dict) -> str | None:
    for trial in facts.get("trials", []):
        if trial.get("error"):
            return trial["error"]
    return None


def _output_type(facts: dict) -> str | None:
    for trial in facts.get("trials", []):
        if trial.get("plain") is False:
            return f"check:output_type: trial {trial['number']}: an output is not a plain torch.Tensor"
    return None


def _mutation(facts: dict) -> str | None:
    mutated = sorted(
        {i for t in facts.get("trials", []) for i in t.get("mutated", [])}
        | set((facts.get("timed") or {}).get("mutated", []))
    )
    return f"check:input_mutation: ModelNew changed input(s) {mutated}" if mutated else None


def trial_failure(trial: dict) -> str:
    """Empty when the trial's comparison passed, else the failed comparison's name and detail."""
    detail = trial.get("detail", "")
    if not trial.get("ok_shape", False):
        return f"shape_mismatch {detail}".strip()
    if not trial.get("ok_dtype", False):
        return f"dtype_mismatch {detail}".strip()
    if not trial.get("ok_finite", False):
        return f"non_finite {detail}".strip()
    if not trial.get("allclose", False):
        return f"value_mismatch max_abs_err={trial.get('max_abs_err', math.nan):.3g} {detail}".strip()
    return ""


def _trials(facts: dict) -> str | None:
    for trial in facts.get("trials", []):
        if trial.get("skipped"):
            continue
        failed = trial_failure(trial)
        if failed:
            prefix = "check:signed_inputs: " if trial.get("kind") == "signed" else ""
            return f"{prefix}trial {trial['number']}: {failed}"
    return None


def _timed_outputs(facts: dict) -> str | None:
    mismatch = (facts.get("timed") or {}).get("mismatch")
    return f"check:timed_outputs: {mismatch}" if mismatch else None


def _timing(facts: dict) -> str | None:
    timing = facts.get("timing") or {}
    return None if timing.get("ref") and timing.get("new") else "no timing reported"


def _threads(facts: dict) -> str | None:
    timing = facts.get("timing") or {}
    slack = 0.5 + timing.get("cores_resolution", 0.0)
    if facts.get("device") == "cpu" and timing.get("cores", 0) > timing.get("cores_allowed", math.inf) + slack:
        return f"check:threads: used {timing['cores']:.1f} cores while timed, {timing['cores_allowed']} allowed"
    return None


def _backend_state(facts: dict) -> str | None:
    changed = (facts.get("state") or {}).get("backend_changed")
    return f"check:backend_state: {', '.join(changed)} changed" if changed else None


def _tampering(facts: dict) -> str | None:
    replaced = (facts.get("state") or {}).get("tampered")
    return f"check:tampering: replaced {', '.join(replaced[:5])}" if replaced else None


def _kernel_not_called(facts: dict) -> str | None:
    if facts.get("counted_modules") and not facts.get("kernel_calls"):
        return "check:kernel_not_called: forward never called into the compiled extension"
    return None


def _no_own_kernel(facts: dict) -> str | None:
    profile = facts.get("profile") or {}
    if profile.get("device") != "cuda" or profile.get("own") is None or not profile.get("names"):
        return None
    if not profile.get("launched_own"):
        count = sum(profile["names"].values())
        return f"check:profiler_no_own_kernel: {count} kernel launch(es), none of a kernel compiled from its source"
    return None


def _replaced_nothing(facts: dict) -> str | None:
    profile = facts.get("profile") or {}
    reference = set(compute_steps(profile.get("reference") or {}, profile.get("device")))
    theirs = set(profile.get("names") or {}) - set(profile.get("launched_own") or [])
    if reference and reference <= theirs:
        what = "kernel" if profile.get("device") == "cuda" else "operator"
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
    Check("timing", "runtime_error", False, _timing),
    Check("threads", "rejected", True, _threads),
    Check("backend_state", "rejected", True, _backend_state),
    Check("tampering", "rejected", True, _tampering),
    Check("kernel_not_called", "rejected", True, _kernel_not_called),
    Check("profiler_no_own_kernel", "rejected", True, _no_own_kernel),
    Check("replaced_nothing", "rejected", True, _replaced_nothing),
]


def judge(facts: dict, mode: str) -> tuple[str, str]:
    """(status, reason) of a verdict: the first check that fails, else ("correct", "")."""
    for check in CHECKS:
        if check.hardened_only and mode != "hardened":
            continue
        reason = check.judge(facts)
        if reason:
            return check.status, one_line(reason)
    return "correct", ""


# ---------------------------------------------------------------- flags


PRECISION_NAMES = (
    ("bf16", r"(?i)bfloat16|\bbf16\b"),
    ("fp16", r"(?i)\bhalf\b|(?<![a-z])float16|\bfp16\b|__half\b|::half\b"),
    ("tf32", r"(?i)tf32"),
)


def precision_flag(facts: dict, source: str, task_precision: str = "fp32") -> str | None:
    """`precision:<name>` when the candidate's error against a float64 reference is far above the reference's own
    (run in the task's precision), on the first correctness trial or on the timed call checked whole: named after
    the lower-precision type its source uses (never the task's own), else `reduced`."""
    if not any(_reduced(facts.get(key) or {}) for key in ("precision", "precision_timed")):
        return None
    changed = " ".join((facts.get("state") or {}).get("backend_changed") or [])
    names = [  # the task's own precision is no reduction: an fp16 task's kernels are written in half
        name
        for name, pattern in PRECISION_NAMES
        if name != task_precision and re.search(pattern, source + " " + changed)
    ]
    return f"precision:{'+'.join(names) or 'reduced'}"


def _reduced(precision: dict) -> bool:
    e_ref, e_new = precision.get("e_ref", math.nan), precision.get("e_new", math.nan)
    floor = max(REDUCED_FACTOR * (e_ref if math.isfinite(e_ref) else 0.0), REDUCED_FLOOR)
    return math.isfinite(e_new) and e_new > floor


def flags(facts: dict, verdict: dict, settings: dict, source: str) -> list[str]:
    """Marks on a correct verdict; they never change its status (curation reads some of them)."""
    marks = []
    if verdict["speedup"] > float(settings["audit_speedup"]):
        marks.append(f"audit:speedup>{settings['audit_speedup']:g}")
    precision = precision_flag(facts, source, settings.get("precision") or "fp32")
    if precision:
        marks.append(precision)
    if (facts.get("timing") or {}).get("deferred"):
        marks.append("timing:deferred_work")
    times = facts.get("timing") or {}
    if not timing.resolved(times.get("ref", {}), times.get("new", {})):
        marks.append("timing:unresolved")  # no speedup was made (timing.speedup)
    if timing.beats_roofline(times.get("new", {}), facts.get("floor_ms"), times.get("ref")):
        marks.append("timing:beats_roofline")  # curation leaves it out
    profile = facts.get("profile") or {}
    if profile.get("device") == "cuda" and profile.get("names") == {}:
        marks.append("profiler_saw_no_kernels")
    if settings["mode"] == "hardened" and facts.get("sandbox") == "none":
        marks.append("sandbox:none")
    return marks

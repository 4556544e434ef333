"""Outputs against the reference's: the comparisons every check of a verdict reads.

KernelBench's rule (`compare`: same outputs, shapes and dtypes, `allclose` in the task's precision), its tolerances
(`tolerance`), errors against a float64 run (`relative_error`), the layout of outputs a contestant describes before
they are handed off (`structure`), outputs not yet written when their call returned (`unready`), and the trivial
outputs a task's check lets pass (`degenerate_kinds`). The referee calls these as it measures; concur.verify.verdict
decides from what they found.
"""

from __future__ import annotations

import math

from concur.verify.report import Comparison

KERNELBENCH_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}  # KernelBench, after torchbench
PRECISION_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # contracts.PRECISIONS
REDUCED_FACTOR, REDUCED_FLOOR = 32.0, 1e-5  # precision: error over 32x the reference's own, and over 1e-5


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
) -> Comparison:
    """Output leaves against the reference's: count, shape, dtype, NaN/inf, allclose, largest error.

    KernelBench semantics: same number of outputs and shapes, `allclose` in the output's dtype (NaN never equals
    NaN); the dtype must match too. `strict_finite` (hardened): any NaN or inf in the candidate's output fails.
    `leaf_scale` (signed trials): rtol counts against the leaf's largest magnitude rather than each element's, since
    signed inputs cancel in sums and leave elements near zero whose float32 rounding alone exceeds an element-wise
    tolerance (a long dot product computed in another order); a kernel that mishandles signs is off by far more.
    `peaks`: those largest magnitudes given per leaf (leaf_peaks of the whole output, where `ref` is a sample)."""
    import torch

    if len(new) != len(ref):
        return Comparison(detail=f"{len(new)} outputs, expected {len(ref)}")
    found = Comparison(ok_shape=True, ok_dtype=True, ok_finite=True, allclose=True, max_abs_err=0.0)
    for i, (a, b) in enumerate(zip(new, ref)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                found.allclose, found.detail = False, f"output {i}: {a!r} != {b!r}"
            continue
        if not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(b.shape):
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            return Comparison(detail=f"output {i}: got {got}, expected {tuple(b.shape)}")
        if a.dtype != b.dtype:
            found.ok_dtype, found.detail = False, f"output {i}: got {a.dtype}, expected {b.dtype}"
            continue
        a = a.to(b.device)
        atol, rtol = tolerance(str(b.dtype), settings)
        if (leaf_scale or peaks) and b.is_floating_point():
            atol, rtol = atol + rtol * (_peak(b) if peaks is None else peaks[i]), 0.0
        finite, worst, close = _compare_tensor(a, b, atol, rtol)
        if strict_finite and not finite:
            found.ok_finite, found.detail = False, f"output {i}: NaN or inf in the output"
        found.max_abs_err = max(found.max_abs_err, worst)
        if not close:
            found.allclose = False
    return found


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


def identical(first: list, second: list) -> bool:
    """Two calls' outputs equal element for element, NaN equal to NaN only where both are NaN; the non-tensor ones
    by == (NaN equal to NaN too): whether a program gave the same answer twice (stochastic, stateful)."""
    import torch

    if len(first) != len(second):
        return False
    for a, b in zip(first, second):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if torch.equal(a, b):
                continue
            nan = a.isnan() if a.is_floating_point() or a.is_complex() else None
            if nan is None or not torch.equal(nan, b.isnan()):
                return False
            if not torch.equal(torch.where(nan, 0, a), torch.where(nan, 0, b)):
                return False
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or not (a == b or (a != a and b != b)):
            return False
    return True


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


def structure(metas: list[dict], reference: list[dict]) -> Comparison | None:
    """The failed comparison when the candidate's outputs (described by its contestant before the hand-off) are
    not laid out as the reference's, so cannot be compared byte for byte; None when they are."""
    if len(metas) != len(reference):
        return Comparison(detail=f"{len(metas)} outputs, expected {len(reference)}")
    for i, (m, r) in enumerate(zip(metas, reference)):
        if m["t"] != r["t"]:
            return Comparison(detail=f"output {i}: got a {m['t']}, expected a {r['t']}")
        if m["t"] == "tensor" and m["shape"] != r["shape"]:
            return Comparison(detail=f"output {i}: got {tuple(m['shape'])}, expected {tuple(r['shape'])}")
        if m["t"] == "tensor" and m["dtype"] != r["dtype"]:
            return Comparison(ok_shape=True, detail=f"output {i}: got {m['dtype']}, expected {r['dtype']}")
    return None


def batch_structure(metas, reference: list[dict], calls: int) -> tuple[int, Comparison] | None:
    """The first call of a batch whose outputs (metadata from the contestant's reply, in whatever form it sent)
    are not laid out as the reference's, and how; None when all are."""
    if not isinstance(metas, list) or len(metas) != calls:
        return 0, Comparison(
            detail=f"outputs of {len(metas) if isinstance(metas, list) else 0} calls, expected {calls}"
        )
    for i, call in enumerate(metas):
        try:
            mismatch = structure(call, reference) if isinstance(call, list) else Comparison(detail="no list of outputs")
        except (KeyError, TypeError):
            mismatch = Comparison(detail="outputs described in no known form")
        if mismatch:
            return i, mismatch
    return None


def unready(taken, outputs: list[list], first: int | None = None) -> str:
    """Empty when every element the contestant read as its call returned (`taken`, the reply's: [call, output,
    positions, bytes in hex], contestant.take) equals, bit for bit, the same element of that call's outputs as handed
    off after the batch (`outputs`: per call, the arena's views); else which output (of which call, numbered from
    `first`, where given) was not ready on the caller's stream, and how many of the elements read then changed."""
    import torch

    from concur.verify import exchange

    if taken is not None and not isinstance(taken, list):
        return f"the readings taken as calls returned are not a list: {str(taken)[:80]}"
    for entry in taken or []:
        try:
            call, leaf, where, seen = entry
            target = outputs[int(call)][int(leaf)]
            index = torch.tensor([int(w) for w in where], dtype=torch.long)
            size = target.numel() if isinstance(target, torch.Tensor) else 0
            if not len(index) or index.min() < 0 or index.max() >= size:
                raise ValueError
        except (TypeError, ValueError, IndexError):
            return f"a reading taken as a call returned names no output handed off: {str(entry)[:80]}"
        got = exchange.hex_bytes(torch.take(target, index.to(target.device)))
        if got != seen:
            width = 2 * target.element_size()  # hex digits an element
            changed = sum(got[i : i + width] != str(seen)[i : i + width] for i in range(0, len(got), width))
            name = "" if first is None else f"call {first + int(call)}: "
            return (
                f"{name}output {int(leaf)} was not ready on the caller's stream when the call returned"
                f" ({changed} of {len(index)} elements read then changed before the hand-off)"
            )
    return ""


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

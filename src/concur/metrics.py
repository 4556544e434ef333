"""Scoring primitives: the unbiased pass@k estimator, the geometric mean and the ARL difficulty bands."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

DIFFICULTIES = ("Easy", "Medium", "Hard")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c succeed: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the (huge) binomials.
    """
    for label, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or int(value) != value:
            raise ValueError(f"pass_at_k: {label}={value!r} is not an integer")
    n, c, k = int(n), int(c), int(k)
    if n < 1 or k < 1:
        raise ValueError(f"pass_at_k: need n >= 1 and k >= 1, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} must lie in 0..n={n}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} is larger than the number of samples n={n}")
    if n - c < k:  # every draw of k samples contains a success
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of non-negative values; NaN for no values, 0 when any value is 0."""
    data = [float(v) for v in values]
    if not data:
        return math.nan
    bad = [v for v in data if not (v >= 0) or math.isinf(v)]
    if bad:
        raise ValueError(f"geomean: values must be finite and >= 0, got {bad[0]!r}")
    if any(v == 0 for v in data):
        return 0.0
    return math.exp(math.fsum(math.log(v) for v in data) / len(data))


def check_thresholds(easy_below: float, hard_above: float) -> None:
    if easy_below > hard_above:
        raise ValueError(f"analyze: easy_below ({easy_below:g}) is above hard_above ({hard_above:g})")


def difficulty(arl: float, easy_below: float, hard_above: float) -> str:
    """The paper's bands of average reasoning length: Easy < easy_below <= Medium <= hard_above < Hard."""
    if arl < easy_below:
        return "Easy"
    return "Hard" if arl > hard_above else "Medium"


def difficulty_labels(arl, easy_below: float, hard_above: float) -> np.ndarray:
    """`difficulty` for an array of ARLs (an object array of labels; NaN gives Medium, so callers drop NaN first)."""
    arl = np.asarray(arl, dtype=float)
    return np.select([arl < easy_below, arl > hard_above], ["Easy", "Hard"], "Medium").astype(object)

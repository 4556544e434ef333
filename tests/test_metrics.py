"""pass@k, geomean and the eval score table, checked against hand-computed values."""

import math

import pandas as pd
import pytest

from concur.evaluate import score, score_columns, scores_markdown
from concur.metrics import geomean, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),          # c/n
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 0, 1, 0.0),
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),
    (4, 4, 4, 1.0),
    (3, 1, 2, 2 / 3),        # 1 - C(2,2)/C(3,2)
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # n=1000, c=1, k=1 -> 1/1000; binomials of this size would overflow a float
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert 0.0 < pass_at_k(2000, 3, 100) < 1.0


def test_pass_at_k_bad_arguments():
    with pytest.raises(ValueError, match="k=3 is larger than the number of samples n=2"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="c=5 must lie in 0..n=4"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(4, 1, 0)


def test_geomean():
    assert geomean([1.0, 2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([4.0, 9.0]) == pytest.approx(6.0)
    assert geomean([2.0, 0.0]) == 0.0
    assert math.isnan(geomean([]))
    with pytest.raises(ValueError, match="-1.0"):
        geomean([2.0, -1.0])


# ---------------------------------------------------------------- score table

TASKS = pd.DataFrame({
    "task_id": ["e/x", "e/y", "e/z"],
    "level": [1, 1, 2],
    "category": ["single_op", "single_op", "fused"],
    "name": ["x", "y", "z"],
})


def verdicts(rows):
    return pd.DataFrame(rows, columns=["task_id", "correct", "speedup"])


BASE = verdicts([
    ("e/x", True, 1.0),   # speedup exactly 1.0: correct but NOT fast_1
    ("e/x", True, 2.0),
    ("e/x", False, 0.0),
    ("e/y", False, 0.0),
    ("e/y", False, 0.0),
    ("e/z", True, 0.5),   # a single sample: no pass@2 estimate for e/z
])
SETTINGS = {"pass_k": [1, 2], "fast_p": [0, 1]}


def row(table, model, scope, group):
    match = table[(table["model"] == model) & (table["scope"] == scope) & (table["group"] == group)]
    assert len(match) == 1
    return match.iloc[0]


def test_score_columns_in_contract_order():
    table = score({"base": BASE}, TASKS, SETTINGS)
    assert list(table.columns) == [
        "model", "scope", "group", "n_tasks", "n_samples", "exec", "pass@1", "pass@2", "fast_0", "fast_1",
        "fast_0@1", "fast_0@2", "fast_1@1", "fast_1@2", "mean_speedup", "geomean_speedup"]
    assert list(zip(table["scope"], table["group"])) == [
        ("overall", "all"), ("level", "1"), ("level", "2"), ("category", "fused"), ("category", "single_op")]
    assert score_columns([1], [0.5, 1.5])[6:] == ["pass@1", "fast_0.5", "fast_1.5", "fast_0.5@1", "fast_1.5@1",
                                                   "mean_speedup", "geomean_speedup"]


def test_score_overall():
    r = row(score({"base": BASE}, TASKS, SETTINGS), "base", "overall", "all")
    assert (r["n_tasks"], r["n_samples"]) == (3, 6)
    assert r["exec"] == pytest.approx(3 / 6)
    assert r["pass@1"] == pytest.approx((2 / 3 + 0 + 1) / 3)   # per task c/n, mean over tasks
    assert r["pass@2"] == pytest.approx((1 + 0) / 2)           # e/z (1 sample) left out of the mean
    assert r["fast_0"] == pytest.approx(3 / 6)
    assert r["fast_1"] == pytest.approx(1 / 6)                 # only the 2.0; 1.0 is not > 1
    assert r["fast_0@1"] == pytest.approx(5 / 9)
    assert r["fast_1@1"] == pytest.approx((1 / 3 + 0 + 0) / 3)
    assert r["fast_1@2"] == pytest.approx((2 / 3 + 0) / 2)     # e/x: 1 - C(2,2)/C(3,2)
    assert r["mean_speedup"] == pytest.approx(3.5 / 3)
    assert r["geomean_speedup"] == pytest.approx(1.0)          # (1 * 2 * 0.5) ** (1/3)


def test_score_per_level_and_category():
    table = score({"base": BASE}, TASKS, SETTINGS)
    l1 = row(table, "base", "level", "1")
    assert (l1["n_tasks"], l1["n_samples"]) == (2, 5)
    assert l1["exec"] == pytest.approx(2 / 5)
    assert l1["pass@1"] == pytest.approx(1 / 3)
    assert l1["pass@2"] == pytest.approx(0.5)
    assert l1["fast_1"] == pytest.approx(1 / 5)
    assert l1["geomean_speedup"] == pytest.approx(math.sqrt(2))
    l2 = row(table, "base", "level", "2")
    assert (l2["n_tasks"], l2["n_samples"], l2["exec"], l2["pass@1"]) == (1, 1, 1.0, 1.0)
    assert math.isnan(l2["pass@2"]) and math.isnan(l2["fast_1@2"])
    assert (l2["fast_0"], l2["fast_1"], l2["mean_speedup"]) == (1.0, 0.0, 0.5)
    fused = row(table, "base", "category", "fused")  # the fused category holds exactly the level-2 task
    pd.testing.assert_series_equal(fused.iloc[3:], l2.iloc[3:], check_names=False)
    single = row(table, "base", "category", "single_op")
    assert single["n_samples"] == 5 and single["exec"] == pytest.approx(2 / 5)


def test_score_model_without_correct_samples():
    tuned = verdicts([("e/x", False, 0.0), ("e/x", False, 0.0), ("e/z", False, 0.0)])
    table = score({"base": BASE, "tuned": tuned}, TASKS, SETTINGS)
    r = row(table, "tuned", "overall", "all")
    assert (r["n_tasks"], r["n_samples"], r["exec"], r["pass@1"], r["pass@2"]) == (2, 3, 0.0, 0.0, 0.0)
    assert math.isnan(r["mean_speedup"]) and math.isnan(r["geomean_speedup"])
    assert set(table["model"]) == {"base", "tuned"}


def test_score_unknown_task_is_an_error():
    with pytest.raises(ValueError, match="model 'base'.*'e/q'"):
        score({"base": verdicts([("e/q", True, 1.0)])}, TASKS, SETTINGS)


def test_scores_markdown():
    text = scores_markdown(score({"base": BASE}, TASKS, SETTINGS))
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    assert header == ("| model | L1 Exec | L1 fast_1 | L1 pass@1 | L1 pass@2 | L2 Exec | L2 fast_1 | L2 pass@1 | "
                      "L2 pass@2 | All Exec | All fast_1 | All pass@1 | All pass@2 |")
    base = next(line for line in text.splitlines() if line.startswith("| base"))
    # L1: exec 40%, fast_1 20%, pass@1 33.3%, pass@2 50%; L2 pass@2 undefined; overall exec 50%
    assert base == "| base | 40.0 | 20.0 | 33.3 | 50.0 | 100.0 | 0.0 | 100.0 | – | 50.0 | 16.7 | 55.6 | 50.0 |"
    assert "No evaluation scores" in scores_markdown(pd.DataFrame())

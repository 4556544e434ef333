"""pass@k, geomean and the eval score table, checked against hand-computed values."""

import math

import pandas as pd
import pytest

from concur.evaluate import results_table, score, score_columns, table_markdown, task_difficulty
from concur.metrics import difficulty, difficulty_labels, geomean, pass_at_k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c/n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 0, 1, 0.0),
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (4, 4, 4, 1.0),
        (3, 1, 2, 2 / 3),  # 1 - C(2,2)/C(3,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
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

TASKS = pd.DataFrame(
    {
        "task_id": ["e/x", "e/y", "e/z"],
        "level": [1, 1, 2],
        "category": ["single_op", "single_op", "fused"],
        "name": ["x", "y", "z"],
    }
)


def verdicts(rows):
    return pd.DataFrame(rows, columns=["task_id", "correct", "speedup"])


BASE = verdicts(
    [
        ("e/x", True, 1.0),  # speedup exactly 1.0: correct but NOT fast_1
        ("e/x", True, 2.0),
        ("e/x", False, 0.0),
        ("e/y", False, 0.0),
        ("e/y", False, 0.0),
        ("e/z", True, 0.5),  # a single sample: no pass@2 estimate for e/z
    ]
)
SETTINGS = {"pass_k": [1, 2], "fast_p": [0, 1]}


def row(table, model, scope, group):
    match = table[(table["model"] == model) & (table["scope"] == scope) & (table["group"] == group)]
    assert len(match) == 1
    return match.iloc[0]


def test_score_columns_in_contract_order():
    table = score({"base": BASE}, TASKS, SETTINGS)
    assert list(table.columns) == [
        "model",
        "turn",
        "scope",
        "group",
        "n_tasks",
        "n_samples",
        "exec",
        "pass@1",
        "pass@2",
        "fast_0",
        "fast_1",
        "fast_0@1",
        "fast_0@2",
        "fast_1@1",
        "fast_1@2",
        "mean_speedup",
        "geomean_speedup",
    ]
    assert list(zip(table["scope"], table["group"])) == [
        ("overall", "all"),
        ("level", "1"),
        ("level", "2"),
        ("category", "fused"),
        ("category", "single_op"),
    ]
    assert score_columns([1], [0.5, 1.5])[7:] == [
        "pass@1",
        "fast_0.5",
        "fast_1.5",
        "fast_0.5@1",
        "fast_1.5@1",
        "mean_speedup",
        "geomean_speedup",
    ]


def test_score_overall():
    r = row(score({"base": BASE}, TASKS, SETTINGS), "base", "overall", "all")
    assert (r["n_tasks"], r["n_samples"]) == (3, 6)
    assert r["exec"] == pytest.approx(3 / 6)
    assert r["pass@1"] == pytest.approx((2 / 3 + 0 + 1) / 3)  # per task c/n, mean over tasks
    assert r["pass@2"] == pytest.approx((1 + 0) / 2)  # e/z (1 sample) left out of the mean
    assert r["fast_0"] == pytest.approx(3 / 6)
    assert r["fast_1"] == pytest.approx(1 / 6)  # only the 2.0; 1.0 is not > 1
    assert r["fast_0@1"] == pytest.approx(5 / 9)
    assert r["fast_1@1"] == pytest.approx((1 / 3 + 0 + 0) / 3)
    assert r["fast_1@2"] == pytest.approx((2 / 3 + 0) / 2)  # e/x: 1 - C(2,2)/C(3,2)
    assert r["mean_speedup"] == pytest.approx(3.5 / 3)
    assert r["geomean_speedup"] == pytest.approx(1.0)  # (1 * 2 * 0.5) ** (1/3)


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
    pd.testing.assert_series_equal(fused.iloc[4:], l2.iloc[4:], check_names=False)
    single = row(table, "base", "category", "single_op")
    assert single["n_samples"] == 5 and single["exec"] == pytest.approx(2 / 5)


def test_score_model_without_correct_samples():
    tuned = verdicts([("e/x", False, 0.0), ("e/x", False, 0.0), ("e/z", False, 0.0)])
    table = score({"base": BASE, "tuned": tuned}, TASKS, SETTINGS)
    r = row(table, "tuned", "overall", "all")
    assert (r["n_tasks"], r["n_samples"], r["exec"], r["pass@1"], r["pass@2"]) == (2, 3, 0.0, 0.0, 0.0)
    assert math.isnan(r["mean_speedup"]) and math.isnan(r["geomean_speedup"])
    assert set(table["model"]) == {"base", "tuned"}


def test_an_unresolved_speedup_counts_as_correct_but_never_as_fast():
    tuned = verdicts([("e/x", True, float("nan")), ("e/x", True, 3.0), ("e/z", False, float("nan"))])
    r = row(score({"base": BASE, "tuned": tuned}, TASKS, SETTINGS), "tuned", "overall", "all")
    assert r["exec"] == pytest.approx(2 / 3) and r["fast_0"] == pytest.approx(2 / 3)
    assert r["fast_1"] == pytest.approx(1 / 3) and r["mean_speedup"] == pytest.approx(3.0)


def test_score_unknown_task_is_an_error():
    with pytest.raises(ValueError, match="model 'base'.*'e/q'"):
        score({"base": verdicts([("e/q", True, 1.0)])}, TASKS, SETTINGS)


# ---------------------------------------------------------------- difficulty
# ARL bands: Easy < 4000 <= Medium <= 8500 < Hard


def test_difficulty_bands_at_and_around_the_thresholds():
    assert [difficulty(v, 4000, 8500) for v in (0, 3999.9, 4000, 6000, 8500, 8500.1)] == [
        "Easy",
        "Easy",
        "Medium",
        "Medium",
        "Medium",
        "Hard",
    ]
    assert list(difficulty_labels([3999.9, 4000, 8500, 8500.1], 4000, 8500)) == ["Easy", "Medium", "Medium", "Hard"]


# the difficulty model's eval generations: e/x ARL (1000 + 3000) / 2 = 2000 Easy, e/y (4000 + 8500) / 2 = 6250
# Medium, e/z 9000 Hard
REFERENCE = pd.DataFrame(
    {"task_id": ["e/x", "e/x", "e/y", "e/y", "e/z"], "reasoning_tokens": [1000, 3000, 4000, 8500, 9000]}
)


def test_task_difficulty_hand_built():
    table = task_difficulty(REFERENCE, TASKS, "base", 4000, 8500)
    assert list(table.columns) == ["task_id", "level", "category", "model", "n_samples", "arl", "difficulty"]
    assert table.to_dict(orient="list") == {
        "task_id": ["e/x", "e/y", "e/z"],
        "level": [1, 1, 2],
        "category": ["single_op", "single_op", "fused"],
        "model": ["base"] * 3,
        "n_samples": [2, 2, 1],
        "arl": [2000.0, 6250.0, 9000.0],
        "difficulty": ["Easy", "Medium", "Hard"],
    }
    # the same samples against other thresholds: ARL exactly at a threshold is Medium
    assert list(task_difficulty(REFERENCE, TASKS, "base", 2000, 6250)["difficulty"]) == ["Medium", "Medium", "Hard"]
    with pytest.raises(ValueError, match="'e/q' is not in the tasks table"):
        task_difficulty(pd.DataFrame({"task_id": ["e/q"], "reasoning_tokens": [1]}), TASKS, "base", 4000, 8500)
    with pytest.raises(ValueError, match="easy_below"):
        task_difficulty(REFERENCE, TASKS, "base", 9000, 8500)


def test_score_by_difficulty():
    table = score({"base": BASE}, TASKS, SETTINGS, task_difficulty(REFERENCE, TASKS, "base", 4000, 8500))
    assert list(zip(table["scope"], table["group"]))[-3:] == [
        ("difficulty", "Easy"),
        ("difficulty", "Medium"),
        ("difficulty", "Hard"),
    ]
    easy = row(table, "base", "difficulty", "Easy")  # e/x: correct 1.0, correct 2.0, wrong
    assert (easy["n_tasks"], easy["n_samples"]) == (1, 3)
    assert easy["exec"] == pytest.approx(2 / 3) and easy["pass@1"] == pytest.approx(2 / 3)
    assert easy["pass@2"] == 1.0  # one failure: every pair holds a success
    assert easy["fast_1"] == pytest.approx(1 / 3) and easy["fast_1@2"] == pytest.approx(2 / 3)
    medium = row(table, "base", "difficulty", "Medium")  # e/y: two failures
    assert (medium["exec"], medium["pass@1"], medium["pass@2"], medium["fast_1@1"]) == (0.0, 0.0, 0.0, 0.0)
    hard = row(table, "base", "difficulty", "Hard")  # e/z: one correct sample at 0.5x
    assert (hard["exec"], hard["pass@1"], hard["fast_1"]) == (1.0, 1.0, 0.0) and math.isnan(hard["pass@2"])
    # a band without tasks has no row
    only_easy = pd.DataFrame({"task_id": ["e/x", "e/y", "e/z"], "difficulty": ["Easy"] * 3})
    assert list(score({"base": BASE}, TASKS, SETTINGS, only_easy).query("scope == 'difficulty'")["group"]) == ["Easy"]


# ---------------------------------------------------------------- the results table

MODELS = {"base": {"kind": "base", "generator": "qwq"}, "tuned": {"kind": "adapter", "generator": "qwq"}}
TUNED = verdicts(
    [
        ("e/x", True, 3.0),
        ("e/x", True, 1.5),
        ("e/y", True, 0.9),
        ("e/y", False, 0.0),
        ("e/z", False, 0.0),
        ("e/z", False, 0.0),
    ]
)


def test_results_table_layout_and_values():
    scores = score({"base": BASE, "tuned": TUNED}, TASKS, SETTINGS)
    table = results_table(scores, [1, 2], MODELS)
    metrics = ["exec@1", "exec@2", "fast_1@1", "fast_1@2"]
    assert list(table.columns) == ["model", "kind", "generator"] + [
        f"{g}_{m}" for g in ("L1", "L2", "all") for m in metrics
    ]
    assert list(table["model"]) == ["base", "tuned"] and list(table["kind"]) == ["base", "adapter"]
    base = table.iloc[0]
    # L1 = e/x (2 of 3 correct; one > 1x) and e/y (0 of 2): Exec@1 (2/3 + 0)/2, Exec@2 (1 + 0)/2,
    # fast_1@1 (1/3 + 0)/2, fast_1@2 (1 - C(2,2)/C(3,2) + 0)/2
    assert [base[f"L1_{m}"] for m in metrics] == pytest.approx([1 / 3, 1 / 2, 1 / 6, 1 / 3])
    assert base["L2_exec@1"] == 1.0 and base["L2_fast_1@1"] == 0.0  # e/z: one correct sample at 0.5x
    assert math.isnan(base["L2_exec@2"]) and math.isnan(base["L2_fast_1@2"])  # one sample: no pass@2
    assert [base[f"all_{m}"] for m in metrics] == pytest.approx([5 / 9, 1 / 2, 1 / 9, 1 / 3])
    tuned = table.iloc[1]
    # e/x 2/2 correct and both > 1x; e/y 1 of 2 correct at 0.9x; e/z none
    assert [tuned[f"L1_{m}"] for m in metrics] == pytest.approx([3 / 4, 1.0, 1 / 2, 1 / 2])
    assert [tuned[f"all_{m}"] for m in metrics] == pytest.approx([1 / 2, 2 / 3, 1 / 3, 1 / 3])


def test_results_table_needs_fast_1():
    with pytest.raises(ValueError, match="fast_p must include 1"):
        results_table(score({"base": BASE}, TASKS, {"pass_k": [1], "fast_p": [0]}), [1], MODELS)


def test_table_markdown():
    scores = score({"base": BASE}, TASKS, SETTINGS, task_difficulty(REFERENCE, TASKS, "base", 4000, 8500))
    text = table_markdown(
        scores,
        {**SETTINGS, "samples": 3, "temperature": 0.7},
        MODELS,
        task_difficulty(REFERENCE, TASKS, "base", 4000, 8500),
        {"easy_below": 4000, "hard_above": 8500},
    )
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| model")))
    assert lines[header] == (
        "| model | kind | L1 Exec@1 | L1 Exec@2 | L1 fast_1@1 | L1 fast_1@2 | L2 Exec@1 | "
        "L2 Exec@2 | L2 fast_1@1 | L2 fast_1@2 | All Exec@1 | All Exec@2 | All fast_1@1 | "
        "All fast_1@2 |"
    )
    # the values of test_results_table_layout_and_values, in %
    assert lines[header + 2] == (
        "| base | base | 33.3 | 50.0 | 16.7 | 33.3 | 100.0 | – | 0.0 | – | 55.6 | 50.0 | 11.1 | 33.3 |"
    )
    assert "Tasks: L1 2, L2 1, All 3" in text
    assert "3 samples per task at temperature 0.7" in text
    assert "## By difficulty" in text and "model `base`" in text and "Easy < 4000 ≤ Medium ≤ 8500 < Hard" in text
    easy_row = [line for line in lines if line.startswith("| base")][1]  # Easy = e/x, Medium = e/y, Hard = e/z
    assert easy_row.startswith("| base | base | 66.7 | 100.0 | 33.3 | 66.7 | 0.0 | 0.0 | 0.0 | 0.0 | 100.0 | – |")
    assert "Tasks: Easy 1, Medium 1, Hard 1" in text and "## By category" in text
    assert "No evaluation scores" in table_markdown(pd.DataFrame(), SETTINGS)

"""Analysis summary on a hand-built table (bin_width 100, Easy < 150, Hard > 300) and its figures."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from concur.analyze import analyze, json_safe, pearson

SETTINGS = {"bin_width": 100, "easy_below": 150, "hard_above": 300}
FIGURES = ("accuracy_by_length.png", "length_correct_vs_incorrect.png", "speedup_vs_length.png",
           "arl_difficulty.png", "eval_scores.png")

# candidate_id, task_id, reasoning_tokens, correct, speedup
ROWS = [
    ("a1", "p/a", 50, True, 1.0),
    ("a2", "p/a", 120, True, 2.0),
    ("a3", "p/a", 180, False, 0.0),   # p/a ARL 350/3 = 116.7 -> Easy
    ("b1", "p/b", 250, True, 4.0),
    ("b2", "p/b", 320, False, 0.0),
    ("b3", "p/b", 390, True, 5.0),    # p/b ARL 960/3 = 320 -> Hard
    ("c1", "p/c", 200, True, 1.5),
    ("c2", "p/c", 220, False, 0.0),   # p/c ARL 210 -> Medium
]


def tables(rows=ROWS):
    tasks = pd.DataFrame({"task_id": ["p/a", "p/b", "p/c"], "name": ["a", "b", "c"],
                          "category": ["single_op", "fused", "model"], "level": [1, 2, 3]})
    cands = pd.DataFrame({
        "candidate_id": [r[0] for r in rows], "task_id": [r[1] for r in rows], "generator": "gen",
        "prompt": "p", "reasoning": "r", "answer": "a", "code": "c", "reasoning_tokens": [r[2] for r in rows],
    })
    verdicts = pd.DataFrame({"candidate_id": [r[0] for r in rows], "task_id": [r[1] for r in rows],
                             "correct": [r[3] for r in rows], "speedup": [r[4] for r in rows]})
    return cands, verdicts, tasks


SCORES = pd.DataFrame({
    "model": ["base", "base", "concur"], "scope": ["overall", "level", "overall"], "group": ["all", "1", "all"],
    "n_tasks": [3, 2, 3], "n_samples": [6, 4, 6], "exec": [0.5, 0.25, 2 / 3], "fast_1": [1 / 6, 0.0, 0.5],
    "mean_speedup": [1.2, 1.0, float("nan")],
})


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    fig_dir = tmp_path_factory.mktemp("figures")
    return analyze(*tables(), SCORES, SETTINGS, fig_dir), fig_dir


def test_accuracy_bins(result):
    summary, _ = result
    # [0,100): 50 ok | [100,200): 120 ok, 180 no | [200,300): 200 ok, 220 no, 250 ok | [300,400): 320 no, 390 ok
    assert [(b["lo"], b["hi"], b["count"], b["n_correct"]) for b in summary["accuracy_by_length"]] == [
        (0, 100, 1, 1), (100, 200, 2, 1), (200, 300, 3, 2), (300, 400, 2, 1)]
    assert [b["accuracy"] for b in summary["accuracy_by_length"]] == pytest.approx([1.0, 0.5, 2 / 3, 0.5])


def test_empty_bins_are_kept(tmp_path):
    rows = [("x1", "p/a", 10, True, 1.0), ("x2", "p/a", 310, False, 0.0)]
    summary_bins = analyze(*tables(rows), None, SETTINGS, tmp_path)["accuracy_by_length"]
    assert [(b["lo"], b["count"], b["accuracy"]) for b in summary_bins] == [
        (0, 1, 1.0), (100, 0, None), (200, 0, None), (300, 1, 0.0)]


def test_length_stats_by_correctness(result):
    summary, _ = result
    ok = summary["length_by_correctness"]["correct"]      # 50, 120, 200, 250, 390
    assert (ok["count"], ok["mean"], ok["median"], ok["q1"], ok["q3"]) == (5, 202.0, 200.0, 120.0, 250.0)
    bad = summary["length_by_correctness"]["incorrect"]   # 180, 220, 320
    assert (bad["count"], bad["mean"], bad["median"], bad["q1"], bad["q3"]) == (3, 240.0, 220.0, 200.0, 270.0)


def test_pearson_matches_numpy(result):
    summary, _ = result
    x, y = [50, 120, 250, 390, 200], [1.0, 2.0, 4.0, 5.0, 1.5]
    fit = summary["speedup_vs_length"]
    assert fit["n"] == 5
    assert fit["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert fit["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    assert 0 < fit["p"] < 1


def test_within_task_correlation(result):
    summary, _ = result
    within = summary["speedup_vs_length_within_task"]
    # p/a: (50, 1) and (120, 2) -> z-scores (-1, -1), (1, 1); p/b likewise; p/c has one correct kernel: left out
    assert (within["n"], within["n_tasks"]) == (4, 2)
    assert within["r"] == pytest.approx(1.0)
    assert "z-score" in within["normalisation"]


def test_pearson_undefined_cases():
    assert pearson([1, 2], [1, 2]) == {"n": 2, "r": None, "p": None, "r2": None}
    assert pearson([1, 2, 3], [5, 5, 5])["r"] is None


def test_arl_and_difficulty(result):
    summary, _ = result
    arl = {r["task_id"]: (r["arl"], r["difficulty"], r["n"]) for r in summary["arl"]}
    assert arl["p/a"][1:] == ("Easy", 3) and arl["p/a"][0] == pytest.approx(350 / 3)
    assert arl["p/b"] == (320.0, "Hard", 3)
    assert arl["p/c"] == (210.0, "Medium", 2)
    assert summary["difficulty_counts"] == {"Easy": 1, "Medium": 1, "Hard": 1}


def test_difficulty_thresholds_are_exclusive(tmp_path):
    # ARL exactly at a threshold is Medium (Easy < easy_below, Hard > hard_above)
    rows = [("x1", "p/a", 150, True, 1.0), ("x2", "p/b", 300, True, 1.0)]
    summary = analyze(*tables(rows), None, SETTINGS, tmp_path)
    assert [r["difficulty"] for r in summary["arl"]] == ["Medium", "Medium"]


def test_eval_scores_overall_rows_json_safe(result):
    summary, _ = result
    assert [(r["model"], r["exec"]) for r in summary["eval_scores"]] == [("base", 0.5), ("concur", 2 / 3)]
    assert summary["eval_scores"][1]["mean_speedup"] is None   # NaN -> None
    json.dumps(summary, allow_nan=False)


def test_figures_exist_with_captions(result):
    summary, fig_dir = result
    assert set(summary["figures"]) == set(FIGURES)
    for name in FIGURES:
        data = (fig_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert summary["figures"][name].endswith(".")
    assert "r = " in summary["figures"]["speedup_vs_length.png"]


def test_no_candidates_and_no_scores(tmp_path):
    summary = analyze(*tables([]), None, SETTINGS, tmp_path)
    assert summary["n_candidates"] == 0 and summary["accuracy_by_length"] == [] and summary["eval_scores"] is None
    assert summary["speedup_vs_length"]["r"] is None
    assert "No evaluation scores" in summary["figures"]["eval_scores.png"]
    assert all((tmp_path / name).exists() for name in FIGURES)
    json.dumps(summary, allow_nan=False)


def test_json_safe():
    assert json_safe({"a": np.float64("nan"), "b": [np.int64(3), math.inf], 1: (np.bool_(True),)}) == {
        "a": None, "b": [3, None], "1": [True]}


def test_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="easy_below"):
        analyze(*tables(), None, {"bin_width": 100, "easy_below": 500, "hard_above": 300}, tmp_path)


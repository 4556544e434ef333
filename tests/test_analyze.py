"""Analysis summary on a hand-built table (bin_width 100, Easy < 150, Hard > 300) and its figures, each checked
against the numbers in the summary."""

import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest

from concur.analyze import FIGURES, analyze, json_safe, pearson

SETTINGS = {"bin_width": 100, "easy_below": 150, "hard_above": 300}

# candidate_id, task_id, reasoning_tokens, correct, speedup
ROWS = [
    ("a1", "p/a", 50, True, 1.0),
    ("a2", "p/a", 120, True, 2.0),
    ("a3", "p/a", 180, False, 0.0),  # p/a ARL 350/3 = 116.7 -> Easy
    ("b1", "p/b", 250, True, 4.0),
    ("b2", "p/b", 320, False, 0.0),
    ("b3", "p/b", 390, True, 5.0),  # p/b ARL 960/3 = 320 -> Hard
    ("c1", "p/c", 200, True, 1.5),
    ("c2", "p/c", 220, False, 0.0),  # p/c ARL 210 -> Medium
]


def tables(rows=ROWS):
    tasks = pd.DataFrame(
        {
            "task_id": ["p/a", "p/b", "p/c"],
            "name": ["a", "b", "c"],
            "category": ["single_op", "fused", "model"],
            "level": [1, 2, 3],
        }
    )
    cands = pd.DataFrame(
        {
            "candidate_id": [r[0] for r in rows],
            "task_id": [r[1] for r in rows],
            "generator": "gen",
            "prompt": "p",
            "reasoning": "r",
            "answer": "a",
            "code": "c",
            "reasoning_tokens": [r[2] for r in rows],
        }
    )
    verdicts = pd.DataFrame(
        {
            "candidate_id": [r[0] for r in rows],
            "task_id": [r[1] for r in rows],
            "correct": [r[3] for r in rows],
            "speedup": [r[4] for r in rows],
        }
    )
    return cands, verdicts, tasks


SCORES = pd.DataFrame(
    {
        "model": ["base", "base", "concur", "base", "base", "concur", "concur"],
        "scope": ["overall", "level", "overall", "difficulty", "difficulty", "difficulty", "difficulty"],
        "group": ["all", "1", "all", "Easy", "Hard", "Easy", "Hard"],
        "n_tasks": [3, 2, 3, 2, 1, 2, 1],
        "n_samples": [6, 4, 6, 4, 2, 4, 2],
        "exec": [0.5, 0.25, 2 / 3, 0.75, 0.0, 0.5, 1.0],
        "fast_1": [1 / 6, 0.0, 0.5, 0.25, 0.0, 0.5, 0.5],
        "mean_speedup": [1.2, 1.0, float("nan"), 1.2, float("nan"), 1.0, 1.0],
    }
)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    fig_dir = tmp_path_factory.mktemp("figures")
    figures = {}
    summary = analyze(*tables(), SCORES, SETTINGS, fig_dir, figures)
    return summary, fig_dir, figures


@pytest.fixture(scope="module")
def result(drawn):
    return drawn[:2]


def test_accuracy_bins(result):
    summary, _ = result
    # [0,100): 50 ok | [100,200): 120 ok, 180 no | [200,300): 200 ok, 220 no, 250 ok | [300,400): 320 no, 390 ok
    assert [(b["lo"], b["hi"], b["count"], b["n_correct"]) for b in summary["accuracy_by_length"]] == [
        (0, 100, 1, 1),
        (100, 200, 2, 1),
        (200, 300, 3, 2),
        (300, 400, 2, 1),
    ]
    assert [b["accuracy"] for b in summary["accuracy_by_length"]] == pytest.approx([1.0, 0.5, 2 / 3, 0.5])


def test_empty_bins_are_kept(tmp_path):
    rows = [("x1", "p/a", 10, True, 1.0), ("x2", "p/a", 310, False, 0.0)]
    summary_bins = analyze(*tables(rows), None, SETTINGS, tmp_path)["accuracy_by_length"]
    assert [(b["lo"], b["count"], b["accuracy"]) for b in summary_bins] == [
        (0, 1, 1.0),
        (100, 0, None),
        (200, 0, None),
        (300, 1, 0.0),
    ]


def test_length_stats_by_correctness(result):
    summary, _ = result
    ok = summary["length_by_correctness"]["correct"]  # 50, 120, 200, 250, 390
    assert (ok["count"], ok["mean"], ok["median"], ok["q1"], ok["q3"]) == (5, 202.0, 200.0, 120.0, 250.0)
    bad = summary["length_by_correctness"]["incorrect"]  # 180, 220, 320
    assert (bad["count"], bad["mean"], bad["median"], bad["q1"], bad["q3"]) == (3, 240.0, 220.0, 200.0, 270.0)


def test_speedup_fit_is_on_log_speedup(result):
    summary, _ = result
    x, y = [50, 120, 250, 390, 200], np.log([1.0, 2.0, 4.0, 5.0, 1.5])
    fit = summary["speedup_vs_length"]
    assert fit["n"] == 5
    assert fit["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])  # Pearson of length and ln(speedup)
    assert fit["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    assert 0 < fit["p"] < 1
    slope, intercept = np.polyfit(x, y, 1)
    assert (fit["slope"], fit["intercept"]) == pytest.approx((slope, intercept))
    assert fit["factor_per_1k_tokens"] == pytest.approx(math.exp(1000 * slope))
    assert (fit["x_min"], fit["x_max"]) == (50.0, 390.0)
    assert "ln(speedup)" in fit["fit"] and "Pearson" in fit["fit"]


def test_within_task_correlation(result):
    summary, _ = result
    within = summary["speedup_vs_length_within_task"]
    # p/a: (50, 1) and (120, 2) -> z-scores (-1, -1), (1, 1); p/b likewise; p/c has one correct kernel: left out
    assert (within["n"], within["n_tasks"]) == (4, 2)
    assert within["r"] == pytest.approx(1.0)
    assert "z-score" in within["normalisation"]


def z_scores(values):
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    return [(v - mean) / std for v in values]


# within-task z of the lengths: p/a (50, 120, 180), p/b (250, 320, 390), p/c (200, 220) -> (-1, 1)
Z = dict(zip(["a1", "a2", "a3"], z_scores([50, 120, 180]))) | dict(zip(["b1", "b2", "b3"], z_scores([250, 320, 390])))
Z |= {"c1": -1.0, "c2": 1.0}
CORRECT = {r[0]: r[3] for r in ROWS}


def test_accuracy_within_task(result):
    summary, _ = result
    within = summary["accuracy_by_length_within_task"]
    assert (within["n"], within["n_tasks"], within["bin_width"]) == (8, 3, 0.5)
    # z: a1 -1.25, b1 -1.22 | c1 -1 | - | a2 0.06, b2 0 | - | a3 1.19, c2 1, b3 1.22
    assert [(b["lo"], b["hi"], b["count"], b["n_correct"]) for b in within["bins"]] == [
        (-1.5, -1.0, 2, 2),
        (-1.0, -0.5, 1, 1),
        (-0.5, 0.0, 0, 0),
        (0.0, 0.5, 2, 1),
        (0.5, 1.0, 0, 0),
        (1.0, 1.5, 3, 1),
    ]
    assert [b["accuracy"] for b in within["bins"]] == pytest.approx([1.0, 1.0, None, 0.5, None, 1 / 3])
    ok = [Z[c] for c in Z if CORRECT[c]]
    bad = [Z[c] for c in Z if not CORRECT[c]]
    assert within["mean_z"]["correct"] == pytest.approx(statistics.fmean(ok))
    assert within["mean_z"]["incorrect"] == pytest.approx(statistics.fmean(bad))
    r = np.corrcoef([Z[c] for c in Z], [float(CORRECT[c]) for c in Z])[0, 1]
    assert within["correlation"]["r"] == pytest.approx(r) and within["correlation"]["r2"] == pytest.approx(r * r)


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
    assert summary["eval_scores"][1]["mean_speedup"] is None  # NaN -> None
    assert [(r["model"], r["group"], r["exec"]) for r in summary["eval_scores_by_difficulty"]] == [
        ("base", "Easy", 0.75),
        ("base", "Hard", 0.0),
        ("concur", "Easy", 0.5),
        ("concur", "Hard", 1.0),
    ]
    json.dumps(summary, allow_nan=False)


def test_figures_exist_with_captions(result):
    summary, fig_dir = result
    assert set(summary["figures"]) == set(FIGURES) and len(FIGURES) == 8
    for name in FIGURES:
        data = (fig_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert summary["figures"][name].endswith(".")
    caption = summary["figures"]["speedup_vs_length.png"]
    assert "r = " in caption and "R² = " in caption


# ---------------------------------------------------------------- each figure shows the summary's numbers


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def bar_heights(ax):
    return [p.get_height() for p in ax.patches]


def test_figure_accuracy_by_length(drawn):
    summary, _, figures = drawn
    ax, counts = figures["accuracy_by_length.png"].axes
    bins = summary["accuracy_by_length"]
    assert bar_heights(ax) == pytest.approx([b["accuracy"] or 0.0 for b in bins])
    assert [p.get_x() + p.get_width() / 2 for p in ax.patches] == pytest.approx([b["lo"] + 50 for b in bins])
    assert list(counts.lines[0].get_ydata()) == [b["count"] for b in bins] == [1, 2, 3, 2]
    assert [t.get_text() for t in ax.texts] == ["n=1", "n=2", "n=3", "n=2"]
    assert legend_texts(ax)[0] == "share correct per 100-token bin (n = 8 candidates)"
    assert ax.get_xlabel() == "reasoning length (tokens)" and ax.get_ylabel() == "share correct"


def test_figure_length_by_correctness(drawn):
    summary, _, figures = drawn
    (ax,) = figures["length_correct_vs_incorrect.png"].axes
    ok, bad = summary["length_by_correctness"]["correct"], summary["length_by_correctness"]["incorrect"]
    assert legend_texts(ax) == [
        f"correct (n = {ok['count']}, median {ok['median']:,.0f} tokens)",
        f"incorrect (n = {bad['count']}, median {bad['median']:,.0f} tokens)",
    ]
    assert legend_texts(ax)[0] == "correct (n = 5, median 200 tokens)"
    assert [line.get_xdata()[0] for line in ax.lines] == [200.0, 220.0]  # the dashed medians
    # correct 50 | 120 | 200, 250 | 390 over 100-token bins from 0: shares 1/5, 1/5, 2/5, 1/5
    stairs = [p for p in ax.patches]
    assert list(stairs[0].get_data().values) == pytest.approx([0.2, 0.2, 0.4, 0.2])
    assert list(stairs[1].get_data().values) == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3])
    assert "tokens" in ax.get_xlabel()


def test_figure_speedup_vs_length(drawn):
    summary, _, figures = drawn
    (ax,) = figures["speedup_vs_length.png"].axes
    fit = summary["speedup_vs_length"]
    texts = legend_texts(ax)
    assert texts[0] == "correct candidates (n = 5)"
    assert texts[1] == (
        f"fit of ln speedup: r = {fit['r']:.2f}, p = {fit['p']:.2g}, R² = {fit['r2']:.2f}; "
        f"×{fit['factor_per_1k_tokens']:.3g} per 1,000 tokens"
    )
    assert len(ax.collections[0].get_offsets()) == fit["n"] == 5
    assert "tokens" in ax.get_xlabel() and "×" in ax.get_ylabel()
    assert ax.get_yscale() == "log"
    curve = next(line for line in ax.lines if line.get_label().startswith("fit of ln speedup"))
    xs, ys = curve.get_xdata(), curve.get_ydata()
    assert (xs.min(), xs.max()) == (fit["x_min"], fit["x_max"])  # drawn over the data only
    assert np.log(ys) == pytest.approx(fit["intercept"] + fit["slope"] * xs)  # straight on the log axis
    assert "log axis" in summary["figures"]["speedup_vs_length.png"]


def test_speedup_fit_stays_on_the_log_axis_where_a_straight_line_would_plunge(tmp_path):
    # speedups falling by halves: a straight least-squares line in linear space goes below 0 (off a log axis)
    # by the longest point; the fit of ln(speedup) is exact and passes through every point
    rows = [(f"x{i}", "p/a", 1000 * (i + 1), True, 8.0 / 2**i) for i in range(6)]
    figures = {}
    summary = analyze(*tables(rows), None, SETTINGS, tmp_path, figures)
    fit = summary["speedup_vs_length"]
    assert fit["r"] == pytest.approx(-1.0) and fit["factor_per_1k_tokens"] == pytest.approx(0.5)
    slope, intercept = np.polyfit([1000 * (i + 1) for i in range(6)], [8.0 / 2**i for i in range(6)], 1)
    assert slope * 6000 + intercept < 0  # what the old straight line drew
    (ax,) = figures["speedup_vs_length.png"].axes
    curve = next(line for line in ax.lines if line.get_label().startswith("fit of ln speedup"))
    assert curve.get_ydata().min() == pytest.approx(0.25) and curve.get_ydata().max() == pytest.approx(8.0)


def test_figure_arl_per_task(drawn):
    summary, _, figures = drawn
    ax = figures["arl_difficulty.png"].axes[0]
    assert bar_heights(ax) == pytest.approx(sorted(r["arl"] for r in summary["arl"]))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "c", "b"]  # ARL 116.7, 210, 320
    assert legend_texts(ax)[:3] == ["Easy (n = 1 tasks)", "Medium (n = 1 tasks)", "Hard (n = 1 tasks)"]
    assert ax.get_ylabel() == "ARL (tokens)"


def test_figure_arl_histogram_for_many_tasks(tmp_path):
    # 60 tasks (more than one bar each would show): tasks per ARL bin, stacked by band
    rows = [(f"x{i}", f"p/{i}", 10 * i, i % 2 == 0, 1.0 + i) for i in range(60)]
    tasks = pd.DataFrame(
        {
            "task_id": [f"p/{i}" for i in range(60)],
            "name": [f"t{i}" for i in range(60)],
            "category": "fused",
            "level": 2,
        }
    )
    cands, verdicts, _ = tables(rows)
    figures = {}
    summary = analyze(cands, verdicts, tasks, None, SETTINGS, tmp_path, figures)
    ax = figures["arl_difficulty.png"].axes[0]
    assert sum(bar_heights(ax)) == 60 == len(summary["arl"])
    assert legend_texts(ax)[:3] == [
        f"{band} (n = {summary['difficulty_counts'][band]} tasks)" for band in ("Easy", "Medium", "Hard")
    ]
    assert summary["difficulty_counts"] == {"Easy": 15, "Medium": 16, "Hard": 29}  # ARL 0..140, 150..300, 310..590
    assert ax.get_ylabel() == "tasks"


def test_figure_accuracy_within_task(drawn):
    summary, _, figures = drawn
    ax, counts = figures["accuracy_by_length_within_task.png"].axes
    bins = summary["accuracy_by_length_within_task"]["bins"]
    assert bar_heights(ax) == pytest.approx([b["accuracy"] or 0.0 for b in bins])
    assert list(counts.lines[0].get_ydata()) == [b["count"] for b in bins]
    assert legend_texts(ax)[0].startswith("share correct per 0.5-σ bin (n = 8 candidates, 3 tasks; r = ")
    assert "standard deviations" in ax.get_xlabel()


def test_figure_speedup_within_task(drawn):
    summary, _, figures = drawn
    (ax,) = figures["speedup_vs_length_within_task.png"].axes
    within = summary["speedup_vs_length_within_task"]
    assert len(ax.collections[0].get_offsets()) == within["n"] == 4
    texts = legend_texts(ax)
    assert texts[0] == "correct candidates (n = 4, 2 tasks)"
    assert texts[1] == f"least-squares fit: r = {within['r']:.2f}, p = {within['p']:.2g}, R² = {within['r2']:.2f}"
    assert "z-score" in ax.get_xlabel() and "z-score" in ax.get_ylabel()


def test_figure_eval_scores(drawn):
    summary, _, figures = drawn
    (ax,) = figures["eval_scores.png"].axes
    rows = summary["eval_scores"]
    # bars: exec per model, then fast_1 per model
    assert bar_heights(ax) == pytest.approx([r["exec"] for r in rows] + [r["fast_1"] for r in rows])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["base\n(n = 6 samples)", "concur\n(n = 6 samples)"]


def test_figure_eval_by_difficulty(drawn):
    summary, _, figures = drawn
    (ax,) = figures["eval_by_difficulty.png"].axes
    rows = summary["eval_scores_by_difficulty"]
    by = {(r["model"], r["group"]): r["exec"] for r in rows}
    assert bar_heights(ax) == pytest.approx(
        [by["base", "Easy"], by["concur", "Easy"], by["base", "Hard"], by["concur", "Hard"]]
    )
    assert legend_texts(ax) == ["Easy (n = 2 tasks)", "Hard (n = 1 tasks)"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["base", "concur"]


def test_no_candidates_and_no_scores(tmp_path):
    summary = analyze(*tables([]), None, SETTINGS, tmp_path)
    assert summary["n_candidates"] == 0 and summary["accuracy_by_length"] == [] and summary["eval_scores"] is None
    assert summary["eval_scores_by_difficulty"] is None and summary["accuracy_by_length_within_task"]["bins"] == []
    assert summary["speedup_vs_length"]["r"] is None
    assert "No evaluation scores" in summary["figures"]["eval_scores.png"]
    assert all((tmp_path / name).exists() for name in FIGURES)
    json.dumps(summary, allow_nan=False)


def test_json_safe():
    assert json_safe({"a": np.float64("nan"), "b": [np.int64(3), math.inf], 1: (np.bool_(True),)}) == {
        "a": None,
        "b": [3, None],
        "1": [True],
    }


def test_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="easy_below"):
        analyze(*tables(), None, {"bin_width": 100, "easy_below": 500, "hard_above": 300}, tmp_path)


# ---------------------------------------------------------------- sparse bins are not drawn as certain


def test_bins_carry_wilson_intervals(result):
    summary, _ = result
    for b in summary["accuracy_by_length"]:  # hand-checked: 1 of 1 -> [0.2065, 1]
        k, n = b["n_correct"], b["count"]
        p, z = k / n, 1.959963984540054
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        assert (b["ci_low"], b["ci_high"]) == pytest.approx((max(0, centre - half), min(1, centre + half)))
    assert summary["accuracy_by_length"][0]["ci_low"] == pytest.approx(0.2065, abs=1e-4)


def test_sparse_bins_are_hollow_with_whiskers(drawn):
    summary, _, figures = drawn
    ax, _ = figures["accuracy_by_length.png"].axes
    bins = summary["accuracy_by_length"]
    assert summary["min_bin_count"] == 10 and all(b["count"] < 10 for b in bins)
    assert all(p.get_facecolor()[3] == 0 for p in ax.patches[: len(bins)])  # every bin here is sparse: hollow
    (whiskers,) = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    segments = whiskers.lines[2][0].get_segments()
    drawn_ends = [end for s in segments for end in (s[0][1], s[1][1])]
    assert drawn_ends == pytest.approx([end for b in bins for end in (b["ci_low"], b["ci_high"])])
    assert legend_texts(ax)[1:] == [
        "95% Wilson interval",
        "candidates per bin (right axis; 4 bins)",
        "hollow: fewer than 10 candidates",
    ]


def test_full_bins_are_filled(tmp_path):
    rows = [(f"x{i}", "p/a", 10 + i, i % 2 == 0, 1.0) for i in range(12)]
    figures = {}
    summary = analyze(*tables(rows), None, SETTINGS, tmp_path, figures)
    ax, _ = figures["accuracy_by_length.png"].axes
    assert summary["accuracy_by_length"][0]["count"] == 12 and ax.patches[0].get_facecolor()[3] == 1
    assert "hollow: fewer than 10 candidates" not in legend_texts(ax)


# ---------------------------------------------------------------- what is analysed (concur.screening)


def screened_tables():
    """ROWS plus one candidate of each kind the analysis leaves out or counts differently."""
    extra = [
        ("t1", "p/a", 900, True, 9.0),  # truncated (reported)
        ("t2", "p/b", 950, False, 0.0),  # truncated (detected)
        ("n1", "p/c", 0, True, 3.0),  # no reasoning, from a reasoning generator
        ("u1", "p/c", 210, True, 2.0),  # untrusted verdict
        ("k1", "p/a", 60, True, 1.2),  # a 'correct' verdict on a candidate without code
    ]
    cands, verdicts, tasks = tables(ROWS + extra)
    cands["truncated"] = cands["candidate_id"].isin(["t1", "t2"])
    cands["truncation"] = cands["candidate_id"].map({"t1": "reported", "t2": "detected"}).fillna("")
    cands["reasoning"] = np.where(cands["candidate_id"] == "n1", "", "r")
    cands["reasoning_source"] = np.where(cands["candidate_id"] == "n1", "none", "tags")
    cands["code"] = np.where(cands["candidate_id"] == "k1", "", "c")
    cands["code_source"] = np.where(cands["candidate_id"] == "k1", "", "answer")
    cands["tokenizer"] = "qwq (/models/qwq-tokenizer)"
    verdicts["trusted"] = verdicts["candidate_id"] != "u1"
    verdicts["flags"] = ""
    return cands, verdicts, tasks


def test_left_out_rows_are_counted(tmp_path):
    summary = analyze(*screened_tables(), None, SETTINGS, tmp_path)
    screened = summary["screening"]
    assert screened["candidates"] == 13
    assert screened["left_out"] == {"truncated": 2, "no_reasoning": 1, "untrusted": 1}
    assert screened["truncated"] == {"total": 2, "reported": 1, "detected": 1, "included": False}
    # k1 is analysed as an incorrect sample: 8 + k1 analysed, 5 correct (its verdict's 'correct' does not count)
    assert (summary["n_candidates"], summary["n_correct"]) == (9, 5)
    assert (screened["no_code"], screened["correct_verdict_without_code"]) == (1, 1)
    assert screened["reasoning_generators"] == ["gen"]
    assert screened["tokenizers"] == {"gen": ["qwq (/models/qwq-tokenizer)"]}
    assert sum(b["count"] for b in summary["accuracy_by_length"]) == 9
    assert summary["speedup_vs_length"]["n"] == 5  # the left-out 9x (t1), 3x (n1), 2x (u1) are not in the fit
    assert "2 truncated, 1 without reasoning, 1 with untrusted verdicts" in summary["figures"]["accuracy_by_length.png"]
    json.dumps(summary, allow_nan=False)


def test_include_truncated_puts_them_back(tmp_path):
    summary = analyze(*screened_tables(), None, {**SETTINGS, "include_truncated": True}, tmp_path)
    assert summary["screening"]["left_out"]["truncated"] == 0
    assert summary["screening"]["truncated"] == {"total": 2, "reported": 1, "detected": 1, "included": True}
    assert (summary["n_candidates"], summary["n_correct"]) == (11, 6)
    assert summary["accuracy_by_length"][-1]["lo"] == 900


def test_a_generator_without_reasoning_keeps_its_rows(tmp_path):
    cands, verdicts, tasks = tables()
    cands["reasoning"] = ""  # no candidate of the generator has reasoning: lengths are 0, but nothing is left out
    cands["reasoning_tokens"] = 0
    summary = analyze(cands, verdicts, tasks, None, SETTINGS, tmp_path)
    assert summary["screening"]["left_out"]["no_reasoning"] == 0 and summary["n_candidates"] == 8
    assert summary["screening"]["reasoning_generators"] == []


def test_old_candidate_files_read_as_before(result):
    # tables() has none of reasoning_source, code_source, truncated, truncation, tokenizer, trusted, flags
    summary, _ = result
    assert summary["screening"]["left_out"] == {"truncated": 0, "no_reasoning": 0, "untrusted": 0}
    assert summary["screening"]["tokenizers"] == {"gen": [""]}
    assert (summary["n_candidates"], summary["n_correct"]) == (8, 5)


def test_curation_and_analysis_count_the_same_correct_candidates(tmp_path):
    from concur.curate import curate

    cands, verdicts, tasks = screened_tables()
    tasks = tasks.assign(split="train", suite="builtin", code="", n_ops=1, origin="test")
    for include in (False, True):
        summary = analyze(cands, verdicts, tasks, None, {**SETTINGS, "include_truncated": include}, tmp_path)
        counts = curate(cands, verdicts, tasks, {"include_truncated": include}).counts
        assert counts["correct"] == summary["n_correct"] and counts["kept"] == summary["n_candidates"]
        assert counts["left_out"] == summary["screening"]["left_out"]


def test_both_stages_call_the_one_correctness_rule(tmp_path, monkeypatch):
    from concur import screening
    from concur.curate import curate

    cands, verdicts, tasks = screened_tables()
    tasks = tasks.assign(split="train", suite="builtin", code="", n_ops=1, origin="test")
    calls = []

    def only_fast(frame):  # a stand-in rule: correct only above 3x
        calls.append(len(frame))
        return frame["correct"].astype(bool) & (frame["speedup"] > 3)

    monkeypatch.setattr(screening, "counts_as_correct", only_fast)
    summary = analyze(cands, verdicts, tasks, None, SETTINGS, tmp_path)
    curated = curate(cands, verdicts, tasks, {})
    assert summary["n_correct"] == curated.counts["correct"] == 2  # b1 4.0, b3 5.0
    assert set(curated.subsets["speedup"]["candidate_id"]) <= {"b1", "b3"}
    assert len(calls) == 3  # analysis: its rows and the ARL's (cut samples included); curation: its rows


def test_arl_counts_cut_samples_at_their_length_whatever_include_truncated_says(tmp_path):
    """A task whose samples all hit the cap is the hardest, not absent; the per-sample analyses leave them out."""
    cands, verdicts, tasks = screened_tables()
    cut = cands.assign(truncated=True, truncation="detected", reasoning_tokens=9000)
    summary = analyze(cut, verdicts, tasks, None, SETTINGS, tmp_path)
    assert summary["n_candidates"] == 0 and summary["screening"]["left_out"]["truncated"] == len(cands)
    rows = summary["arl"]
    assert {r["task_id"] for r in rows} == set(cands["task_id"])
    assert all(r["arl"] == 9000 and r["difficulty"] == "Hard" and r["n_truncated"] == r["n"] for r in rows)

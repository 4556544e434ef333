"""ConCuR curation on a hand-built table; every expectation below is worked out by hand in the comments."""

import numpy as np
import pandas as pd
import pytest

from concur import contracts
from concur.curate import curate, sft_record

TASKS = [  # task_id, category, level
    ("t/a", "single_op", 1),
    ("t/b", "fused", 2),
    ("t/c", "single_op", 1),
    ("t/d", "model", 3),
    ("t/e", "single_op", 1),
]

# candidate_id, task_id, reasoning_tokens, correct, speedup
ROWS = [
    ("a1", "t/a", 100, True, 2.0),
    ("a2", "t/a", 50, True, 2.0),  # fastest (tied with a1) and shortest (tied with a3): the (a) pick
    ("a3", "t/a", 50, True, 1.0),
    ("a4", "t/a", 10, False, 0.0),  # shortest overall but incorrect: never eligible
    ("b1", "t/b", 100, True, 3.0),
    ("b2", "t/b", 40, True, 1.5),  # shortest
    ("b3", "t/b", 200, True, 6.0),  # fastest: strict finds no kernel that is both; > 5 so high_speedup
    ("c1", "t/c", 30, True, 1.0),  # c1 and c2 equal on both keys: smallest candidate_id wins
    ("c2", "t/c", 30, True, 1.0),
    ("c3", "t/c", 20, False, 0.0),
    ("d1", "t/d", 500, True, 0.5),  # speed tie with d2, shorter: both rules pick d1
    ("d2", "t/d", 600, True, 0.5),
    ("e1", "t/e", 300, True, 0.8),  # shortest
    ("e2", "t/e", 400, True, 0.9),  # fastest: strict gives nothing for t/e, fastest_then_shortest gives e2
]


def make_tables(rows=ROWS, tasks=TASKS):
    task_frame = pd.DataFrame(
        {
            "task_id": [t for t, _, _ in tasks],
            "split": "train",
            "suite": "builtin",
            "level": [lv for _, _, lv in tasks],
            "name": [t.split("/")[1] + "_op" for t, _, _ in tasks],
            "code": "",
            "category": [c for _, c, _ in tasks],
            "n_ops": 1,
            "origin": "test",
        }
    )
    cands = pd.DataFrame(
        {
            "candidate_id": [r[0] for r in rows],
            "task_id": [r[1] for r in rows],
            "sample_idx": 0,
            "generator": "gen",
            "backend": "replay",
            "prompt": [f"prompt {r[0]}" for r in rows],
            "response": "",
            "reasoning": [f"think {r[0]}" for r in rows],
            "answer": [f"answer {r[0]}" for r in rows],
            "code": "code",
            "reasoning_tokens": [r[2] for r in rows],
            "completion_tokens": 0,
            "finish_reason": "replay",
            "seed": 0,
        }
    )
    verdicts = pd.DataFrame(
        {
            "candidate_id": [r[0] for r in rows],
            "task_id": [r[1] for r in rows],
            "status": ["correct" if r[3] else "incorrect" for r in rows],
            "reason": "",
            "compiled": True,
            "correct": [r[3] for r in rows],
            "ref_ms": 1.0,
            "new_ms": 1.0,
            "ref_median_ms": 1.0,
            "new_median_ms": 1.0,
            "ref_best_ms": 1.0,
            "new_best_ms": 1.0,
            "speedup": [r[4] for r in rows],
            "max_abs_err": 0.0,
            "device": "cpu",
            "verify_mode": "kernelbench",
            "compile_s": 0.0,
            "eval_s": 0.0,
        }
    )
    return cands, verdicts, task_frame


def settings(**over):
    base = {
        "selection": "strict",
        "speedup_threshold": 5.0,
        "single_op_share": 0.5,
        "ablations": ["min", "max", "speedup", "random"],
        "seed": 0,
    }
    return {**base, **over}


def by_criterion(dataset):
    return {crit: list(part["candidate_id"]) for crit, part in dataset.groupby("criterion", sort=False)}


def test_strict_selection_and_high_speedup():
    # (a) strict: a2, c1 (tie -> smallest id), d1; t/b and t/e have no kernel that is both.
    # (b): b3 (6.0 > 5). single_op rows a2, c1 = 2 of 4 = 0.5 >= 0.5 -> (c) adds nothing.
    out = curate(*make_tables(), settings())
    assert by_criterion(out.dataset) == {"shortest_fastest": ["a2", "c1", "d1"], "high_speedup": ["b3"]}
    assert list(out.dataset.columns) == list(contracts.DATASET)
    row = out.dataset.set_index("candidate_id").loc["b3"]
    assert (row["name"], row["category"], row["level"], row["speedup"]) == ("b_op", "fused", 2, 6.0)


def test_fastest_then_shortest_selection():
    # (a): a2 (2.0 tie, shorter), b3, c1 (full tie -> id), d1 (0.5 tie, shorter), e2.
    # b3 is already admitted by (a), so (b) adds nothing: no duplicates. singles a2, c1, e2 = 3/5 >= 0.5.
    out = curate(*make_tables(), settings(selection="fastest_then_shortest"))
    assert by_criterion(out.dataset) == {"shortest_fastest": ["a2", "b3", "c1", "d1", "e2"]}
    assert out.dataset["candidate_id"].is_unique


def test_speedup_threshold_is_strict():
    out = curate(*make_tables(), settings(speedup_threshold=6.0))  # 6.0 is not > 6.0
    assert "high_speedup" not in set(out.dataset["criterion"])
    out = curate(*make_tables(), settings(speedup_threshold=1.9))  # a1 (2.0), b1 (3.0), b3 (6.0); a2 already in (a)
    assert by_criterion(out.dataset)["high_speedup"] == ["a1", "b1", "b3"]


def test_single_op_balance_prefers_unrepresented_tasks():
    # After (a)+(b): a2, c1, d1, b3 -> 2 single_op of 4. Share 0.6: one more is needed (3/5 = 0.6).
    # t/e is not represented, so e1 (300 tokens, shortest of t/e) beats the shorter c2 (30).
    out = curate(*make_tables(), settings(single_op_share=0.6))
    assert by_criterion(out.dataset)["single_op_balance"] == ["e1"]


def test_single_op_balance_then_shortest_until_share():
    # Share 0.75: e1 (3/5), then by tokens c2 30 (4/6), a3 50 (5/7), a1 100 (6/8 = 0.75) -> stop before e2.
    out = curate(*make_tables(), settings(single_op_share=0.75))
    assert by_criterion(out.dataset)["single_op_balance"] == ["e1", "c2", "a3", "a1"]
    assert out.dataset["candidate_id"].is_unique


def test_single_op_balance_stops_when_pool_runs_out():
    # Share 1.0 is unreachable (d1, b3 are not single_op): all 5 remaining correct single_op kernels are added.
    out = curate(*make_tables(), settings(single_op_share=1.0))
    assert by_criterion(out.dataset)["single_op_balance"] == ["e1", "c2", "a3", "a1", "e2"]
    assert len(out.dataset) == 9


def test_single_op_share_zero_adds_nothing():
    out = curate(*make_tables(), settings(single_op_share=0.0))
    assert "single_op_balance" not in set(out.dataset["criterion"])


def test_ablation_orderings_and_sizes():
    # Dataset (share 0.6) has 5 rows; 12 correct candidates.
    out = curate(*make_tables(), settings(single_op_share=0.6))
    ids = {name: list(sub["candidate_id"]) for name, sub in out.subsets.items()}
    assert ids["min"] == ["c1", "c2", "b2", "a2", "a3"]  # 30, 30, 40, 50, 50 tokens
    assert ids["max"] == ["d2", "d1", "e2", "e1", "b3"]  # 600, 500, 400, 300, 200 tokens
    assert ids["speedup"] == ["b3", "b1", "a1", "a2", "b2"]  # 6, 3, 2, 2, 1.5
    correct_ids = sorted(r[0] for r in ROWS if r[3])
    draw = np.random.default_rng(0).choice(len(correct_ids), size=5, replace=False)
    assert ids["random"] == [correct_ids[i] for i in draw]
    for name, sub in out.subsets.items():
        assert len(sub) == 5 and sub["candidate_id"].is_unique
        assert set(sub["criterion"]) == {name}
        assert list(sub.columns) == list(contracts.DATASET)
        assert not set(sub["candidate_id"]) & {"a4", "c3"}  # incorrect ones never drawn


def test_random_subset_is_seeded_and_input_order_free():
    cands, verdicts, tasks = make_tables()
    first = curate(cands, verdicts, tasks, settings()).subsets["random"]
    shuffled = curate(cands.iloc[::-1], verdicts.iloc[::-1], tasks, settings()).subsets["random"]
    assert list(first["candidate_id"]) == list(shuffled["candidate_id"])


def test_sft_records():
    out = curate(*make_tables(), settings())
    assert len(out.sft) == len(out.dataset)
    assert out.sft[0] == {
        "candidate_id": "a2",
        "task_id": "t/a",
        "messages": [
            {"role": "user", "content": "prompt a2"},
            {"role": "assistant", "content": "<think>\nthink a2\n</think>\n\nanswer a2"},
        ],
    }
    assert sft_record({"candidate_id": "x", "task_id": "t", "prompt": "p", "reasoning": "", "answer": "A"}) == {
        "candidate_id": "x",
        "task_id": "t",
        "messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "<think>\n\n</think>\n\nA"}],
    }


def test_card_lists_counts_stats_and_rules():
    card = curate(*make_tables(), settings()).card
    assert "| shortest_fastest | 3 |" in card and "| high_speedup | 1 |" in card
    assert "| single_op_balance | 0 |" in card
    assert "| single_op | 2 |" in card and "| fused | 1 |" in card and "| model | 1 |" in card
    # dataset tokens a2 50, c1 30, d1 500, b3 200 -> min 30, median 125, mean 195, max 500
    assert "| dataset | 4 | 30 | 125 | 195 | 500 |" in card
    assert "smallest candidate_id" in card and "`selection`: strict" in card


def test_no_correct_candidates_gives_empty_outputs():
    rows = [("x1", "t/a", 10, False, 0.0), ("x2", "t/b", 20, False, 0.0)]
    out = curate(*make_tables(rows), settings())
    assert out.dataset.empty and list(out.dataset.columns) == list(contracts.DATASET)
    assert all(sub.empty for sub in out.subsets.values()) and set(out.subsets) == {"min", "max", "speedup", "random"}
    assert out.sft == []
    assert "dataset is empty" in out.card


def test_empty_candidate_table():
    cands, verdicts, tasks = make_tables([])
    out = curate(cands, verdicts, tasks, settings())
    assert out.dataset.empty and out.sft == []


def test_verdict_task_mismatch_is_an_error():
    cands, verdicts, tasks = make_tables()
    verdicts.loc[0, "task_id"] = "t/b"
    with pytest.raises(ValueError, match="candidate 'a1'.*'t/a'.*'t/b'"):
        curate(cands, verdicts, tasks, settings())


def test_missing_verdict_and_unknown_task_are_errors():
    cands, verdicts, tasks = make_tables()
    with pytest.raises(ValueError, match="'a1' has no verdict"):
        curate(cands, verdicts.iloc[1:], tasks, settings())
    with pytest.raises(ValueError, match="'t/e'.*not in the tasks table"):
        curate(cands, verdicts, tasks[tasks["task_id"] != "t/e"], settings())


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="selection"):
        curate(*make_tables(), settings(selection="fastest"))
    with pytest.raises(ValueError, match="unknown subset 'median'"):
        curate(*make_tables(), settings(ablations=["median"]))


def test_verdicts_on_degenerate_tasks_are_not_admitted():
    cands, verdicts, tasks = make_tables()
    verdicts["trusted"] = verdicts["task_id"] != "t/b"  # a trivial output passes t/b's check
    result = curate(cands, verdicts, tasks, settings())
    assert "t/b" not in set(result.dataset["task_id"])
    assert not any("t/b" in set(s["task_id"]) for s in result.subsets.values())
    trusted = curate(cands, verdicts.drop(columns="trusted"), tasks, settings())
    assert "t/b" in set(trusted.dataset["task_id"])


def test_reduced_precision_kernels_are_admitted_only_when_allowed():
    cands, verdicts, tasks = make_tables()
    verdicts["flags"] = np.where(verdicts["task_id"] == "t/b", "audit:speedup>10,precision:bf16", "")
    result = curate(cands, verdicts, tasks, settings())
    assert "t/b" not in set(result.dataset["task_id"])
    allowed = curate(cands, verdicts, tasks, {**settings(), "allow_reduced_precision": True})
    assert "t/b" in set(allowed.dataset["task_id"])


def reference_shortest_fastest(correct, selection):
    """Criterion (a) one task at a time, straight from its definition (the vectorised code must agree)."""
    chosen = []
    for _, group in sorted(correct.groupby("task_id"), key=lambda item: item[0]):
        speed = group["speedup"].fillna(-np.inf)
        if selection == "strict":
            both = group[(speed == speed.max()) & (group["reasoning_tokens"] == group["reasoning_tokens"].min())]
            if len(both):
                chosen.append(min(both["candidate_id"]))
        else:
            best = sorted(zip(-speed, group["reasoning_tokens"], group["candidate_id"]))[0]
            chosen.append(best[2])
    return chosen


@pytest.mark.parametrize("selection", ["strict", "fastest_then_shortest"])
def test_vectorised_selection_matches_the_per_task_definition(selection):
    from concur.curate import select_shortest_fastest

    rng = np.random.default_rng(7)
    n = 3000  # few distinct lengths and speedups, so ties (and NaN speedups) are common
    correct = pd.DataFrame(
        {
            "candidate_id": [f"c{i:05d}" for i in rng.permutation(n)],
            "task_id": [f"t/{i}" for i in rng.integers(0, 400, size=n)],
            "reasoning_tokens": rng.integers(1, 6, size=n) * 100,
            "speedup": np.where(rng.random(n) < 0.05, np.nan, rng.integers(1, 5, size=n) / 2),
        }
    )
    assert select_shortest_fastest(correct, selection) == reference_shortest_fastest(correct, selection)


# ---------------------------------------------------------------- guarded inputs (concur.screening)


def guarded_tables():
    """ROWS, with a few candidates made unfit: each kind the curation must leave out, all 'correct' and fast
    enough (speedup 9 > 5) that high_speedup and every ablation subset would take them."""
    cands, verdicts, tasks = make_tables()
    extra = make_tables(
        [
            ("x_trunc", "t/b", 5, True, 9.0),  # cut at the token cap
            ("x_nocode", "t/b", 5, True, 9.0),  # a 'correct' verdict on an empty program
            ("x_empty", "t/b", 5, True, 9.0),  # neither code nor reasoning (the rows)
            ("x_noreason", "t/b", 5, True, 9.0),  # code, but no reasoning, from a reasoning generator
            ("x_untrusted", "t/b", 5, True, 9.0),  # verdict on a degenerate task
            ("x_bf16", "t/b", 5, True, 9.0),  # reduced precision
            ("x_roofline", "t/b", 5, True, 9.0),  # timed quicker than writing its outputs takes
        ]
    )
    cands, verdicts = (
        pd.concat([cands, extra[0]], ignore_index=True),
        pd.concat([verdicts, extra[1]], ignore_index=True),
    )
    cid = cands["candidate_id"]
    cands["truncated"] = cid == "x_trunc"
    cands["truncation"] = np.where(cid == "x_trunc", "reported", "")
    cands["code"] = np.where(cid.isin(["x_nocode", "x_empty"]), "", "code")
    cands["code_source"] = np.where(cid.isin(["x_nocode", "x_empty"]), "", "answer")
    cands["reasoning"] = np.where(cid.isin(["x_empty", "x_noreason"]), "", cands["reasoning"])
    cands["reasoning_source"] = np.where(cid.isin(["x_empty", "x_noreason"]), "none", "tags")
    cands["tokenizer"] = "qwq (/models/qwq-tokenizer)"
    verdicts["trusted"] = verdicts["candidate_id"] != "x_untrusted"
    verdicts["flags"] = np.where(verdicts["candidate_id"] == "x_bf16", "precision:bf16", "")
    verdicts.loc[verdicts["candidate_id"] == "x_roofline", "flags"] = "audit:speedup>10,timing:beats_roofline"
    return cands, verdicts, tasks


UNFIT = {"x_trunc", "x_nocode", "x_empty", "x_noreason", "x_untrusted", "x_bf16", "x_roofline"}


def test_unfit_rows_are_never_admitted_and_honest_rows_are_kept():
    out = curate(*guarded_tables(), settings())
    for name, table in {"dataset": out.dataset, **out.subsets}.items():
        assert not set(table["candidate_id"]) & UNFIT, name
        assert (table["code"].str.strip() != "").all() and (table["reasoning"].str.strip() != "").all(), name
    # the honest rows give exactly what they give without the unfit ones
    assert by_criterion(out.dataset) == {"shortest_fastest": ["a2", "c1", "d1"], "high_speedup": ["b3"]}
    assert {n: list(s["candidate_id"]) for n, s in out.subsets.items() if n != "random"} == {
        n: list(s["candidate_id"]) for n, s in curate(*make_tables(), settings()).subsets.items() if n != "random"
    }


def test_each_exclusion_is_counted_in_the_card():
    out = curate(*guarded_tables(), settings())
    counts = out.counts
    assert counts["candidates"] == 21
    assert counts["left_out"] == {"truncated": 1, "no_reasoning": 2, "untrusted": 1}  # x_empty: no reasoning first
    assert (counts["no_code"], counts["correct_verdict_without_code"]) == (1, 1)  # x_nocode
    assert (counts["incorrect"], counts["reduced_precision_left_out"], counts["eligible"]) == (3, 1, 12)
    assert counts["beats_roofline_left_out"] == 1
    assert counts["truncated"] == {"total": 1, "reported": 1, "detected": 0, "included": False}
    card = out.card
    for line in (
        "| left out: generation cut at the token cap (`include_truncated` false) | 1 |",
        "| left out: no reasoning, from a reasoning generator | 2 |",
        "| left out: verdict not trusted (degenerate task) | 1 |",
        "| no code (never correct) | 1 |",
        "| incorrect | 2 |",  # a4, c3
        "| left out: correct, reduced precision (`allow_reduced_precision` false) | 1 |",
        "| left out: correct, timed quicker than writing its outputs (`timing:beats_roofline`) | 1 |",
        "| eligible: correct (the pool of every criterion and ablation subset) | 12 |",
        "| **all** | 21 |",
    ):
        assert line in card, line
    assert "Truncated (cut at the token cap): 1 (1 reported by the backend, 0 detected); left out" in card
    assert "Reasoning tokens counted with: gen: `qwq (/models/qwq-tokenizer)`" in card
    assert "1 `correct` verdicts on candidates without code count as incorrect" in card


def test_include_truncated_and_allow_reduced_precision_put_rows_back():
    out = curate(*guarded_tables(), settings(include_truncated=True, allow_reduced_precision=True))
    assert {"x_trunc", "x_bf16"} <= set(out.dataset["candidate_id"])  # speedup 9 > 5: high_speedup
    assert not set(out.dataset["candidate_id"]) & (UNFIT - {"x_trunc", "x_bf16"})
    assert out.counts["left_out"]["truncated"] == 0 and out.counts["truncated"]["included"] is True
    assert "Truncated (cut at the token cap): 1 (1 reported by the backend, 0 detected); included" in out.card


def test_a_generator_without_reasoning_is_not_held_to_it():
    cands, verdicts, tasks = make_tables()
    cands["reasoning"] = ""  # an instruct model: no candidate has reasoning
    out = curate(cands, verdicts, tasks, settings())
    assert by_criterion(out.dataset) == {"shortest_fastest": ["a2", "c1", "d1"], "high_speedup": ["b3"]}
    assert out.counts["reasoning_generators"] == [] and out.counts["left_out"]["no_reasoning"] == 0


def test_old_candidate_files_mean_what_the_new_columns_default_to():
    cands, verdicts, tasks = make_tables()
    new = cands.assign(reasoning_source="tags", code_source="answer", truncated=False, truncation="", tokenizer="")
    old_out, new_out = curate(cands, verdicts, tasks, settings()), curate(new, verdicts, tasks, settings())
    pd.testing.assert_frame_equal(old_out.dataset, new_out.dataset)
    assert old_out.card == new_out.card

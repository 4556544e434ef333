"""Multi-turn refinement: feedback messages, refinement turns replayed from a file of two-turn trajectories,
curation across turns (single-turn and multi-turn records) and evaluation after each turn."""

import json
import math

import pandas as pd
import pytest

from concur import contracts
from concur.curate import curate
from concur.evaluate import results_table, score, table_markdown, trajectory_verdicts, turn_states
from concur.feedback import Feedback, needs_refinement, shown_answer, trimmed
from concur.synthesize import candidate_id, refine, refinement_requests, synthesize

TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
TASKS = pd.DataFrame({"task_id": ["s/a", "s/b"], "code": [TASK, TASK]})


def program(tag: str) -> str:
    return f"```python\nclass ModelNew:  # {tag}\n    pass\n```"


def response(thought: str, tag: str) -> str:
    return f"<think>\n{thought}\n</think>\n\nThe kernel.\n\n{program(tag)}"


# two tasks, three samples each; turn 2 for four trajectories (one whose parent is correct and fast: stopped)
ROWS = [
    {"task_id": "s/a", "sample_idx": 0, "response": response("first try", "a0")},
    {"task_id": "s/a", "sample_idx": 1, "response": response("fast one", "a1")},
    {"task_id": "s/a", "sample_idx": 2, "response": "<think>\nonly thinking, no program\n</think>\n\nSorry."},
    {"task_id": "s/b", "sample_idx": 0, "response": response("slow one", "b0")},
    {"task_id": "s/b", "sample_idx": 1, "response": response("wrong one", "b1")},
    {"task_id": "s/b", "sample_idx": 2, "response": response("b2", "b2")},
    {"task_id": "s/a", "sample_idx": 0, "turn": 2, "response": response("fixed the build", "a0t2")},
    {"task_id": "s/a", "sample_idx": 1, "turn": 2, "response": response("never asked", "a1t2")},
    {"task_id": "s/a", "sample_idx": 2, "turn": 2, "response": response("wrote it out", "a2t2")},
    {"task_id": "s/b", "sample_idx": 0, "turn": 2, "response": response("faster now", "b0t2")},
]
# turn-1 verdicts: (status, speedup, reason)
TURN1 = {
    ("s/a", 0): ("compile_error", 0.0, "error: 'foo' was not declared in this scope"),
    ("s/a", 1): ("correct", 3.0, ""),
    ("s/a", 2): ("no_code", 0.0, "no ModelNew"),
    ("s/b", 0): ("correct", 0.5, ""),
    ("s/b", 1): ("incorrect", 0.0, "trial 1: value_mismatch max_abs_err=0.5 output 0"),
    ("s/b", 2): ("runtime_error", 0.0, "RuntimeError: shape"),
}
TURN2 = {("s/a", 0): ("correct", 1.5, ""), ("s/a", 2): ("correct", 0.9, ""), ("s/b", 0): ("correct", 2.5, "")}


def replay_file(tmp_path):
    path = tmp_path / "gens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {"backend": "replay", "path": str(path)}


SETTINGS = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 512, "seed": 0}


def verdicts(frame: pd.DataFrame, outcomes: dict) -> pd.DataFrame:
    rows = []
    for row in frame.itertuples():
        status, speedup, reason = outcomes[(row.task_id, row.sample_idx)]
        correct = status == "correct"
        rows.append(
            {
                "candidate_id": row.candidate_id,
                "task_id": row.task_id,
                "status": status,
                "reason": reason,
                "compiled": status not in ("compile_error", "no_code"),
                "correct": correct,
                "ref_ms": 1.0 if correct else math.nan,
                "new_ms": 1.0 / speedup if correct else math.nan,
                "ref_median_ms": math.nan,
                "new_median_ms": math.nan,
                "ref_best_ms": math.nan,
                "new_best_ms": math.nan,
                "speedup": speedup,
                "max_abs_err": 0.5 if status == "incorrect" else math.nan,
                "device": "cpu",
                "verify_mode": "hardened",
                "compile_s": 0.0,
                "eval_s": 0.0,
                "flags": "",
                "trusted": True,
            }
        )
    return contracts.conform(pd.DataFrame(rows), contracts.VERDICTS, "verdicts")


@pytest.fixture
def two_turns(tmp_path):
    generator = replay_file(tmp_path)
    first = synthesize(TASKS, "g", generator, {}, SETTINGS, "cpp", 3).candidates
    v1 = verdicts(first, TURN1)
    made = refine(TASKS, first, v1, 2, "g", generator, {}, SETTINGS, "cpp", 3, 1.0)
    return first, v1, made


def test_feedback_tells_each_outcome():
    build = Feedback("compile_error", "x" * 5000).message()
    assert "did not build" in build and "(trimmed)" in build and len(build) < 2000
    wrong = Feedback("incorrect", "trial 1: value_mismatch output 0", max_abs_err=0.25).message()
    assert "value_mismatch output 0" in wrong and "0.25" in wrong
    slow = Feedback("correct", speedup=0.5, ref_ms=1.0, new_ms=2.0).message()
    assert "0.5x" in slow and "yours 2 ms" in slow and "faster" in slow and "spends its time" not in slow
    hot = {"status": "correct", "speedup": 0.5, "ref_hotspots": "aten::addmm 80%; aten::relu 20%"}
    assert "spends its time in: aten::addmm 80%; aten::relu 20%." in Feedback.from_row(hot).message()
    cut = Feedback("no_code", truncated=True).message()
    assert cut.startswith("Your previous answer was cut off") and "ModelNew" in cut
    assert trimmed("abc", 10) == "abc" and shown_answer("", "code") == "```python\ncode\n```"
    assert needs_refinement(False, math.nan, 1.0) and needs_refinement(True, 1.0, 1.0)
    assert not needs_refinement(True, 1.5, 1.0) and needs_refinement(True, 9.0, None)
    assert needs_refinement(True, math.nan, 1.0)


def test_turn_two_refines_what_is_not_correct_and_fast(two_turns):
    first, v1, made = two_turns
    assert list(first["turn"]) == [1] * 6 and set(first["parent_id"]) == {""}
    frame = made.candidates
    assert list(frame.columns) == list(contracts.CANDIDATES)
    # s/a 1 (correct, 3x) stopped; s/b 1 and 2 were asked but the file has no turn 2 for them
    assert [(t, s) for t, s in zip(frame["task_id"], frame["sample_idx"])] == [("s/a", 0), ("s/a", 2), ("s/b", 0)]
    assert set(frame["turn"]) == {2}
    parents = first.set_index(["task_id", "sample_idx"])["candidate_id"]
    assert [parents[(t, s)] for t, s in zip(frame["task_id"], frame["sample_idx"])] == list(frame["parent_id"])
    assert list(frame["candidate_id"]) == [candidate_id("g", t, s, 2) for t, s in [("s/a", 0), ("s/a", 2), ("s/b", 0)]]
    assert candidate_id("g", "s/a", 0, 2) != candidate_id("g", "s/a", 0) == first["candidate_id"].iloc[0]
    prompts = frame.set_index(["task_id", "sample_idx"])["prompt"]
    assert "did not build" in prompts[("s/a", 0)] and "'foo' was not declared" in prompts[("s/a", 0)]
    assert "no complete program" in prompts[("s/a", 2)] and "0.5x" in prompts[("s/b", 0)]
    assert "a0t2" in frame["code"].iloc[0]
    assert [(s.kind, s.task_id, s.sample_idx) for s in made.report if s.kind == "stopped"] == [("stopped", "s/a", 1)]


def test_the_chat_holds_every_earlier_turn_without_reasoning(two_turns, tmp_path):
    first, v1, made = two_turns
    history = pd.concat([first, made.candidates], ignore_index=True)
    v2 = verdicts(made.candidates, TURN2)
    requests, prompts, parents = refinement_requests(TASKS, history, v2, 3, None)
    assert [(r.task_id, r.samples, r.turn) for r in requests] == [("s/a", (0,), 3), ("s/a", (2,), 3), ("s/b", (0,), 3)]
    chat = requests[0].history
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
    assert chat[0]["content"] == first["prompt"].iloc[0] and "did not build" in chat[2]["content"]
    assert "first try" not in chat[1]["content"] and "a0" in chat[1]["content"]
    assert "fixed the build" not in chat[3]["content"] and "1.5x" in requests[0].prompt
    assert parents[("s/a", 0)] == made.candidates["candidate_id"].iloc[0]
    # with stop_speedup 1.0 only the 0.9x version goes on
    assert [r.task_id for r in refinement_requests(TASKS, history, v2, 3, 1.0)[0]] == ["s/a"]


def test_a_version_without_a_verdict_is_one_clear_error(two_turns):
    first, v1, _ = two_turns
    with pytest.raises(ValueError, match="turn 1 candidate .* has no verdict"):
        refinement_requests(TASKS, first, v1.iloc[1:], 2, 1.0)


def curation_inputs(two_turns):
    first, v1, made = two_turns
    candidates = pd.concat([first, made.candidates], ignore_index=True)
    verdict_table = pd.concat([v1, verdicts(made.candidates, TURN2)], ignore_index=True)
    tasks = pd.DataFrame(
        {
            "task_id": ["s/a", "s/b"],
            "name": ["a", "b"],
            "category": ["fused", "fused"],
            "level": [1, 1],
        }
    )
    return candidates, verdict_table, tasks


@pytest.mark.parametrize("records", ["single_turn", "multi_turn"])
def test_curation_picks_across_turns(two_turns, records):
    candidates, verdict_table, tasks = curation_inputs(two_turns)
    settings = {"single_op_share": 0.0, "speedup_threshold": 100.0, "ablations": ["min"], "records": records}
    out = curate(candidates, verdict_table, tasks, settings)
    assert list(out.dataset.columns) == list(contracts.DATASET)
    picked = out.dataset.set_index("task_id")
    assert picked.loc["s/a", "turn"] == 1 and picked.loc["s/b", "turn"] == 2  # the fastest of each task
    sft = {r["task_id"]: r["messages"] for r in out.sft}
    assert len(sft["s/a"]) == 2
    task_prompt = candidates.loc[candidates["turn"] == 1, "prompt"].iloc[0]
    if records == "single_turn":
        assert json.loads(picked.loc["s/b", "history"]) == [] and picked.loc["s/b", "prompt"] == task_prompt
        assert len(sft["s/b"]) == 2
    else:
        assert [m["role"] for m in sft["s/b"]] == ["user", "assistant", "user", "assistant"]
        assert sft["s/b"][0]["content"] == task_prompt and "0.5x" in sft["s/b"][2]["content"]
        assert "faster now" in sft["s/b"][3]["content"] and "slow one" not in sft["s/b"][1]["content"]
    assert f"`{records}`" in out.card and "- Turns: 2" in out.card


def test_evaluation_after_each_turn_and_best_of_trajectory(two_turns):
    first, v1, made = two_turns
    v2 = verdicts(made.candidates, TURN2)
    frame = trajectory_verdicts([v1, v2], [first, made.candidates], "m")
    tasks = pd.DataFrame({"task_id": ["s/a", "s/b"], "level": [1, 2], "category": ["fused", "fused"]})
    labels = [label for label, _ in turn_states(frame.merge(tasks, on="task_id"), 2)]
    assert labels == ["1", "2", "best"]
    settings = {"pass_k": [1], "fast_p": [0, 1], "turns": 2, "samples": 3}
    scores = score({"m": frame}, tasks, settings)
    overall = scores[scores["scope"] == "overall"].set_index("turn")
    assert overall.loc["1", "exec"] == pytest.approx(2 / 6) and overall.loc["1", "fast_1"] == pytest.approx(1 / 6)
    assert overall.loc["2", "exec"] == pytest.approx(4 / 6) and overall.loc["2", "fast_1"] == pytest.approx(3 / 6)
    assert overall.loc["best", "exec"] == pytest.approx(4 / 6) and (overall["n_samples"] == 6).all()
    table = results_table(scores, [1], {"m": {"kind": "base", "generator": "g"}})
    assert ["all_exec@1_turn1", "all_exec@1_turn2", "all_exec@1_best"] == [
        c for c in table.columns if c.startswith("all_exec@1")
    ]
    assert table.loc[0, "all_exec@1_turn2"] == pytest.approx(4 / 6)
    text = table_markdown(scores, settings, {"m": {"kind": "base"}})
    assert "## By turn" in text and "Turn 1 Exec@1" in text and "Best fast_1@1" in text
    single = score({"m": v1}, tasks, {**settings, "turns": 1})
    assert set(single["turn"]) == {"1"} and "all_exec@1" in results_table(single, [1]).columns
    with pytest.raises(ValueError, match="sample_idx"):
        score({"m": v1}, tasks, settings)

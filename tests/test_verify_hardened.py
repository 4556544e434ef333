"""Hardened checks on CPU, end to end: each cheating pattern that is not CUDA-specific, and process faults.

The compile step and the verify step run separately here, as in the workflow: one build of each fixture, then
both modes verify from the same build cache. Fault fixtures need no extension.
"""

from pathlib import Path

import pandas as pd
import pytest
import torch

from concur import contracts, verify_child
from concur.verify import compile_frame, verify_frame
from verify_frames import candidates_frame, tasks_frame

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
TASKS = {"relu_add": "task_relu_add.py", "relu_rand": "task_relu_rand.py"}


def frames(rows: list[tuple[str, str, str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Candidates (candidate_id, task_id, fixture name) and the fixture tasks."""
    codes = [(cid, tid, (FIXTURES / f"solution_{name}.py").read_text()) for cid, tid, name in rows]
    return candidates_frame(codes), tasks_frame([(t, (FIXTURES / p).read_text()) for t, p in TASKS.items()])


SETTINGS = {"device": "cpu", "timeout_s": 300, "workers": 2, "correctness_trials": 3, "signed_trials": 2,
            "warmup": 1, "timing_trials": 3, "atol": 1e-2, "rtol": 1e-2}  # fmt: skip
CHEATS = [
    ("identity", "relu_rand", "identity"),
    ("stale", "relu_add", "stale_output"),
    ("tampers", "relu_add", "tampers"),
    ("never_calls", "relu_add", "never_calls_kernel"),
    ("honest", "relu_add", "correct"),
]


@pytest.fixture(scope="module")
def cheats(tmp_path_factory):
    """Builds once, then verdicts in both modes: {mode: verdicts indexed by candidate_id}, and the builds table."""
    candidates, tasks = frames(CHEATS)
    cache = tmp_path_factory.mktemp("cache")
    settings = {**SETTINGS, "build_cache": str(cache)}
    builds = compile_frame(candidates, {**settings, "mode": "kernelbench"}, tmp_path_factory.mktemp("c"), False)
    verdicts = {
        mode: verify_frame(candidates, tasks, {**settings, "mode": mode}, tmp_path_factory.mktemp(mode), False,
                           builds=builds).set_index("candidate_id")  # fmt: skip
        for mode in ("kernelbench", "hardened")
    }
    return verdicts, builds.set_index("candidate_id")


def test_compile_step_builds_every_extension(cheats):
    _, builds = cheats
    assert list(builds.columns) == list(contracts.BUILDS)[1:]
    assert set(builds["status"]) == {"built"}
    assert (builds["compile_s"] > 1.0).all()


def test_verify_step_loads_from_the_cache(cheats):
    verdicts, builds = cheats
    honest = verdicts["hardened"].loc["honest"]
    assert honest.status == "correct"
    assert honest.compile_s == builds.loc["honest", "compile_s"]  # no second build: the build's time is reported


def test_kernelbench_mode_lets_each_cheat_through(cheats):
    kernelbench = cheats[0]["kernelbench"]
    for cid in ("identity", "tampers", "never_calls", "honest"):
        assert kernelbench.loc[cid, "status"] == "correct", cid


def test_signed_inputs_catch_a_kernel_right_only_on_non_negative_inputs(cheats):
    row = cheats[0]["hardened"].loc["identity"]
    assert row.status == "incorrect"
    assert row.reason.startswith("check:signed_inputs: trial 4: value_mismatch")


def test_identity_passing_the_check_flags_the_task_degenerate(cheats):
    for verdicts in cheats[0].values():
        row = verdicts.loc["identity"]
        assert (row["trusted"], row["flags"]) == (False, "degenerate_task:identity")
        assert verdicts.loc["honest", "trusted"] and verdicts.loc["honest", "flags"] == ""


def test_poisoned_memory_exposes_an_unwritten_output(cheats):
    row = cheats[0]["hardened"].loc["stale"]
    # whatever the allocator hands back (poison, or garbage on the CPU) is not the answer
    assert row.status == "incorrect" and row.reason.startswith("trial 1: ")


def test_replaced_harness_functions_are_detected(cheats):
    row = cheats[0]["hardened"].loc["tampers"]
    assert (row.status, row.reason) == ("rejected", "check:tampering: replaced torch.allclose")


def test_a_kernel_that_never_runs_is_rejected(cheats):
    row = cheats[0]["hardened"].loc["never_calls"]
    assert row.status == "rejected"
    assert row.reason == "check:kernel_not_called: forward never called into the compiled extension"


def test_the_modes_agree_on_the_honest_candidate(cheats):
    kernelbench, hardened = cheats[0]["kernelbench"].loc["honest"], cheats[0]["hardened"].loc["honest"]
    assert kernelbench.status == hardened.status == "correct"
    assert kernelbench.max_abs_err == hardened.max_abs_err == 0.0


def test_faults_end_only_their_own_candidate(tmp_path):
    rows = [("exits", "relu_add", "exits"), ("forks", "relu_add", "fork_bomb"), ("hog", "relu_add", "memory_hog"),
            ("ok", "relu_add", "torch_only")]  # fmt: skip
    candidates, tasks = frames(rows)
    settings = {**SETTINGS, "mode": "kernelbench", "memory_limit_mb": 1024, "max_processes": 32, "timeout_s": 120}
    verdicts = verify_frame(candidates, tasks, settings, tmp_path, progress=False).set_index("candidate_id")
    assert tuple(verdicts.loc["exits", ["status", "reason"]]) == (
        "runtime_error", "crashed during evaluate: exited with code 0 before reporting")
    assert verdicts.loc["forks", "status"] == "runtime_error"
    assert verdicts.loc["forks", "reason"].startswith("killed during evaluate: ") and "(limit 32)" in verdicts.loc["forks", "reason"]
    assert verdicts.loc["hog", "status"] == "runtime_error"
    assert verdicts.loc["hog", "reason"].startswith("killed during evaluate: out of memory")
    assert verdicts.loc["ok", "status"] == "correct"


# ---------------------------------------------------------------- the child's checks, on tensors


def test_nan_never_passes_and_inf_fails_only_in_hardened():
    ref = [torch.tensor([1.0, float("inf"), float("nan")])]
    same = torch.tensor([1.0, float("inf"), float("nan")])
    kernelbench = verify_child.compare(same, ref, 1e-2, 1e-2, strict_finite=False)
    assert not kernelbench["allclose"]  # NaN != NaN, as in torch.allclose's default
    ref_inf, new_inf = [torch.tensor([1.0, float("inf")])], torch.tensor([1.0, float("inf")])
    assert verify_child.compare(new_inf, ref_inf, 1e-2, 1e-2, strict_finite=False)["allclose"]
    assert not verify_child.compare(new_inf, ref_inf, 1e-2, 1e-2, strict_finite=True)["ok_finite"]


def test_signed_inputs_cover_both_signs():
    x = torch.rand(64, 64)
    moved = verify_child.signed(x)
    assert (moved < 0).any() and (moved > 0).any()
    assert verify_child.signed(torch.arange(5)) is not None and torch.equal(verify_child.signed(torch.arange(5)),
                                                                           torch.arange(5))  # fmt: skip


def test_degenerate_guesses():
    ref = [torch.zeros(4, 4)]
    inputs = [torch.randn(4, 4)]
    guesses = verify_child.degenerate_outputs(ref, inputs)
    assert set(guesses) == {"zeros", "constant", "identity"}
    assert torch.equal(guesses["identity"][0], inputs[0])


def test_trial_plan_matches_kernelbench_seeds():
    torch.manual_seed(42)
    expected = torch.randint(0, 2**32 - 1, (5,)).tolist()
    plan = verify_child.trial_plan({"correctness_trials": 5, "mode": "hardened", "signed_trials": 2})
    assert [s for s, kind in plan if kind == "random"] == expected
    assert [s for s, kind in plan if kind == "signed"] == expected[:2]
    assert verify_child.trial_plan({"correctness_trials": 5, "mode": "kernelbench", "signed_trials": 2})[-1][1] == "random"


def test_hardened_timing_runs_until_each_side_has_run_timing_min_s():
    import time as clock

    import torch

    from concur.verify_child import MAX_TRIALS_FACTOR, time_models

    def one_ms(x):
        clock.sleep(0.001)
        return x

    spec = {"mode": "hardened", "warmup": 1, "timing_trials": 3, "timing_min_s": 0.05}
    ref, new = time_models(one_ms, one_ms, [torch.zeros(1)], spec, torch.device("cpu"))
    assert len(ref["stream"]) == len(new["stream"]) and 3 < len(ref["stream"]) <= 3 * MAX_TRIALS_FACTOR
    assert min(sum(ref["stream"]), sum(new["stream"])) >= 50.0  # ms
    assert ref["device"] == new["device"] == []  # the device-wide end time is a CUDA measurement
    ref, new = time_models(one_ms, one_ms, [torch.zeros(1)], {**spec, "mode": "kernelbench"}, torch.device("cpu"))
    assert len(ref["stream"]) == len(new["stream"]) == 3  # KernelBench's fixed count

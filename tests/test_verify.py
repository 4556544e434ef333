"""Verifier on CPU: statuses end to end (real child processes), the build cache, and verdict rules on raw facts.

Compiles: solution_correct, solution_compile_error, solution_mutates_input, solution_order_dependent (4 in all);
every other run hits the module-wide build cache or needs no extension.
"""

import math
import re
import time
from pathlib import Path

import pandas as pd
import pytest

from concur import contracts
from concur.verify import ChildOutcome, build_cache_key, decide_verdict, normalize_settings, read_facts
from concur.verify import verify_frame, verify_one
from verify_frames import candidates_frame, tasks_frame

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
REFERENCE = (FIXTURES / "task_relu_add.py").read_text()


def solution(name: str) -> str:
    return (FIXTURES / f"solution_{name}.py").read_text()


def frames(rows: list[tuple[str, str, str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Candidates (candidate_id, task_id, code) and the two fixture tasks."""
    broken = (FIXTURES / "task_broken_reference.py").read_text()
    return candidates_frame(rows), tasks_frame([("relu_add", REFERENCE), ("broken", broken)])


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("build-cache")
    return {"device": "cpu", "mode": "kernelbench", "timeout_s": 600, "workers": 2, "correctness_trials": 3,
            "warmup": 1, "timing_trials": 5, "atol": 1e-2, "rtol": 1e-2, "build_cache": str(cache)}  # fmt: skip


@pytest.fixture(scope="module")
def kernelbench_batch(settings, tmp_path_factory) -> tuple[pd.DataFrame, float]:
    """One pool run over every kernelbench-mode status; builds solution_correct into a fresh cache."""
    rows = [
        ("c-correct", "relu_add", solution("correct")),
        ("c-wrong", "relu_add", solution("wrong")),
        ("c-shape", "relu_add", solution("wrong_shape")),
        ("c-raises", "relu_add", solution("raises")),
        ("c-aborts", "relu_add", solution("aborts")),
        ("c-nomodel", "relu_add", solution("no_model_new")),
        ("c-compile", "relu_add", solution("compile_error")),
        ("c-empty", "relu_add", ""),
        ("c-badref", "broken", solution("torch_only")),
    ]
    candidates, tasks = frames(rows)
    start = time.perf_counter()
    verdicts = verify_frame(candidates, tasks, settings, tmp_path_factory.mktemp("work"), progress=False)
    return verdicts.set_index("candidate_id"), time.perf_counter() - start


def test_frame_follows_contract_and_input_order(kernelbench_batch):
    verdicts, _ = kernelbench_batch
    assert list(verdicts.reset_index().columns) == list(contracts.VERDICTS)
    assert list(verdicts.index) == ["c-correct", "c-wrong", "c-shape", "c-raises", "c-aborts", "c-nomodel",
                                    "c-compile", "c-empty", "c-badref"]  # fmt: skip
    assert set(verdicts["verify_mode"]) == {"kernelbench"} and set(verdicts["device"]) == {"cpu"}


def test_correct_candidate(kernelbench_batch):
    row = kernelbench_batch[0].loc["c-correct"]
    assert (row.status, row.reason, row.compiled, row.correct) == ("correct", "", True, True)
    # same float ops in the same order as torch: bit-identical
    assert row.max_abs_err == 0.0
    assert row.ref_ms > 0 and row.new_ms > 0 and row.ref_median_ms > 0 and row.new_median_ms > 0
    assert row.speedup == pytest.approx(row.ref_ms / row.new_ms)  # kernelbench mode: means
    assert row.compile_s > 1.0  # a real build (fresh cache)


def test_incorrect_candidates(kernelbench_batch):
    verdicts = kernelbench_batch[0]
    wrong, shape = verdicts.loc["c-wrong"], verdicts.loc["c-shape"]
    assert wrong.status == "incorrect" and wrong.reason.startswith("trial 1: value_mismatch")
    assert wrong.max_abs_err > 1e-2 and wrong.speedup == 0.0 and math.isnan(wrong.new_ms)
    assert shape.status == "incorrect"
    assert shape.reason == "trial 1: shape_mismatch output 0: got (8,), expected (8, 16)"


def test_failures_in_the_candidate_process(kernelbench_batch):
    verdicts = kernelbench_batch[0]
    assert tuple(verdicts.loc["c-raises", ["status", "reason"]]) == ("runtime_error", "ValueError: kernel launch failed")
    aborts = verdicts.loc["c-aborts"]
    assert (aborts.status, aborts.reason) == ("runtime_error", "crashed during evaluate: killed by SIGABRT")
    assert tuple(verdicts.loc["c-nomodel", ["status", "reason"]]) == ("runtime_error", "no ModelNew")
    compile_error = verdicts.loc["c-compile"]
    assert (compile_error.status, compile_error.compiled) == ("compile_error", False)
    # the column depends on the gcc version; typographic quotes are normalised to ASCII ones
    gcc = r"'undeclared_name' was not declared in this scope"
    clang = r"use of undeclared identifier 'undeclared_name'"
    assert re.fullmatch(rf"main\.cpp:4:\d+: error: ({gcc}|{clang})", compile_error.reason)


def test_no_code_and_broken_reference(kernelbench_batch):
    verdicts = kernelbench_batch[0]
    empty = verdicts.loc["c-empty"]
    assert (empty.status, empty.compiled, empty.compile_s) == ("no_code", False, 0.0)
    badref = verdicts.loc["c-badref"]
    assert badref.status == "runtime_error"
    assert badref.reason == "reference: RuntimeError: reference is broken"


def test_build_cache_reused_by_a_new_process(kernelbench_batch, settings, tmp_path):
    first = kernelbench_batch[0].loc["c-correct"].compile_s
    again = verify_one(REFERENCE, solution("correct"), settings, tmp_path)
    assert again["status"] == "correct"
    assert again["compile_s"] < 0.2 * first and again["compile_s"] < 3.0


def test_hardened_mode_screens_and_checks(kernelbench_batch, settings, tmp_path):
    rows = [
        ("h-correct", "relu_add", solution("correct")),
        ("h-torch", "relu_add", solution("torch_only")),
        ("h-mutates", "relu_add", solution("mutates_input")),
        ("h-order", "relu_add", solution("order_dependent")),
    ]
    candidates, tasks = frames(rows)
    hardened = verify_frame(candidates, tasks, {**settings, "mode": "hardened"}, tmp_path, progress=False)
    hardened = hardened.set_index("candidate_id")
    assert list(hardened["status"]) == ["correct", "rejected", "rejected", "rejected"]
    assert hardened.loc["h-torch", "reason"] == "screen:no_custom_kernel"
    assert hardened.loc["h-mutates", "reason"] == "check:input_mutation: ModelNew changed input(s) [0]"
    assert hardened.loc["h-order", "reason"].startswith("check:order_candidate_ref_candidate: trial 1")
    # the two modes agree on the honest candidate
    honest = kernelbench_batch[0].loc["c-correct"]
    assert hardened.loc["h-correct", "max_abs_err"] == honest.max_abs_err == 0.0
    assert hardened.loc["h-correct", "verify_mode"] == "hardened"

    kernelbench = verify_frame(candidates.iloc[[1, 2, 3]], tasks, settings, tmp_path / "kb", progress=False)
    assert list(kernelbench["status"]) == ["correct", "correct", "incorrect"]


def test_timeout_kills_the_candidate(settings, tmp_path):
    start = time.perf_counter()
    verdict = verify_one(REFERENCE, solution("hangs"), {**settings, "timeout_s": 5}, tmp_path)
    assert (verdict["status"], verdict["reason"]) == ("timeout", "timeout after 5 s during compile")
    assert time.perf_counter() - start < 30


def test_unknown_task_is_an_error(settings, tmp_path):
    candidates, tasks = frames([("c-1", "missing_task", "x = 1")])
    with pytest.raises(ValueError, match="candidate c-1: task 'missing_task' is not in the tasks frame"):
        verify_frame(candidates, tasks, settings, tmp_path, progress=False)


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="verify.mode must be kernelbench or hardened, got 'strict'"):
        normalize_settings({"mode": "strict", "device": "cpu"})


# ---------------------------------------------------------------- rules on raw facts (no process)

SETTINGS = {"device": "cpu", "mode": "hardened", "timeout_s": 10, "workers": 1, "correctness_trials": 2,
            "warmup": 0, "timing_trials": 1, "atol": 1e-2, "rtol": 1e-2, "audit_speedup": 10.0}  # fmt: skip
PASS = {"ok_shape": True, "ok_dtype": True, "ok_finite": True, "allclose": True, "max_abs_err": 0.001}
TIMING = {"ref_timing": {"mean_ms": 3.0, "median_ms": 2.5}, "new_timing": {"mean_ms": 1.5, "median_ms": 1.0}}


def facts_with(trials: list[dict], **evaluate) -> dict:
    return {
        "nonce": "n", "complete": True, "device": "cpu", "eval_s": 0.5,
        "compile": {"ok": True, "seconds": 2.0, "has_model_new": True},
        "evaluate": {"error": None, "trials": trials, **evaluate},
    }  # fmt: skip


def verdict(facts: dict, mode: str = "hardened", timed_out: bool = False, returncode: int = 0) -> dict:
    return decide_verdict(ChildOutcome(returncode, timed_out, facts, 1.0), {**SETTINGS, "mode": mode}, "cpu")


def test_verdict_speedup_from_medians_in_hardened_and_means_in_kernelbench():
    trial = {"checks": [{"name": "candidate_first", **PASS}, {"name": "candidate", **PASS, "max_abs_err": 0.004}]}
    v = verdict(facts_with([trial, trial], **TIMING))
    assert (v["status"], v["speedup"], v["max_abs_err"], v["new_median_ms"]) == ("correct", 2.5, 0.004, 1.0)
    assert (v["ref_ms"], v["new_ms"]) == (3.0, 1.5)  # the means are reported beside the medians
    assert (v["compile_s"], v["eval_s"]) == (2.0, 0.5)
    kb_trial = {"checks": [{"name": "candidate", **PASS}]}
    assert verdict(facts_with([kb_trial, kb_trial], **TIMING), mode="kernelbench")["speedup"] == 2.0


def test_hardened_cuda_speedup_counts_side_stream_work_only_when_the_candidate_leaves_some():
    trial = {"checks": [{"name": "candidate_first", **PASS}, {"name": "candidate", **PASS}]}
    ref = {"mean_ms": 0.16, "median_ms": 0.15, "device_mean_ms": 0.19, "device_median_ms": 0.18}  # 30 us round trip
    honest = {"mean_ms": 0.07, "median_ms": 0.06, "device_mean_ms": 0.10, "device_median_ms": 0.09}
    v = verdict(facts_with([trial, trial], ref_timing=ref, new_timing=honest))
    assert v["speedup"] == pytest.approx(2.5) and v["flags"] == ""  # the stream times: no host latency in the ratio
    # its kernel ran on a side stream: the current stream saw 5 us, the device was busy 0.3 ms
    side = {"mean_ms": 0.005, "median_ms": 0.005, "device_mean_ms": 0.33, "device_median_ms": 0.33}
    v = verdict(facts_with([trial, trial], ref_timing=ref, new_timing=side))
    assert v["speedup"] == pytest.approx(0.18 / 0.33) and v["new_median_ms"] == 0.33
    assert v["flags"] == "timing:untimed_stream_work"


def test_verdict_checks_named_in_reason():
    nan_check = {"name": "candidate", **PASS, "ok_finite": False, "detail": "output 0: non-finite values"}
    assert verdict(facts_with([{"checks": [nan_check]}]))["reason"] == "trial 1: non_finite output 0: non-finite values"
    dtype = {"name": "candidate", "ok_shape": True, "ok_dtype": False, "detail": "output 0: got torch.float64"}
    assert verdict(facts_with([{"checks": [dtype]}]))["status"] == "incorrect"


def test_verdict_hardened_rules_only_in_hardened_mode():
    mutated = {"mutated_inputs": [1], "checks": [{"name": "candidate", **PASS}]}
    assert verdict(facts_with([mutated, mutated], **TIMING))["status"] == "rejected"
    assert verdict(facts_with([mutated, mutated], **TIMING), mode="kernelbench")["status"] == "correct"


def test_verdict_timeout_and_crash():
    compiled = {"nonce": "n", "complete": False, "compile": {"ok": True, "seconds": 1.0, "has_model_new": True}}
    v = verdict(compiled, timed_out=True)
    assert (v["status"], v["compiled"], v["reason"]) == ("timeout", True, "timeout after 10 s during evaluate")
    v = verdict(None, returncode=-11)
    assert (v["status"], v["reason"]) == ("runtime_error", "crashed during compile: killed by SIGSEGV")


def test_result_without_the_nonce_is_ignored(tmp_path):
    path = tmp_path / "result.json"
    path.write_text('{"nonce": "forged", "complete": true}')
    assert read_facts(path, "expected") is None
    path.write_text('{"nonce": "expected", "complete": true}')
    assert read_facts(path, "expected") == {"nonce": "expected", "complete": True}


def test_cache_key_depends_on_code_env_and_device(monkeypatch):
    cpu = {"device": "cpu"}
    key = build_cache_key("code", cpu)
    assert key == build_cache_key("code", cpu) and len(key) == 32
    assert key != build_cache_key("code2", cpu)
    assert build_cache_key("code", {"device": "cuda", "cuda_arch": "9.0"}) != build_cache_key(
        "code", {"device": "cuda", "cuda_arch": "8.0"}
    )
    monkeypatch.setenv("CXXFLAGS", "-O1")
    assert key != build_cache_key("code", cpu)


def test_a_relative_workdir_works(settings, tmp_path, monkeypatch):
    """The workflow's default results folder is relative; children work inside their own job folders."""
    monkeypatch.chdir(tmp_path)
    relative = {**settings, "build_cache": "cache"}
    verdict = verify_one(REFERENCE, solution("torch_only"), relative, Path("work"))
    assert verdict["status"] == "correct", verdict["reason"]

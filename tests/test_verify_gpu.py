"""The verifier on a CUDA GPU: honest, wrong, faulty and attacking CUDA candidates, in both modes.

Marked `gpu`: skipped without CUDA. Builds run in the compile step (CPU pool), as in the workflow; every check
then loads from the build cache. CONCUR_GPU_REPORT=<folder> leaves the verdict tables there for reading later.
"""

import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from verify_cuda_solutions import solution
from verify_frames import candidates_frame, tasks_frame

from concur.verify import api, compile_frame, verify_frame
from concur.verify.reference import CALL_FLOOR_S, FIRST_CALL_EXTRA_S

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TASK_DIR = Path(__file__).parent / "fixtures" / "verify_cuda"
TASKS = {"relu_add": "task_relu_add.py", "gemm_bias_relu": "task_gemm_bias_relu.py", "triu": "task_triu_matmul.py"}
RELU_ADD = [
    "fast",
    "slow",
    "crawl",
    "wrong",
    "compile_error",
    "illegal_access",
    "hang",
    "side_stream",
    "rotating_streams",
    "slows_the_reference",
    "ghost",
    "alias",
    "deferred",
    "late_handoff",
    "memo_pointer",
    "tamper",
]
# what both modes verify (the rest are hardened-mode attacks)
BOTH = [
    "fast",
    "slow",
    "wrong",
    "compile_error",
    "illegal_access",
    "side_stream",
    "ghost",
    "alias",
    "gemm_bias_relu",
    "triangular",
]
OTHER = [
    ("gemm_bias_relu", "gemm_bias_relu"),
    ("tf32_flag", "gemm_bias_relu"),
    ("fp16_gemm", "gemm_bias_relu"),
    ("triangular", "triu"),
]
SETTINGS = {"device": "cuda", "timeout_s": 300, "workers": 4, "correctness_trials": 5, "warmup": 3, "timing_trials": 50}


def tasks() -> pd.DataFrame:
    return tasks_frame([(t, (TASK_DIR / p).read_text()) for t, p in TASKS.items()])


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def verdicts(cache, tmp_path_factory):
    candidates = candidates_frame(
        [(v, "relu_add", solution(v)) for v in RELU_ADD] + [(v, t, solution(v)) for v, t in OTHER]
    )
    settings = {**SETTINGS, "build_cache": cache}
    builds = compile_frame(candidates, {**settings, "mode": "kernelbench"}, tmp_path_factory.mktemp("c"), False)
    out = {"builds": builds.set_index("candidate_id"), "facts": {}}
    for mode, chosen in (("kernelbench", candidates["candidate_id"].isin(BOTH)), ("hardened", slice(None))):
        api.TRACE_SINK = lambda cid, report, mode=mode: out["facts"].__setitem__((mode, cid), report)
        try:
            table = verify_frame(
                candidates[chosen],
                tasks(),
                {**settings, "mode": mode},
                tmp_path_factory.mktemp(mode),
                False,
                builds=builds,
            )
        finally:
            api.TRACE_SINK = None
        out[mode] = table.set_index("candidate_id")
    loose = candidates[candidates["candidate_id"].isin(["fp16_gemm", "tf32_flag"])]
    out["loose"] = verify_frame(
        loose,
        tasks(),
        {**settings, "mode": "hardened", "atol": 1e-2, "rtol": 1e-2},
        tmp_path_factory.mktemp("loose"),
        False,
        builds=builds,
    ).set_index("candidate_id")
    report = os.environ.get("CONCUR_GPU_REPORT")
    if report:
        for name, table in out.items():
            if name != "facts":
                table.to_csv(Path(report) / f"{name}.csv")
    return out


def test_builds_ran_in_the_compile_step(verdicts):
    builds = verdicts["builds"]
    assert builds.loc["compile_error", "status"] == "compile_error"
    assert "undeclared_value" in builds.loc["compile_error", "reason"]
    assert (builds.drop(index="compile_error")["status"] == "built").all()
    # the exact kernels each build compiled, as the profiler names them
    assert "relu_add_kernel(float const*, float const*, float*, float, long)" in builds.loc["fast", "kernels"]
    assert verdicts["hardened"].loc["fast", "compile_s"] == builds.loc["fast", "compile_s"]  # loaded, not rebuilt


def test_honest_candidates_pass_in_both_modes(verdicts):
    for mode in ("kernelbench", "hardened"):
        table = verdicts[mode]
        for cid in ("fast", "slow", "gemm_bias_relu", "triangular"):
            assert table.loc[cid, "status"] == "correct", (mode, cid, table.loc[cid, "reason"])
        assert table.loc["fast", "speedup"] > 1.2
        assert table.loc["slow", "speedup"] < 0.5
        assert table.loc["fast", "device"].startswith("cuda:")
    # partial replacement (the GEMM stays in cuBLAS) and a kernel that relies on triangular inputs pass hardened
    assert verdicts["hardened"].loc["gemm_bias_relu", "flags"] == ""


def test_wrong_and_faulty_candidates(verdicts):
    for mode in ("kernelbench", "hardened"):
        table = verdicts[mode]
        assert table.loc["wrong", "status"] == "incorrect"
        assert table.loc["compile_error", "status"] == "compile_error"
        assert table.loc["illegal_access", "status"] == "runtime_error"
        assert (
            "CUDA error" in table.loc["illegal_access", "reason"] or "crashed" in table.loc["illegal_access", "reason"]
        )
        assert not table.loc["illegal_access", "reason"].startswith("reference:")
    hang = verdicts["hardened"].loc["hang"]
    assert hang.status == "timeout" and hang.eval_s < 60  # a hang costs its call's deadline, not timeout_s
    # its forward returned at once: the first call's extra time for set-up was not spent waiting on the kernel
    failure = verdicts["facts"][("hardened", "hang")].failure
    assert failure.kind == "timeout" and failure.seconds < CALL_FLOOR_S + FIRST_CALL_EXTRA_S / 2, failure


def test_clearly_slower_kernels_are_timed_by_their_correctness_calls(verdicts):
    """`crawl` (eight threads for 16M elements) runs each correctness call for longer than a timed batch must run
    and many times the reference: those calls, the pool stopped, give its time. `slow` (one warp) is as clearly
    slower, but its calls are shorter than that: timed in batches, as `fast` is."""
    hardened, facts = verdicts["hardened"], verdicts["facts"]
    crawl = facts[("hardened", "crawl")]
    assert hardened.loc["crawl", "status"] == "correct", hardened.loc["crawl", "reason"]
    assert crawl.timing.settled_by == "correctness calls", crawl.timing
    assert hardened.loc["crawl", "new_median_ms"] >= 100.0 and hardened.loc["crawl", "speedup"] < 0.1
    for cid in ("slow", "fast"):
        assert not facts[("hardened", cid)].timing.settled_by and facts[("hardened", cid)].timed.calls
    assert hardened.loc["slow", "speedup"] > hardened.loc["crawl", "speedup"]
    assert facts[("hardened", "fast")].profile.launched_own  # profiled on its first correctness call


def test_hardened_rejects_kernels_that_do_not_do_the_work(verdicts):
    kernelbench, hardened = verdicts["kernelbench"], verdicts["hardened"]
    for cid in ("ghost", "alias"):
        assert kernelbench.loc[cid, "status"] == "correct", cid
    assert hardened.loc["ghost", "reason"].startswith("check:replaced_nothing"), hardened.loc["ghost", "reason"]
    # a kernel named like ATen's is still the candidate's own (exact names), and it replaced nothing
    assert hardened.loc["alias", "reason"].startswith("check:replaced_nothing"), hardened.loc["alias", "reason"]


def test_hardened_counts_work_on_every_stream_and_past_the_reply(verdicts):
    hardened = verdicts["hardened"]
    side = hardened.loc["side_stream"]  # it repeats the fast kernel 20 times on a stream the caller never waits for
    if side.status == "correct":  # ready when read as it returned (its first repeat done by then): all 20 timed
        assert side.speedup < 1.0
    else:
        assert side.status == "incorrect" and side.reason.startswith(("check:not_ready", "check:timed_outputs"))
    rotating = hardened.loc["rotating_streams"]  # a batch's calls overlap; each output whole by the batch's end
    assert rotating.status == "incorrect" and rotating.reason.startswith("check:not_ready: call "), rotating.reason
    deferred = hardened.loc["deferred"]  # joined to the caller's stream; its no-op synchronisation hastens the hand-off
    assert deferred.status in ("correct", "incorrect", "rejected")
    if deferred.status == "correct":
        assert deferred.speedup < 1.0
    if deferred.status == "rejected":  # read whole in time: then the replaced synchronisation is what it is seen by
        assert deferred.reason.startswith("check:tampering"), deferred.reason
    # leaves 30 ms of spinning on the device after each hand-off: drained before the reference's next batch, the wait
    # charged to its own
    slowing = hardened.loc["slows_the_reference"]
    assert slowing.status == "correct", slowing.reason
    assert slowing.speedup < 1.1 * hardened.loc["fast"].speedup, (slowing.speedup, hardened.loc["fast"].speedup)
    late = hardened.loc["late_handoff"]  # computes after the hand-off's answer, before the referee reads
    assert late.status in ("correct", "incorrect"), late.reason
    if late.status == "correct":  # then the referee's reading waited for that work, on the hand-off's clock
        assert late.speedup < 1.25 * hardened.loc["fast"].speedup and "timing:deferred_work" in late.flags


def test_hardened_sees_through_tampering_caching_and_global_flags(verdicts):
    hardened = verdicts["hardened"]
    # a patched timer in the candidate's process measures nothing the referee uses
    tamper, fast = hardened.loc["tamper"], hardened.loc["fast"]
    assert tamper.status == "correct" and tamper.speedup < 1.5 * fast.speedup
    assert hardened.loc["memo_pointer", "status"] == "incorrect"
    # TF32 switched on globally: wrong at float32's tolerance; at a loose one, rejected for the flag itself
    assert hardened.loc["tf32_flag", "status"] == "incorrect"
    loose = verdicts["loose"].loc["tf32_flag"]
    assert loose["status"] == "rejected" and loose["reason"].startswith("check:backend_state:")
    assert "matmul.allow_tf32" in loose["reason"]


def test_lower_precision_is_flagged_by_name(verdicts):
    assert verdicts["hardened"].loc["fp16_gemm", "status"] == "incorrect"  # float32 tolerance (KernelBench's 1e-4)
    loose = verdicts["loose"].loc["fp16_gemm"]
    assert loose["status"] == "correct" and "precision:fp16" in loose["flags"]


def test_faults_change_no_other_verdict(cache, tmp_path):
    """One hang, one illegal address and six honest candidates on one GPU, eight contestants kept ready."""
    rows = [("hang", "relu_add", solution("hang")), ("illegal", "relu_add", solution("illegal_access"))]
    rows += [(f"fast-{i}", "relu_add", solution("fast")) for i in range(3)]
    rows += [
        ("slow", "relu_add", solution("slow")),
        ("gemm", "gemm_bias_relu", solution("gemm_bias_relu")),
        ("triangular", "triu", solution("triangular")),
    ]
    settings = {**SETTINGS, "mode": "hardened", "workers": 8, "build_cache": cache}
    table = verify_frame(candidates_frame(rows), tasks(), settings, tmp_path, False).set_index("candidate_id")
    assert table.loc["hang", "status"] == "timeout" and table.loc["illegal", "status"] == "runtime_error"
    honest = table.drop(index=["hang", "illegal"])
    assert (honest["status"] == "correct").all(), honest[["status", "reason"]]

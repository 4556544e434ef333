"""The verifier on a CUDA GPU: honest, wrong, faulty and cheating CUDA candidates, in both modes.

Marked `gpu`: skipped without CUDA. Builds run in the compile step (CPU pool), as in the workflow; every check
then loads from the build cache.
"""

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from concur.verify import compile_frame, verify_frame
from verify_cuda_solutions import solution
from verify_frames import candidates_frame, tasks_frame

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TASK_DIR = Path(__file__).parent / "fixtures" / "verify_cuda"
TASKS = {"relu_add": "task_relu_add.py", "gemm_bias_relu": "task_gemm_bias_relu.py"}
CANDIDATES = [
    ("fast", "relu_add"), ("slow", "relu_add"), ("wrong", "relu_add"), ("compile_error", "relu_add"),
    ("illegal_access", "relu_add"), ("hang", "relu_add"), ("stale_output", "relu_add"), ("side_stream", "relu_add"),
    ("aten_wrapper", "relu_add"), ("tamper", "relu_add"), ("gemm_bias_relu", "gemm_bias_relu"),
]  # fmt: skip
SETTINGS = {"device": "cuda", "timeout_s": 600, "workers": 3, "correctness_trials": 5, "warmup": 3,
            "timing_trials": 50}  # fmt: skip


def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    candidates = candidates_frame([(variant, task, solution(variant)) for variant, task in CANDIDATES])
    return candidates, tasks_frame([(t, (TASK_DIR / p).read_text()) for t, p in TASKS.items()])


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    candidates, tasks = frames()
    settings = {**SETTINGS, "build_cache": str(tmp_path_factory.mktemp("cache"))}
    builds = compile_frame(candidates, {**settings, "mode": "kernelbench"}, tmp_path_factory.mktemp("c"), False)
    out = {"builds": builds.set_index("candidate_id")}
    hang = candidates["candidate_id"] == "hang"
    for mode in ("kernelbench", "hardened"):
        work = tmp_path_factory.mktemp(mode)
        main = verify_frame(candidates[~hang], tasks, {**settings, "mode": mode}, work, False, builds=builds)
        hung = verify_frame(candidates[hang], tasks, {**settings, "mode": mode, "timeout_s": 30}, work, False,
                            builds=builds)  # fmt: skip
        out[mode] = pd.concat([main, hung]).set_index("candidate_id")
    report = os.environ.get("CONCUR_GPU_REPORT")  # where to leave the verdict tables of a GPU run, for reading later
    if report:
        for name, table in out.items():
            table.to_csv(Path(report) / f"{name}.csv")
    return out


def test_builds_ran_in_the_compile_step(verdicts):
    builds = verdicts["builds"]
    assert builds.loc["compile_error", "status"] == "compile_error"
    assert "undeclared_value" in builds.loc["compile_error", "reason"]
    assert (builds.drop(index="compile_error")["status"] == "built").all()
    hardened = verdicts["hardened"]
    assert hardened.loc["fast", "compile_s"] == builds.loc["fast", "compile_s"]  # loaded, not rebuilt


def test_honest_candidates_pass_in_both_modes(verdicts):
    for mode in ("kernelbench", "hardened"):
        table = verdicts[mode]
        for cid in ("fast", "slow", "gemm_bias_relu"):
            assert table.loc[cid, "status"] == "correct", (mode, cid, table.loc[cid, "reason"])
        assert table.loc["fast", "speedup"] > 1.2
        assert table.loc["slow", "speedup"] < 0.5
        assert table.loc["fast", "device"].startswith("cuda:")


def test_wrong_and_faulty_candidates(verdicts):
    for mode in ("kernelbench", "hardened"):
        table = verdicts[mode]
        assert table.loc["wrong", "status"] == "incorrect"
        assert table.loc["compile_error", "status"] == "compile_error"
        assert table.loc["illegal_access", "status"] == "runtime_error"
        # the fault is the candidate's, reported as a CUDA error (the exact one depends on the address it hit)
        assert "CUDA error" in table.loc["illegal_access", "reason"]
        assert not table.loc["illegal_access", "reason"].startswith("reference:")
        assert (table.loc["hang", "status"], table.loc["hang", "reason"]) == ("timeout", "timeout after 30 s during evaluate")


def test_hardened_catches_what_kernelbench_lets_through(verdicts):
    kernelbench, hardened = verdicts["kernelbench"], verdicts["hardened"]
    for cid in ("aten_wrapper", "tamper", "side_stream"):
        assert kernelbench.loc[cid, "status"] == "correct", cid
    assert hardened.loc["stale_output", "status"] in ("incorrect", "rejected")
    assert hardened.loc["aten_wrapper", "status"] == "rejected"
    assert hardened.loc["aten_wrapper", "reason"].startswith("check:profiler_no_own_kernel")
    assert hardened.loc["tamper", "status"] == "rejected"
    assert "torch.cuda.Event.elapsed_time" in hardened.loc["tamper", "reason"]


def test_side_stream_work_is_timed_in_hardened_mode(verdicts):
    kernelbench, hardened = verdicts["kernelbench"].loc["side_stream"], verdicts["hardened"].loc["side_stream"]
    assert hardened.status == "correct"
    # it repeats the fast kernel 20 times: counted, it cannot beat eager by much
    assert hardened.speedup < 1.0
    assert kernelbench.speedup > 3 * hardened.speedup
    assert "timing:untimed_stream_work" in hardened.flags  # timed device-wide, not on its launching stream
    assert not str(verdicts["hardened"].loc["fast", "flags"]).startswith("timing:")  # one stream: stream times

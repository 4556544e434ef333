"""The hardened verifier against candidates that attack it (CPU variants; tests/verify_attacks.py writes them).

Every attack gets past the static screen, so what stops it is the process boundary, the referee's own checks and
clock, or the sandbox. Where an attack computes the honest answer only if it failed, `correct` proves the defence.
One build of each program, then one hardened run over all of them on a task big enough to time (1M elements).
"""

import os
from pathlib import Path

import pytest
from verify_attacks import VARIANTS, solution
from verify_frames import candidates_frame, tasks_frame

from concur.verify import compile_frame, sandbox, verify_frame

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
NAMES = ("relu_add_large", "relu_add", "relu_rand", "relu_add_in_place")
TASKS = {name: (FIXTURES / f"task_{name}.py").read_text() for name in NAMES}
SETTINGS = {"device": "cpu", "mode": "hardened", "timeout_s": 300, "workers": 1, "correctness_trials": 3,
            "signed_trials": 2, "warmup": 1, "timing_min_s": 0.05}  # fmt: skip
ON_SMALL = {  # programs aimed at a particular task
    "identity": "relu_rand",
    "one_lazy_call": "relu_add",
    "pipelined": "relu_add",
    "in_place_as_the_reference": "relu_add_in_place",
    "in_place_elsewhere": "relu_add_in_place",
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    rows = [(name, ON_SMALL.get(name, "relu_add_large"), solution(name)) for name in VARIANTS]
    candidates, tasks = candidates_frame(rows), tasks_frame(list(TASKS.items()))
    settings = {**SETTINGS, "build_cache": str(tmp_path_factory.mktemp("cache"))}
    builds = compile_frame(candidates, settings, tmp_path_factory.mktemp("compile"), progress=False)
    assert set(builds["status"]) == {"built"}, builds[["candidate_id", "status", "reason"]]
    table = verify_frame(candidates, tasks, settings, tmp_path_factory.mktemp("verify"), False, builds=builds)
    loose = candidates[candidates["candidate_id"].isin(["precision_bf16", "precision_when_timed", "honest"])]
    lenient = verify_frame(loose, tasks, {**settings, "atol": 5e-2, "rtol": 5e-2}, tmp_path_factory.mktemp("lenient"),
                           False, builds=builds)  # fmt: skip
    return table.set_index("candidate_id"), lenient.set_index("candidate_id")


def status(verdicts, name: str) -> tuple[str, str]:
    row = verdicts[0].loc[name]
    return row["status"], row["reason"]


def test_honest_kernels_pass(verdicts):
    table = verdicts[0]
    for name in ("honest", "honest_partial"):  # the addition left in torch is a partial replacement, not a ghost
        assert table.loc[name, "status"] == "correct", table.loc[name, "reason"]
        assert table.loc[name, "speedup"] > 0 and table.loc[name, "trusted"]
        assert not [f for f in table.loc[name, "flags"].split(",") if f.startswith(("precision:", "timing:beats"))]


def test_forged_replies_and_result_files_change_nothing(verdicts):
    assert status(verdicts, "forge_replies") == ("rejected", "check:protocol: during correctness: a reply that does "
                                                              "not answer the command sent")  # fmt: skip


def test_outputs_that_lie_about_themselves_are_refused(verdicts):
    for name in ("tensor_subclass", "lazy_output"):  # only bytes cross; a non-plain tensor is refused by type
        assert status(verdicts, name)[0] == "rejected"
        assert status(verdicts, name)[1].startswith("check:output_type"), name


@pytest.mark.parametrize("name", ["patch_reference", "global_hooks", "gc_steal", "frame_walk", "stale_output"])
def test_nothing_of_the_reference_lives_in_the_candidates_process(verdicts, name):
    """Patching torch, hooking modules, walking gc or frames, reading freed memory: the reference and its outputs
    are in other processes, so each of these computes a wrong answer."""
    assert status(verdicts, name)[0] == "incorrect", status(verdicts, name)


def test_the_candidates_own_clocks_and_statistics_are_not_used(verdicts):
    table = verdicts[0]
    assert table.loc["patch_statistics", "status"] == "correct"
    assert table.loc["patch_statistics", "speedup"] < 20  # the honest kernel's speedup, measured by the referee


def test_caching_and_counting_calls_do_not_pay(verdicts):
    assert status(verdicts, "memo_pointer")[0] == "incorrect"  # the same address, new values: a stale answer
    assert status(verdicts, "call_counting") == (
        "incorrect", status(verdicts, "call_counting")[1]) and status(verdicts, "call_counting")[1].startswith(
        "check:timed_outputs")  # fmt: skip
    # one wrong call among the hundreds of the timed batches (64 calls each on this small task): every call's
    # outputs are checked, not only the few read on the hand-off's clock
    lazy = status(verdicts, "one_lazy_call")
    assert lazy[0] == "incorrect" and lazy[1].startswith("check:timed_outputs"), lazy
    memo = verdicts[0].loc["memo_content"]  # inputs never repeat: the cache never hits, the time is its own
    assert memo["status"] == "correct" and memo["speedup"] < 20


def test_work_after_the_reply_is_wrong_or_counted(verdicts):
    row = verdicts[0].loc["background_thread"]
    assert row["status"] == "incorrect" or (row["status"] == "correct" and "timing:deferred_work" in row["flags"])


def test_the_reference_is_timed_with_the_candidate_stopped(verdicts):
    """The two sides take turns; slows_the_reference keeps every core it may use busy from each hand-off until its
    next batch, which would slow the reference's batches between them: its processes are stopped meanwhile. On two
    shared cores honest speedups here read 0.9-1.6 from run to run, and this attack 0.7-1.25 stopped, up to 5.4
    unstopped: the bound is its honest twin's, twice, the better of its two readings (one job on a shared core can
    read low: 0.75 once, beside this attack's 1.97)."""
    table = verdicts[0]
    assert table.loc["slows_the_reference", "status"] == "correct", table.loc["slows_the_reference", "reason"]
    honest = max(table.loc["honest", "speedup"], verdicts[1].loc["honest", "speedup"])
    assert table.loc["slows_the_reference", "speedup"] < 2.0 * honest, honest


def test_a_call_is_done_only_when_its_outputs_are_ready(verdicts):
    """pipelined finishes each call's output during the next call, and the last call of a batch at once: every output
    is whole at the hand-off, so only a call read as it returned (contestant.take) shows it. On the small task, whose
    batches hold dozens of calls even on a loaded machine: in a batch of one call it does all the work in its call."""
    found = status(verdicts, "pipelined")
    assert found[0] == "incorrect" and found[1].startswith("check:not_ready: call "), found


def test_nothing_can_be_computed_before_the_clock(verdicts):
    """work_in_prepare computes every output in the harness's `prepare`, which runs before the referee's clock:
    the inputs are written into the arena only after it, on the clock, so what it computed there is stale."""
    early = verdicts[0].loc["work_in_prepare"]
    assert early["status"] == "incorrect" and early["reason"].startswith("check:timed_outputs"), early["reason"]


def test_kernels_that_do_not_do_the_work_are_rejected(verdicts):
    assert status(verdicts, "ghost") == (
        "rejected", "check:replaced_nothing: ModelNew still runs every operator the reference runs (4)")  # fmt: skip
    assert status(verdicts, "never_calls_kernel") == (
        "rejected", "check:kernel_not_called: forward never called into the compiled extension")  # fmt: skip


def test_global_settings_are_checked(verdicts):
    assert status(verdicts, "backend_flags") == ("rejected", "check:backend_state: num_threads changed")


def test_inputs_are_checked_unchanged_and_drawn_to_both_signs(verdicts):
    assert status(verdicts, "mutates_input") == ("rejected", "check:input_mutation: ModelNew changed input(s) [0]")
    # where the reference itself adds into x, a kernel may too, and only there
    assert status(verdicts, "in_place_as_the_reference") == ("correct", "")
    elsewhere = ("rejected", "check:input_mutation: ModelNew changed input(s) [1]")
    assert status(verdicts, "in_place_elsewhere") == elsewhere
    identity = verdicts[0].loc["identity"]  # right on [0, 1) inputs only
    assert identity["status"] == "incorrect" and identity["reason"].startswith("check:signed_inputs: trial 4")
    assert identity["flags"] == "degenerate_task:identity" and not identity["trusted"]


def test_lower_precision_fails_a_float32_tolerance_and_is_flagged_under_a_loose_one(verdicts):
    assert status(verdicts, "precision_bf16")[0] == "incorrect"
    lenient = verdicts[1].loc["precision_bf16"]
    assert lenient["status"] == "correct" and "precision:bf16" in lenient["flags"]


def test_lower_precision_on_timed_calls_only_is_judged_on_a_timed_call(verdicts):
    """Float32 on the correctness trials, bfloat16 on the timed calls: one timed call, drawn in secret, is checked
    whole and against the float64 reference, so at float32's tolerance it fails there and under a loose one it is
    flagged. The honest kernel, judged the same way, keeps a clean verdict."""
    got, reason = status(verdicts, "precision_when_timed")
    assert got == "incorrect" and reason.startswith("check:timed_outputs"), reason
    lenient = verdicts[1]
    assert lenient.loc["precision_when_timed", "status"] == "correct"
    assert "precision:bf16" in lenient.loc["precision_when_timed", "flags"]
    assert lenient.loc["honest", "status"] == "correct" and "precision:" not in lenient.loc["honest", "flags"]


@pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (signal scoping)")
@pytest.mark.parametrize("name", ["write_files", "signal_others", "snoop_processes"])
def test_the_sandbox_holds(verdicts, name):
    """Each of these is honest only if every write, signal or read it attempted outside its sandbox was refused."""
    assert status(verdicts, name)[0] == "correct", status(verdicts, name)


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no seccomp filter here")
def test_no_candidate_reaches_the_network_or_hides_its_children(verdicts):
    """reach_network is honest only if it could not make one IPv4 or IPv6 socket, UDP or TCP; unseen_children only
    if it could set no action for SIGCHLD (its helpers' CPU time would vanish at their exit)."""
    for name in ("reach_network", "unseen_children"):
        assert status(verdicts, name)[0] == "correct", status(verdicts, name)


def test_the_verifiers_code_is_unchanged(verdicts):
    planted = Path(__import__("concur.verify.verdict").verify.verdict.__file__).with_name("planted.py")
    assert not planted.exists()


def test_nothing_outlives_its_evaluation(verdicts):
    """escape_daemon left a process in a new session, reparented away from it: the zygote reaped it.
    escape_parent could not start a process outside its own tree (honest only if every attempt was refused)."""
    assert verdicts[0].loc["escape_daemon", "status"] == "correct"
    assert status(verdicts, "escape_parent")[0] == "correct", status(verdicts, "escape_parent")

    daemons = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").endswith("(deleted)") and "zygote" in open(
                        f"/proc/{entry}/cmdline").read():  # fmt: skip
                    daemons.append(entry)
            except OSError:
                pass
    assert daemons == []


def test_the_reference_run_where_unprofiled_is_seen_on_a_timed_call(verdicts):
    """The profiler reads the first correctness call and one more drawn among the timed ones: a candidate whose own
    kernel runs only on the first has replaced nothing on the other."""
    got, reason = status(verdicts, "reference_when_unprofiled")
    assert (got, reason.split(":")[:2]) == ("rejected", ["check", "replaced_nothing"]), reason

"""The verifier's rules on their own, without processes: the check table, the timing rules, what crosses between
processes, the degenerate probe, KernelBench's seeds, and the sandbox (in a forked child)."""

import contextlib
import math
import os
import random
import socket
import statistics
import struct
import threading
import time
import types

import pytest
import torch

from concur.verify import comparisons, doorbell, exchange, modes, procs, sandbox, timing, verdict
from concur.verify.evaluation import trial_plan
from concur.verify.report import Comparison, Report, Times, Trial

PASS = {"ok_shape": True, "ok_dtype": True, "ok_finite": True, "allclose": True, "max_abs_err": 0.001}
TIMING = {"ref": {"mean_ms": 3.0, "median_ms": 2.5}, "new": {"mean_ms": 1.5, "median_ms": 1.0}}
LOADED = {"ok": True, "has_class": True, "error": None}


COMPARED = ("ok_shape", "ok_dtype", "ok_finite", "allclose", "max_abs_err", "detail")


def trial(found: dict) -> dict:
    """A trial as plain report data: its comparison's keys under `comparison`."""
    compared = {k: v for k, v in found.items() if k in COMPARED}
    return {**{k: v for k, v in found.items() if k not in COMPARED}, "comparison": compared or None}


def facts(**extra) -> Report:
    base = {"device": "cpu", "load": LOADED, "trials": [{"number": 1, "kind": "random", **PASS}], "timing": TIMING}
    data = {**base, **extra}
    return Report.from_data({**data, "trials": [trial(t) for t in data["trials"]]})


# ---------------------------------------------------------------- the check table


def test_an_honest_run_is_correct_in_both_modes():
    assert verdict.judge(facts(), "hardened") == ("correct", "")
    assert verdict.judge(facts(), "kernelbench") == ("correct", "")


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"failure": {"kind": "timeout", "stage": "correctness", "seconds": 15.0, "detail": ""}},
         ("timeout", "timeout after 15 s during correctness")),
        ({"failure": {"kind": "memory", "stage": "timing", "seconds": 0, "detail": "out of memory: 9 MB"}},
         ("runtime_error", "killed during timing: out of memory: 9 MB")),
        ({"failure": {"kind": "protocol", "stage": "load", "seconds": 0, "detail": "forged"}},
         ("rejected", "check:protocol: during load: forged")),
        ({"reference_error": "RuntimeError: boom"}, ("runtime_error", "reference: RuntimeError: boom")),
        ({"load": {"ok": False, "syntax_error": True, "error": "SyntaxError: x (line 1)"}},
         ("compile_error", "SyntaxError: x (line 1)")),
        ({"load": {"ok": True, "has_class": False}}, ("runtime_error", "no ModelNew")),
        ({"trials": [{"number": 1, "kind": "random", "error": "ValueError: no"}]}, ("runtime_error", "ValueError: no")),
        ({"trials": [{"number": 2, "kind": "signed", **PASS, "allclose": False, "max_abs_err": 0.5}]},
         ("incorrect", "check:signed_inputs: trial 2: value_mismatch max_abs_err=0.5")),
        ({"timed": {"mismatch": "call 7: value_mismatch max_abs_err=1"}},
         ("incorrect", "check:timed_outputs: call 7: value_mismatch max_abs_err=1")),
        ({"timed": {"unready": "call 9: output 0 was not ready"}},
         ("incorrect", "check:not_ready: call 9: output 0 was not ready")),
        ({"state": {"backend_changed": ["matmul.allow_tf32"], "tampered": []}},
         ("rejected", "check:backend_state: matmul.allow_tf32 changed")),
        ({"counted_modules": 1, "kernel_calls": 0},
         ("rejected", "check:kernel_not_called: forward never called into the compiled extension")),
    ],
)  # fmt: skip
def test_the_first_failing_check_decides(extra, expected):
    assert verdict.judge(facts(**extra), "hardened") == expected


def test_hardened_checks_do_not_apply_in_kernelbench_mode():
    mutated = facts(trials=[{"number": 1, "kind": "random", **PASS, "mutated": [0]}])
    assert verdict.judge(mutated, "hardened") == ("rejected", "check:input_mutation: ModelNew changed input(s) [0]")
    assert verdict.judge(mutated, "kernelbench") == ("correct", "")


def test_kernel_identity_rules():
    own = {"device": "cuda", "names": {"mine": 1, "gemm": 1}, "own": ["mine"], "launched_own": ["mine"],
           "reference": {"gemm": 1, "relu": 1}}  # fmt: skip
    assert verdict.judge(facts(profile=own), "hardened") == ("correct", "")  # the GEMM kept, relu replaced
    ghost = {**own, "names": {"mine": 1, "gemm": 1, "relu": 1}}
    assert verdict.judge(facts(profile=ghost), "hardened")[1].startswith("check:replaced_nothing")
    none = {**own, "launched_own": []}
    assert verdict.judge(facts(profile=none), "hardened")[1].startswith("check:profiler_no_own_kernel")
    # on the CPU only computing operators count: allocating and viewing like the reference is fine
    cpu = {"device": "cpu", "names": {"aten::empty_like": 2, "aten::view": 1}, "own": None, "launched_own": [],
           "reference": {"aten::add": 1, "aten::relu": 1, "aten::empty_like": 1}}  # fmt: skip
    assert verdict.judge(facts(profile=cpu), "hardened") == ("correct", "")


def test_threads_are_checked_on_the_cpu():
    busy = facts(timing={**TIMING, "cores": 3.2, "cores_allowed": 1})
    assert verdict.judge(busy, "hardened") == ("rejected", "check:threads: used 3.2 cores while timed, 1 allowed")


def test_flags_name_what_a_person_should_look_at():
    settings = {"audit_speedup": 10.0, "mode": "hardened"}
    marks = verdict.flags(
        facts(precision={"e_ref": 1e-7, "e_new": 3e-3}, timing={**TIMING, "deferred": True}, sandbox="none"),
        12.0, settings, "at::BFloat16 b = x.to(torch::kBFloat16);",
    )  # fmt: skip
    assert marks == ["audit:speedup>10", "precision:bf16", "timing:deferred_work", "sandbox:none"]
    honest = verdict.flags(facts(precision={"e_ref": 1e-7, "e_new": 2e-7}), 2.0, settings, "float")
    assert honest == []


def test_what_needs_no_process_is_decided_before_any_runs():
    """No code, the static screen (hardened only: a pure-PyTorch ModelNew is KernelBench's to run), and a build
    that ended the job decide the verdict before a referee sees the candidate; a build that succeeded does not."""
    torch_only = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    hardened, kernelbench = {"mode": "hardened"}, {"mode": "kernelbench"}
    assert verdict.before_run("  \n", None, kernelbench) == ("no_code", "no code block in the answer")
    assert verdict.before_run(torch_only, None, hardened) == ("rejected", "screen:no_custom_kernel")
    assert verdict.before_run(torch_only, None, kernelbench) is None
    failed = {"status": "compile_error", "reason": 'cuda.cu(3): error: expected a ";"'}
    assert verdict.before_run(torch_only, failed, kernelbench) == ("compile_error", failed["reason"])
    assert verdict.before_run(torch_only, {"status": "built", "reason": ""}, kernelbench) is None


def test_a_report_crosses_as_json_and_comes_back_whole():
    """The referee sends its report as JSON on its socket: every nested type, NaN and infinite values included,
    comes back as it was; a report of a job that stopped early keeps the defaults of what it never reached."""
    import json

    from concur.verify.report import Baseline, Comparison, Failure, Load, Precision, Profile, State, Timed, Timing

    times = Times(1.0, 0.9, 0.8, True, 0.01, 0.02, 12)
    full = Report(
        device="cuda:H100",
        sandbox="landlock",
        load=Load(ok=True, has_class=True, load_calls=1, load_s=0.5),
        counted_modules=1,
        kernel_calls=3,
        trials=[Trial(1, "random", comparison=Comparison(True, True, True, False, math.inf, "output 0")),
                Trial(2, "signed", skipped="reference output not finite on these inputs")],
        precision=Precision(1e-7, 2e-7),
        precision_timed=Precision(skipped="too large or no floating output"),
        timing=Timing(times, Times(best_ms=0.4, resolved=False), calls_per_batch=64),
        timed=Timed(calls=640, signed=180, mismatch="", mutated=[1], profiled=True),
        profile=Profile("cuda", {"mine": 2}, {"gemm": 1}, ["mine"], ["mine"]),
        state=State(["matmul.allow_tf32"], []),
        degenerate=["other_inputs"],
        baselines={"compile": Baseline(times, "", 12.0), "compile-max-autotune": Baseline(error="differ")},
        floor_ms=0.01,
        trace={"stage_s": {"load": 0.1}},
    )  # fmt: skip
    again = Report.from_data(json.loads(json.dumps(full.to_data())))
    assert json.dumps(again.to_data()) == json.dumps(full.to_data())  # NaN fields: no == on the objects
    assert isinstance(again.trials[0].comparison, Comparison) and isinstance(again.baselines["compile"].ref, Times)
    assert again.timing.ref == full.timing.ref and again.profile == full.profile and again.timed == full.timed
    assert math.isinf(again.trials[0].comparison.max_abs_err)
    assert math.isnan(again.precision_timed.e_new) and again.timing.cores_allowed == math.inf
    stopped = Report.from_data(json.loads(json.dumps(Report(failure=Failure("timeout", "load", "", 15.0)).to_data())))
    assert stopped.failure == Failure("timeout", "load", "", 15.0) and stopped.trials == [] and stopped.load is None
    assert verdict.judge(stopped, "hardened") == ("timeout", "timeout after 15 s during load")


def test_a_trial_that_settles_the_verdict_stops_the_trials_by_the_same_table():
    """The referee stops at the first trial that fails the verdict (verdict.trial_settles): a failed comparison or an
    error in both modes, a changed input only where the mode's checks say it is a failure."""
    passed = Trial(1, "random", comparison=Comparison(True, True, True, True, 0.0))
    assert not verdict.trial_settles(passed, "hardened") and not verdict.trial_settles(passed, "kernelbench")
    wrong = Trial(1, "random", comparison=Comparison(True, True, True, False, 0.5))
    assert verdict.trial_settles(wrong, "hardened") and verdict.trial_settles(wrong, "kernelbench")
    changed = Trial(1, "random", mutated=[0], comparison=passed.comparison)
    assert verdict.trial_settles(changed, "hardened") and not verdict.trial_settles(changed, "kernelbench")
    assert not verdict.trial_settles(Trial(2, "signed", skipped="reference output not finite"), "hardened")
    unready = Trial(1, "random", unready="output 0 was not ready", comparison=passed.comparison)
    assert verdict.trial_settles(unready, "hardened") and not verdict.trial_settles(unready, "kernelbench")
    found = verdict.judge(
        facts(trials=[{"number": 1, "kind": "random", **PASS, "unready": "output 0 was not ready"}]), "hardened"
    )
    assert found == ("incorrect", "check:not_ready: trial 1: output 0 was not ready")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.int64])
def test_outputs_read_as_their_call_returned_must_not_change_after(dtype):
    """comparisons.unready: the elements the contestant read as a call returned (as integer words of the element's
    size, contestant.take) against the same elements handed off, bit for bit, whatever the dtype or layout."""
    from concur.verify.contestant import TAKEN_POSITIONS, WORDS

    out = (torch.randn(40, 30) * 3).to(dtype).t()  # not contiguous
    where = torch.randint(out.numel(), (TAKEN_POSITIONS,))
    seen = exchange.hex_bytes(torch.take(out.view(getattr(torch, WORDS[out.element_size()])), where))
    taken = [[0, 0, where.tolist(), seen]]
    assert comparisons.unready(taken, [[out]]) == ""
    later = out.contiguous().clone()
    flat = later.view(-1)
    flat[where[0]] = ~flat[where[0]] if dtype == torch.bool else flat[where[0]] + 1
    assert comparisons.unready(taken, [[later]], first=5).startswith("call 5: output 0 was not ready")
    for forged in ([[0, 1, [0], seen]], [[0, 0, [out.numel()], seen]], [[0, 0, [], ""]], [["x"]], "x"):
        assert "names no output" in comparisons.unready(forged, [[out]]) or "not a list" in comparisons.unready(
            forged, [[out]]
        )


# ---------------------------------------------------------------- comparisons and the probe


def test_tolerance_follows_kernelbench_unless_set():
    assert comparisons.tolerance("torch.float32", {}) == (1e-4, 1e-4)
    assert comparisons.tolerance("torch.bfloat16", {"atol": None}) == (1e-2, 1e-2)
    assert comparisons.tolerance("torch.int64", {}) == (0.0, 0.0)
    assert comparisons.tolerance("torch.float32", {"atol": 1e-2, "rtol": 1e-3}) == (1e-2, 1e-3)


def test_two_calls_are_identical_only_bit_for_bit_with_nan_where_both_have_it():
    """comparisons.identical decides whether a reference draws random numbers (reference.stochastic) and whether a
    task's program keeps state (the tasks stage): a deterministic NaN output is the same answer twice, and a NaN
    against a number, or infinity against the largest float, is not."""
    nan, big = float("nan"), torch.finfo(torch.float32).max
    out = torch.tensor([1.0, nan, float("inf")])
    assert comparisons.identical([out, 2, nan], [out.clone(), 2, nan])
    assert not comparisons.identical([out], [torch.tensor([1.0, 0.0, float("inf")])])
    assert not comparisons.identical([out], [torch.tensor([1.0, nan, big])])
    assert not comparisons.identical([torch.tensor([1, 2])], [torch.tensor([1, 3])])
    assert not comparisons.identical([torch.zeros(2)], [torch.zeros(2, dtype=torch.float64)])
    assert not comparisons.identical([out], [out, out]) and not comparisons.identical([1.0], [torch.ones(1)])


def test_nan_never_passes_and_inf_fails_only_in_hardened():
    ref = [torch.tensor([1.0, float("inf"), float("nan")])]
    assert not comparisons.compare([ref[0].clone()], ref, {}, strict_finite=False).allclose  # NaN != NaN
    ref_inf = [torch.tensor([1.0, float("inf")])]
    assert comparisons.compare([ref_inf[0].clone()], ref_inf, {}, strict_finite=False).allclose
    assert not comparisons.compare([ref_inf[0].clone()], ref_inf, {}, strict_finite=True).ok_finite


def test_signed_trials_measure_rounding_against_the_outputs_scale():
    """Honest: a long matmul over signed inputs summed sequentially in float32 (as a naive kernel does) differs from
    the blocked reference by rounding alone, above an element-wise tolerance where sums cancel. Attack: a kernel
    that drops the negative products (assumes non-negative inputs, as `torch.rand` draws are)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(64, 262144, generator=g) * 2 - 1, torch.rand(262144, 64, generator=g) * 2 - 1
    ref = [a @ b]
    sequential = torch.zeros(64, 64)
    for start in range(0, 262144, 64):  # float32 partial sums in another order
        sequential += a[:, start : start + 64] @ b[start : start + 64]
    assert not comparisons.compare([sequential], ref, {}, strict_finite=True).allclose
    assert comparisons.compare([sequential], ref, {}, strict_finite=True, leaf_scale=True).allclose
    positive_only = (a.clamp(min=0) @ b.clamp(min=0)) + (a.clamp(max=0) @ b.clamp(max=0))
    assert not comparisons.compare([positive_only], ref, {}, strict_finite=True, leaf_scale=True).allclose
    off_by_one_element = ref[0].clone()
    off_by_one_element[3, 5] += 0.05 * ref[0].abs().max()
    assert not comparisons.compare([off_by_one_element], ref, {}, strict_finite=True, leaf_scale=True).allclose


def test_comparisons_run_chunk_by_chunk(monkeypatch):
    monkeypatch.setattr(comparisons, "CHUNK", 7)
    a = torch.randn(100)
    b = a.clone()
    b[93] += 1.0
    result = comparisons.compare([b], [a], {}, strict_finite=True)
    assert not result.allclose and result.max_abs_err == pytest.approx(1.0)


def test_degenerate_guesses():
    x = torch.rand(64, 64)
    assert comparisons.degenerate_kinds([torch.relu(x)], [x], None, {}) == {"identity"}
    assert comparisons.degenerate_kinds([torch.zeros(10)], [torch.randn(10)], None, {}) == {"zeros", "constant"}
    constant = torch.full((10,), 3.0)
    assert comparisons.degenerate_kinds([constant], [x], [constant.clone()], {}) == {"constant", "other_inputs"}
    found = [{"identity", "zeros"}, {"identity", "other_inputs"}, {"identity"}]
    assert comparisons.degenerate_everywhere(found) == ["identity"]  # other_inputs failed on the third trial
    assert comparisons.degenerate_everywhere([{"zeros"}]) == ["zeros"]  # other_inputs needs a second trial


def test_trial_plan_matches_kernelbench_seeds():
    torch.manual_seed(42)
    expected = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
    plan = trial_plan({"mode": "kernelbench", "correctness_trials": 5, "signed_trials": 2})
    assert [s for _, s, _ in plan] == expected and {k for _, _, k in plan} == {"random"}
    hardened = trial_plan({"mode": "hardened", "correctness_trials": 5, "signed_trials": 2})
    assert [k for _, _, k in hardened] == ["random"] * 5 + ["signed"] * 2
    assert [s for _, s, _ in hardened][:5] != expected  # secret seeds


# ---------------------------------------------------------------- timing rules


def test_batch_size_fills_a_few_milliseconds_within_memory():
    assert timing.batch_size(0.5, 1 << 20, 1 << 20, 1 << 30) == round(timing.TARGET_BATCH_MS / 0.5)
    assert timing.batch_size(2 * timing.TARGET_BATCH_MS, 1 << 20, 1 << 20, 1 << 30) == 1
    assert timing.batch_size(0.001, 1 << 10, 1 << 10, 1 << 30) == timing.MAX_BATCH
    assert timing.batch_size(0.1, 1 << 29, 1 << 29, 1 << 30) == 1  # memory first


def test_batches_grow_until_the_clock_resolves_them():
    # a 50 us call: TARGET_BATCH_MS alone asks 200 calls; a jittery round trip (1.6 ms between the 20th and 80th
    # percentile) asks SIZE_FACTOR x 1.6 ms = 32 ms of work, 640 calls; a 5 us call then asks more than MAX_BATCH
    assert timing.batch_size(0.05, 4096, 4096, 1 << 34) == 200
    jitter = timing.jitter_ms([1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.0, 3.1, 3.2, 9.0])
    assert jitter == pytest.approx(3.1 - 1.5)
    assert timing.batch_size(0.05, 4096, 4096, 1 << 34, timing.sized_ms(jitter)) == 640
    assert timing.batch_size(0.005, 4096, 4096, 1 << 34, timing.sized_ms(jitter)) == timing.MAX_BATCH


def test_a_grown_batch_leaves_a_slow_candidate_the_time_a_call_had():
    from types import SimpleNamespace

    from concur.verify.reference import CALL_FLOOR_S, FLOOR_CALLS, call_timeout

    task = SimpleNamespace(call_ms=0.036)  # a 36 us reference: its batches grow to about 280 calls
    per_call = call_timeout(task, FLOOR_CALLS) / FLOOR_CALLS
    assert call_timeout(task, FLOOR_CALLS) == CALL_FLOOR_S
    assert call_timeout(task, 280) / 280 == pytest.approx(per_call)  # a 400x slower honest kernel is not cut off
    assert call_timeout(SimpleNamespace(call_ms=-0.001), 1) == CALL_FLOOR_S  # a call the clock read as nothing
    assert timing.jitter_ms([0.2] * 11) == timing.JITTER_FLOOR_MS  # never below the clock's own floor


def test_a_time_the_clock_cannot_resolve_is_never_a_speedup():
    resolve = timing.resolvable_ms(0.05)  # 0.2 ms: 4 jitters of 0.05 ms
    # the reference: batches of 64 calls of 0.01 ms, 0.64 ms net each: resolved
    reference = timing.summary([0.01] * 10, calls=64, resolve_ms=resolve)
    assert reference.resolved
    # nothing left after the round trip: read as zero or below, not floored to a tiny positive time
    zero = timing.summary(timing.per_call_times([0.50, 0.49, 0.51], overhead_ms=0.5, calls=64), calls=64)
    assert not zero.resolved and zero.best_ms <= 0
    assert math.isnan(timing.speedup(reference, zero))
    # a candidate 1,000x quicker on the same batches: 0.64 us a batch, under the clock's resolution
    quick = timing.summary([1e-5] * 10, calls=64, resolve_ms=resolve)
    assert not quick.resolved and math.isnan(timing.speedup(reference, quick))
    # an honest 4x kernel on the same batches: 0.16 ms a batch... under 0.2 ms: unresolved too, unless batches grow
    assert not timing.summary([0.0025] * 10, calls=64, resolve_ms=resolve).resolved
    honest = timing.summary([0.0025] * 10, calls=256, resolve_ms=resolve)  # the batch sized for the reference
    assert honest.resolved and timing.speedup(reference, honest) == pytest.approx(4.0)


def test_an_unresolved_time_is_flagged_on_the_verdict():
    found = Report.from_data({"timing": {"ref": {"resolved": True}, "new": {"resolved": False}}})
    settings = {"audit_speedup": 10.0, "mode": "hardened"}
    marks = verdict.flags(found, math.nan, settings, "")
    assert "timing:unresolved" in marks and not any(m.startswith("audit:") for m in marks)
    found.timing.new.resolved = True
    assert "timing:unresolved" not in verdict.flags(found, 2.0, settings, "")


def test_a_time_quicker_than_writing_the_outputs_is_flagged():
    """Honest: an elementwise kernel at the fill's own speed, or up to twice as fast (a write a little better than a
    fill, the floor's noise), keeps its verdict unflagged. Attack: calls merged or overlapped until a call costs a
    tenth of writing its outputs once."""
    floor = 0.010  # ms a call: one launch writing the task's outputs
    settings = {"audit_speedup": 10.0, "mode": "hardened"}
    for best, flagged in ((0.012, False), (0.0051, False), (0.001, True)):
        found = {"timing": {"ref": {"resolved": True}, "new": {"resolved": True, "best_ms": best}}, "floor_ms": floor}
        assert ("timing:beats_roofline" in verdict.flags(Report.from_data(found), 2.0, settings, "")) is flagged, best
    # no floor (outputs without tensor bytes, or a verdict from before it was measured), or a time already unresolved
    assert not timing.beats_roofline(Times(resolved=True, best_ms=1e-6), None)
    assert not timing.beats_roofline(Times(resolved=False, best_ms=1e-6), floor)
    # honest: a task whose reference writes nothing of its own (it returns a view of its input) takes no floor
    view = Times(resolved=True, best_ms=0.0004)
    assert not timing.beats_roofline(Times(resolved=True, best_ms=0.0003), floor, view)
    assert timing.beats_roofline(Times(resolved=True, best_ms=0.0003), floor, Times(resolved=True, best_ms=0.02))


def test_the_references_hotspots_name_where_its_time_goes():
    from concur.verify.reference import hotspots

    times = {"aten::addmm": 60.0, "aten::relu": 30.0, "aten::t": 6.0, "aten::add": 3.0, "aten::mul": 1.0, "x": 0.5}
    assert hotspots(times, top=2) == "aten::addmm 60%; aten::relu 30%"
    assert hotspots({}) == "" and hotspots({"k": 0.0}) == ""


def test_the_write_floor_is_measured_and_scaled_past_its_cap(monkeypatch):
    from types import SimpleNamespace

    from concur.verify import reference

    referee = SimpleNamespace(torch=torch, device="cpu")
    small = reference.write_floor_ms(referee, 1 << 20, 16)
    assert 0 < small < 50.0
    assert reference.write_floor_ms(referee, 0, 16) is None  # nothing a call must write
    monkeypatch.setattr(reference, "FLOOR_MAX_BYTES", 1 << 20)
    big = reference.write_floor_ms(referee, 64 << 20, 4)  # filled to 1 MiB, scaled 64 times
    assert big > 8 * small


def test_work_deferred_to_the_hand_off_is_counted():
    reference = [0.10] * 10
    per_call = timing.per_call_times([1.0] * 10, overhead_ms=0.2, calls=4)
    honest = timing.summary(per_call, timing.charged(per_call, [[0.10] * 10], [reference], 4))
    assert honest.best_ms == pytest.approx(0.2)
    # replied early (forward 0.3 ms) and finished the work in the hand-off (1.0 ms): the excess is its time
    early = timing.per_call_times([0.3] * 10, overhead_ms=0.2, calls=4)
    cheat = timing.summary(early, timing.charged(early, [[1.0] * 10], [reference], 4))
    allowed = (1 + timing.COPY_SLACK) * 0.10  # the hand-off's own drift between two stretches
    assert cheat.best_ms == pytest.approx((0.3 - 0.2 + 1.0 - allowed) / 4)
    assert cheat.copy_excess_ms == pytest.approx((1.0 - allowed) / 4)
    assert timing.deferred([1.0] * 10, reference, [0.3] * 10)
    assert not timing.deferred([0.101] * 10, reference, [1.0] * 10)


def test_a_batchs_clocked_spans_meet_however_long_the_referee_is_held_up_between_them(monkeypatch):
    """The hand-off's clock starts where the forward's stopped: a referee held up between the two (its core
    preempted, or its reading of the contestant's CPU clock slowed by thousands of the contestant's threads: 0.2 ms
    a read with 8,000) leaves no time in which work deferred past the forward's ring runs untimed, which the quickest
    batch would reward. The writing, forward and hand-off together cover the whole batch."""
    from types import SimpleNamespace

    from concur.verify import reference
    from concur.verify.contestant import leaf_meta
    from concur.verify.referee import Referee

    held_s = 0.1  # a gap of one hold fails; preemption of up to half of one passes

    def slow_clock(pid):
        time.sleep(held_s)
        return 0.0

    monkeypatch.setattr(procs, "cpu_seconds", slow_clock)
    runner = SimpleNamespace(
        pid=os.getpid(),
        arena=lambda slot, nbytes, stage: SimpleNamespace(bytes=torch.zeros(nbytes, dtype=torch.uint8)),
        ring=lambda *args: time.perf_counter(),
        collect=lambda *args, **kwargs: {"ok": True},
        bell=None,
    )
    judge = SimpleNamespace(offset=lambda: 0, sync=lambda: None)
    referee = SimpleNamespace(
        hold=lambda runner: [],
        release=lambda held: None,
        flush=lambda: None,
        timed_handoff=lambda *args, **kwargs: Referee.timed_handoff(judge, *args, **kwargs),
    )
    begin = time.perf_counter()
    timed = reference.timed_round(referee, runner, {"op": "go"}, 5.0, [leaf_meta(torch.zeros(4))], 1)
    whole_ms = 1000.0 * (time.perf_counter() - begin)
    clocked_ms = timed["stage_ms"] + timed["go_ms"] + timed["handoff_ms"]
    assert whole_ms >= 2000.0 * held_s  # held up before the ring and between the spans
    assert clocked_ms > whole_ms - 0.5 * 1000.0 * held_s


def test_work_done_while_the_inputs_are_written_is_counted():
    """The writing of a batch's inputs is on the clock and taken off again, its excess over the reference's median
    (and COPY_SLACK of it) counted in its batch: kernels the candidate ran while its inputs landed time-shared the
    GPU with the writing and lengthened it by as much as they shortened its batch."""
    reference = [2.0, 2.1, 1.9, 2.0, 2.05]
    per_call = [1.0] * 5
    honest = timing.charged(per_call, [[1.9, 2.08, 2.1, 1.95, 2.0]], [reference], 4)
    assert honest == per_call  # the same writing, within the slack
    # 3 ms of its 4 ms of work ran during the writing, in every batch: counted beyond the slack
    ahead = timing.charged([0.25] * 5, [[5.0] * 5], [reference], 4)
    assert ahead == pytest.approx([0.25 + (5.0 - (1 + timing.COPY_SLACK) * 2.0) / 4] * 5)


@pytest.mark.parametrize("share", [0.2, 0.5, 0.6, 1.0])
def test_deferring_in_some_batches_only_gains_nothing(share):
    """Work moved from a batch's forward to its hand-off, in a share of the batches and by varying amounts: it is
    counted in the batch it was moved in, so the quickest batch is no quicker than undeferred."""
    rng = random.Random(7)
    n, honest_forward, handoff = 20, 1.0, 0.1
    moved = [rng.uniform(0.1, 0.6) if i < share * n else 0.0 for i in range(n)]
    rng.shuffle(moved)
    per_call = timing.per_call_times([honest_forward - m for m in moved], 0.2, 4)
    got = timing.summary(per_call, timing.charged(per_call, [[handoff + m for m in moved]], [[handoff] * n], 4))
    assert got.best_ms >= (honest_forward - 0.2 - timing.COPY_SLACK * handoff) / 4 - 1e-12


def test_what_the_machine_adds_to_some_batches_does_not_move_the_time():
    """Batches slowed by the machine (a preempted or shared core, another process's copy), their copies as noisy
    as the reference's own: the quickest batch is the kernel's time, as the same kernel's undisturbed batches say."""
    rng = random.Random(3)
    undisturbed = 0.5
    per_call = [undisturbed * (1 + (rng.uniform(0.02, 0.4) if rng.random() < 0.6 else 0.0)) for _ in range(30)]
    reference = [0.5 * (1 + rng.gauss(0, 0.05)) for _ in range(30)]
    handoffs = [0.5 * (1 + rng.gauss(0, 0.05)) for _ in range(30)]
    got = timing.summary(per_call, timing.charged(per_call, [handoffs], [reference], calls=4))
    assert got.best_ms == pytest.approx(undisturbed)
    assert got.median_ms > 1.01 * undisturbed  # the median carries the machine's share


def test_stopping_rules():
    assert not timing.budget_spent([1.0] * 5, 1, 0.1)  # too few batches
    assert timing.budget_spent([10.0] * timing.MIN_BATCHES, 1, 0.1)
    slow = [100.0] * timing.SLOWER_MIN_BATCHES  # 100x slower than eager: known well enough
    assert timing.candidate_done(slow, 1, 10.0, reference_median_ms=1.0)
    assert not timing.candidate_done([2.0] * 3, 1, 10.0, reference_median_ms=1.0)  # honest, 2x slower: timed on
    # one batch of 500 ms, 5x slower than eager, has run the whole budget: no second and third batch of it
    assert timing.candidate_done([500.0], 1, 0.1, reference_median_ms=100.0)
    assert not timing.candidate_done([5.0], 1, 0.1, reference_median_ms=1.0)  # one short batch is noise
    # a reference of 400 ms a call: 3 batches (1.2 s) say as much as ten batches of the budget, not ten of 400 ms
    assert timing.budget_spent([400.0] * 3, 1, 0.1)
    assert not timing.budget_spent([40.0] * 3, 1, 0.1)
    assert timing.speedup(Times(best_ms=2.0), Times(best_ms=1.0)) == 2.0


def test_copies_that_ran_slow_do_not_cut_an_honest_kernels_timing_short():
    """A 2-core CPU run: the honest kernel's hand-offs took 16 and 24 ms against the reference's 4, which charged
    in its batches read 3.6 times the reference's median and stopped it as clearly slower after 3 batches (its
    speedup 0.42, where other runs read 1.2-1.7). The forwards alone decide; a kernel slow in its forwards still
    stops."""
    from types import SimpleNamespace

    from concur.verify import measure

    task = SimpleNamespace(overhead_ms=0.0)
    plan = measure.Plan(calls=7, forward=[7.07, 11.6, 4.87], stage=[3.0] * 3, handoff=[2.74, 5.61, 4.14])
    ran = measure.Replay(whole_at=(0, 0), forward=[16.0, 11.1, 5.8], stage=[3.0] * 3, handoff=[16.22, 4.73, 24.45])
    billed = measure.charged(ran.forward, ran.stage, ran.handoff, plan, 0.0)
    assert statistics.median(billed) > timing.SLOWER_STOP * statistics.median(plan.per_call(task))  # as charged
    assert not measure.replayed_enough(ran, plan, task, budget_s=0.05)
    ran.forward = [f * 4 for f in ran.forward]
    assert measure.replayed_enough(ran, plan, task, budget_s=0.05)


@pytest.mark.parametrize("batch_ms", [1e-4, 0.5, 7.0, 10.0, 33.0, 150.0, 400.0, 5000.0])
def test_planned_batches_are_where_the_budget_is_spent(batch_ms):
    """Planned from a first batch, the count is the first at which batches of that time have spent the budget."""
    planned = timing.planned_batches(batch_ms, 0.1)
    assert timing.budget_spent([batch_ms] * planned, 1, 0.1)
    assert planned == 1 or not timing.budget_spent([batch_ms] * (planned - 1), 1, 0.1)
    assert timing.planned_batches(0.0, 0.1) == timing.planned_batches(-1.0, 0.1) == timing.MAX_BATCHES


# ---------------------------------------------------------------- what crosses between processes


def test_tensors_cross_as_specs_and_bytes():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    values = [base.t(), base[:, :3], torch.tensor(7, dtype=torch.int64), 2.5, [1, 2]]
    specs = exchange.specs_of(values)
    arena = exchange.Arena("cpu", exchange.place(specs))
    try:
        exchange.write(arena.bytes, specs, values)
        message, fds = arena.share()
        mapped = exchange.Mapped(message, [os.dup(fd) for fd in fds])  # as the contestant maps it
        crossed = exchange.values_of(mapped.bytes, specs)
        for got, want in zip(crossed, values):
            if isinstance(want, torch.Tensor):
                assert type(got) is torch.Tensor and torch.equal(got, want) and got.stride() == want.stride()
            else:
                assert got == want
    finally:
        arena.close()


def test_a_staged_batch_crosses_in_one_copy_as_written_tensor_by_tensor():
    """A timed batch's inputs are laid out before the clock (exchange.staging) and written in one copy on it
    (write_span): the contestant sees what the tensor-by-tensor write gives it, strides kept, the gaps between
    tensors zero (nothing the referee's memory held before)."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    calls = [[base.t(), base[:, :3] + 1, 3], [torch.full((5,), 9, dtype=torch.int16), torch.empty(0), 2.5]]
    specs, end = [], 0
    for values in calls:
        specs.append(exchange.specs_of(values))
        end = exchange.place(specs[-1], end)
    flat, values = [s for spec in specs for s in spec], [v for c in calls for v in c]
    staged = exchange.staging(flat, values, end, torch.device("cpu"))
    arena = exchange.Arena("cpu", end)
    try:
        arena.bytes.fill_(0xAB)
        exchange.write_span(arena.bytes, staged)
        for spec, want in zip(flat, values):
            if isinstance(want, torch.Tensor):
                got = exchange.view(arena.bytes, spec)
                assert torch.equal(got, want) and got.stride() == want.stride()
        used = torch.zeros(end, dtype=torch.bool)
        for spec in flat:
            if spec["t"] == "tensor":
                used[spec["off"] : spec["off"] + exchange.nbytes(spec)] = True
        assert not used.all() and (arena.bytes[:end][~used] == 0).all()
    finally:
        arena.close()


def test_a_batch_of_small_tensors_is_staged_and_its_calls_read_the_staged_copy(monkeypatch):
    """Referee.staged: small tensors (a microsecond task's) are staged and the calls' inputs become views of the
    staged buffer (the drawn tensors can go: no more memory than before); large ones are written as they are."""
    from types import SimpleNamespace

    from concur.verify.referee import Referee

    judge = SimpleNamespace(torch=torch, device="cpu")
    calls = [[torch.randn(8, 16), torch.randn(16, 8).t(), (0.5, 2)] for _ in range(3)]
    specs, end = [], 0
    for values in calls:
        specs.append(exchange.specs_of(values))
        end = exchange.place(specs[-1], end)
    buffer, staged = Referee.staged(judge, calls, specs)
    assert buffer is not None and buffer.numel() == end
    lo, hi = buffer.data_ptr(), buffer.data_ptr() + buffer.numel()
    for got, want in zip(staged, calls):
        assert got[2] is want[2]  # plain values stay as drawn
        for g, w in zip(got[:2], want[:2]):
            assert torch.equal(g, w) and g.stride() == w.stride() and lo <= g.data_ptr() < hi
    monkeypatch.setattr(exchange, "STAGE_TENSOR_BYTES", 256)
    assert Referee.staged(judge, calls, specs) == (None, calls)


def test_only_plain_values_cross():
    with pytest.raises(TypeError, match="cannot cross"):
        exchange.specs_of([object()])
    assert exchange.value_spec((1, "a", None)) == {"t": "value", "v": [1, "a", None]}


def test_a_spec_outside_its_arena_is_refused():
    arena = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(ValueError, match="outside its arena"):
        exchange.view(arena, {"t": "tensor", "dtype": "torch.float32", "shape": [512], "stride": [1], "span": 512,
                              "off": 0})  # fmt: skip


# ---------------------------------------------------------------- the sandbox


def run_confined(tmp_path, action) -> str:
    """Run `action` in a forked child confined to tmp_path/own (tmp_path/hidden hidden); return what it reports."""
    own, hidden = tmp_path / "own", tmp_path / "hidden"
    own.mkdir()
    hidden.mkdir()
    (hidden / "secret").write_text("s")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            sandbox.confine([str(own)], [], [str(hidden)], devices=[])
            message = action(own, hidden)
        except BaseException as err:
            message = f"error {err}"
        os.write(write_fd, message.encode())
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        return f.read()


needs_landlock = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6")


def attempt(fn) -> str:
    try:
        fn()
        return "allowed"
    except OSError:
        return "refused"


@needs_landlock
def test_a_confined_process_writes_only_its_own_folder(tmp_path):
    def action(own, hidden):
        mine = attempt(lambda: (own / "x").write_text("ok"))
        outside = attempt(lambda: (own.parent / "planted").write_text("no"))
        secret = attempt(lambda: (hidden / "secret").read_text())
        readable = attempt(lambda: open(torch.__file__).read(1))
        return " ".join([mine, outside, secret, readable])

    assert run_confined(tmp_path, action) == "allowed refused refused allowed"
    assert not (tmp_path / "planted").exists()


@needs_landlock
def test_a_confined_process_cannot_signal_or_read_its_judges(tmp_path):
    parent = os.getpid()

    def action(own, hidden):
        signal = attempt(lambda: os.kill(parent, 0))
        memory = attempt(lambda: open(f"/proc/{parent}/mem", "rb").read(1))
        return f"{signal} {memory}"

    assert run_confined(tmp_path, action) == "refused refused"


def test_readable_paths_cover_everything_but_the_hidden_trees(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "c").mkdir()
    granted = sandbox.readable_around([str(tmp_path / "a" / "b")])
    assert str(tmp_path / "a" / "c") in granted
    assert not any(p == str(tmp_path / "a" / "b") or p.startswith(str(tmp_path / "a" / "b") + "/") for p in granted)
    assert "/usr" in granted or "/bin" in granted


def test_landlock_abi_is_a_number():
    assert isinstance(sandbox.landlock_abi(), int) and not math.isnan(sandbox.landlock_abi())


def test_a_closed_zygote_exits_on_its_own():
    """EOF on its control socket ends a zygote, although the requester's reader thread is blocked on that socket
    (a close alone left it waiting, and every verify process paid the 10 s before it is killed at exit)."""
    zygote = procs.Zygote()
    zygote.close()
    assert zygote.proc.returncode == 0


def test_no_warm_up_after_long_correctness_calls():
    """Calls that each kept the device busy for the timing budget have warmed it; short ones have not."""
    assert timing.warm_already([0.5, 0.3, 0.2], 0.1)
    assert not timing.warm_already([0.5, 0.01], 0.1)
    assert not timing.warm_already([], 0.1)
    assert not timing.warm_already([0.03], 0.0)  # the device still needs WARMUP_MIN_S


def test_arena_budget_grows_with_the_gpu():
    assert exchange.arena_budget(None) == exchange.ARENA_BUDGET
    assert exchange.arena_budget(4 << 30) == exchange.ARENA_BUDGET
    assert exchange.arena_budget(24 << 30) == 4 << 30
    assert exchange.arena_budget(80 << 30) == exchange.ARENA_BUDGET_MAX


def test_a_spinning_receive_still_keeps_its_deadline():
    """A spinning wait returns the message as a blocking one does, and never waits past its timeout."""
    left, right = socket.socketpair()
    sender, receiver = procs.Channel(left), procs.Channel(right)
    begin = time.perf_counter()
    with pytest.raises(TimeoutError):
        receiver.recv(timeout=0.05, spin_s=5.0)
    assert time.perf_counter() - begin < 1.0
    sender.send({"op": "go"})
    assert receiver.recv(timeout=1.0, spin_s=0.5)[0] == {"op": "go"}
    sender.close()
    receiver.close()


def test_the_first_calls_extra_time_ends_once_its_forward_has_returned():
    """One-time set-up runs in forward (module loads, library handles), so a call whose forward has returned waits
    only on its kernels: from then on the plain deadline holds, until the side says the device is done (a profiled
    call then reads its events). A call that never says so keeps the whole extra."""

    def answer(notice_after: float | None, reply_after: float, ran_after: float | None = None) -> tuple[str, float]:
        left, right = socket.socketpair()
        child, referee = procs.Channel(left), procs.Channel(right)

        def contestant():
            if notice_after is not None:
                time.sleep(notice_after)
                child.send({"launched": True, "nonce": "n"})
            if ran_after is not None:
                time.sleep(ran_after)
                child.send({"ran": True, "nonce": "n"})
            time.sleep(reply_after)
            with contextlib.suppress(OSError):
                child.send({"ok": True, "nonce": "n"})

        thread = threading.Thread(target=contestant, daemon=True)
        begin = time.perf_counter()
        thread.start()
        try:
            kind = "ok" if procs.await_reply(referee, None, os.getpid(), 1.5, 1 << 40, 1 << 20, 0.05, 0, 0.3) else ""
        except procs.Stopped as err:
            kind = err.kind
        waited = time.perf_counter() - begin
        referee.close()
        thread.join()
        child.close()
        return kind, waited

    assert answer(None, 0.7)[0] == "ok"  # set-up in forward: 0.7 s of the 1.5 allowed
    assert answer(0.5, 0.1)[0] == "ok"  # set-up, then kernels within the plain deadline
    kind, waited = answer(0.0, 1.0)  # launched at once, then kernels that outlast the plain deadline: a hang
    assert kind == "timeout" and waited < 0.8
    kind, waited = answer(1.3, 0.5)  # never later than the whole deadline
    assert kind == "timeout" and waited < 1.9
    assert answer(0.0, 0.8, ran_after=0.1)[0] == "ok"  # kernels done at once, then 0.8 s reading a profile


def test_clearly_slower_candidates_are_settled_by_long_untimed_calls():
    """Correctness calls of 200 ms, 10x the reference: their median is the candidate's time, no batch is run; short
    calls, too few, or a candidate less than SLOWER_STOP times slower are timed in batches."""
    assert timing.slower_by_calls([200.0, 210.0, 190.0], 0.1, reference_median_ms=20.0)
    assert not timing.slower_by_calls([200.0, 210.0], 0.1, reference_median_ms=20.0)  # too few
    assert not timing.slower_by_calls([200.0, 210.0, 20.0], 0.1, reference_median_ms=2.0)  # one call too short
    assert not timing.slower_by_calls([200.0, 210.0, 190.0], 0.1, reference_median_ms=100.0)  # 2x: timed on
    assert not timing.slower_by_calls([40.0] * 5, 0.1, reference_median_ms=1.0)  # short calls: batches say it


def test_warm_up_ends_after_one_slow_batch(monkeypatch):
    """Honest slow kernels are not made to run `warmup` batches of seconds each; fast ones still get all of them."""
    from concur.verify import measure

    for batch_s, expected in ((0.02, 3), (0.15, 1)):
        batches = []
        monkeypatch.setattr(measure, "timed_batch", lambda *a, s=batch_s, b=batches, **k: b.append(time.sleep(s)))
        settings = {"warmup": 3, "timing_min_s": 0.1, "mode": "hardened", "correctness_trials": 5, "signed_trials": 1}
        measure.warm_up(None, types.SimpleNamespace(signed_finite=True), None, 1, settings, lambda *a: {"ok": True})
        assert len(batches) == expected


# ---------------------------------------------------------------- light CUDA headers


def test_light_headers_change_only_the_extension_include():
    from concur.verify.build import lighter

    source = "#include <torch/extension.h>\n#include <cuda_runtime.h>\n__global__ void k() {}\n"
    light = lighter(source)
    assert light.splitlines()[0] == "#include <torch/types.h>"
    assert light.splitlines()[1:] == source.splitlines()[1:]  # same lines: errors keep their line numbers
    assert lighter(["  # include <torch/extension.h>", "int x;"]) == ["  # include <torch/types.h>", "int x;"]
    assert lighter("#include <torch/types.h>\n") is None  # nothing to lighten: built once, as written
    assert lighter('// see "#include <torch/extension.h>"\n') is None
    assert lighter(None) is None


def test_a_light_build_that_fails_is_built_as_written(monkeypatch):
    """Honest code that needs the full header (pybind11 in its .cu) still builds; the fallback starts from a clean
    versioner, so the module keeps its name."""
    from torch.utils import cpp_extension

    from concur.verify.build import LIGHT_ENV, ExtensionLoader

    built, known = [], []

    def load_inline(name, cpp_sources, cuda_sources=None, functions=None, build_directory=None):
        built.append(cuda_sources)
        known.append(name in cpp_extension.JIT_EXTENSION_VERSIONER.entries)
        cpp_extension.JIT_EXTENSION_VERSIONER.entries[name] = "seen"
        if "torch/types.h" in cuda_sources and "py::" in cuda_sources:
            raise RuntimeError("Error building extension: cuda.cu(4): error: name followed by '::' must be a class")
        return name

    monkeypatch.setenv(LIGHT_ENV, "1")
    needs_pybind = "#include <torch/extension.h>\npy::object f();\n"
    call = {"name": "ext", "cpp_sources": "", "cuda_sources": needs_pybind}
    assert ExtensionLoader._build(load_inline, call, "ext", True) == "ext"
    assert built == [needs_pybind.replace("extension.h", "types.h"), needs_pybind]
    assert known == [False, False]  # the retry is a first build to torch too
    built.clear()
    kernel = "#include <torch/extension.h>\n__global__ void k() {}\n"
    ExtensionLoader._build(load_inline, {**call, "name": "k", "cuda_sources": kernel}, "k", True)
    assert built == [kernel.replace("extension.h", "types.h")]  # one build
    monkeypatch.delenv(LIGHT_ENV)
    built.clear()
    ExtensionLoader._build(load_inline, {**call, "name": "k2", "cuda_sources": kernel}, "k2", True)
    assert built == [kernel]  # setting off: as written
    for name in ("ext", "k", "k2"):
        cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)


def test_build_errors_name_the_file_not_the_machine():
    from concur.verify.build import first_error_line

    nvcc = '/root/out/cache/7a49dd/conv/cuda.cu(11): error: expected a ";"\n1 error detected'
    assert first_error_line(nvcc) == 'cuda.cu(11): error: expected a ";"'
    gcc = "/tmp/x/ext/main.cpp:4:1: error: 'foo' does not name a type"
    assert first_error_line(gcc) == "main.cpp:4:1: error: 'foo' does not name a type"


def test_the_pool_stands_still_while_a_side_is_timed():
    """Contestants still starting (CUDA context, CUPTI) slowed timed kernels on the same GPU: the referee stops the
    waiting ones for the timed stretch and lets them go on after it. A judged candidate, killed as its job ended, is
    gone before the stretch starts (its dying context's kernels would still run)."""
    import subprocess
    from types import SimpleNamespace

    from concur.verify.referee import Referee

    def state(pid: int) -> str:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]

    children = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    judged = subprocess.Popen(["sleep", "30"])
    dying = SimpleNamespace(kill=judged.kill, end=judged.wait)
    referee = SimpleNamespace(pool=[SimpleNamespace(pid=c.pid) for c in children], ending=[], guard=lambda: None)
    referee.zygote = SimpleNamespace(clear_leftovers=lambda: [])  # no zygote here: nothing left behind
    referee.settle = lambda: Referee.settle(referee)
    referee.timing, referee.judged, referee.main_core = 0, [dying], None  # no launch core set apart
    referee.place = lambda timing: Referee.place(referee, timing)
    try:
        Referee.dismiss(referee, dying)
        with Referee.quiet(referee):
            assert [state(c.pid) for c in children] == ["T", "T"]
            assert judged.returncode is not None and not referee.ending and not referee.judged
        assert "T" not in [state(c.pid) for c in children]
    finally:
        for child in [*children, judged]:
            child.kill()
            child.wait()


def test_cpu_time_is_read_to_the_microsecond_over_short_windows():
    """Twenty windows of a few milliseconds of one busy thread add up to about one core: tick-rounded readings of
    /proc summed over such windows had read a one-thread loop as 1.9 cores."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert procs.cpu_resolution_s(child.pid) < 1e-3
        time.sleep(0.3)
        cpu = wall = 0.0
        for _ in range(20):
            c0, w0 = procs.cpu_seconds(child.pid), time.perf_counter()
            time.sleep(0.003)
            cpu += procs.cpu_seconds(child.pid) - c0
            wall += time.perf_counter() - w0
        assert cpu / wall < 1.3
    finally:
        child.kill()
        child.wait()


def test_a_held_contestant_stops_every_thread_child_and_orphan(tmp_path):
    """On the CPU the contestants are stopped while a batch's inputs are written: every process under the zygote,
    with their threads, a double-forked orphan included (they share the arena's mapping), until released. One
    already stopped (the waiting pool) is left stopped."""
    import subprocess
    import sys

    ready = tmp_path / "ready"
    program = f"""
import ctypes, os, signal, threading, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # a subreaper, as the zygote
def spin():
    while True:
        pass
if os.fork() == 0:  # the contestant: a thread, and a double-forked orphan
    threading.Thread(target=spin, daemon=True).start()
    if os.fork() == 0:
        if os.fork() == 0:
            spin()
        os._exit(0)
    spin()
if os.fork() == 0:  # a waiting contestant, stopped already
    os.kill(os.getpid(), signal.SIGSTOP)
    spin()
time.sleep(0.5)
open({str(ready)!r}, "w").close()
while True:
    time.sleep(1)
"""
    root = subprocess.Popen([sys.executable, "-c", program], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        everyone = procs.tree(root.pid)
        held = procs.stop_descendants(root.pid)
        assert len(held) == 2  # the contestant and its orphan, not the waiting one (nor the orphan's dead parent)
        assert all(procs.all_stopped(pid) for pid in everyone)
        before = [procs.cpu_seconds(pid) for pid in held]
        time.sleep(0.2)
        assert [procs.cpu_seconds(pid) for pid in held] == before
        procs.resume_all(held)
        time.sleep(0.2)
        assert not any(procs.all_stopped(pid) for pid in held)
        assert all(procs.cpu_seconds(pid) > b for pid, b in zip(held, before))
        assert all(procs.all_stopped(pid) for pid in everyone if pid not in held)  # the waiting one stays stopped
    finally:
        os.killpg(root.pid, 9)
        root.wait()


def test_a_doorbell_ring_is_read_whole_or_not_at_all():
    bell = doorbell.Bell()
    bell.ring(doorbell.GO, 7, [1, -2, 3])
    assert bell.read(doorbell.GO) == (7, [1, -2, 3])
    bell.ring(doorbell.GO, 8)
    assert bell.read(doorbell.GO) == (8, None)
    struct.pack_into("<q", bell.map, doorbell.GO, 9)  # a token seen before the rest of its ring
    assert bell.read(doorbell.GO) is None and bell.await_new(doorbell.GO, 8, 0.01) is None
    with pytest.raises(ValueError):
        bell.ring(doorbell.GO, 10, list(range(doorbell.MAX_PAYLOAD + 1)))
    bell.close()


def test_a_doorbell_answers_across_processes_and_gives_way_to_the_socket():
    """The referee's wait ends when the contestant rings back with the token it was rung with, and at once when
    a message comes on the socket instead (the contestant answered there, or is gone)."""
    bell, (mine, theirs) = doorbell.Bell(), socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            other = doorbell.Bell(os.dup(bell.fd))
            token, payload = other.await_new(doorbell.GO, None, 10.0)
            other.ring(doorbell.DONE, token + sum(payload))
            theirs.send(b"x")
        finally:
            os._exit(0)
    try:
        bell.ring(doorbell.GO, 100, [1, 2])
        assert bell.await_token(doorbell.DONE, 103, 10.0, mine) is not None
        begin = time.perf_counter()
        assert bell.await_token(doorbell.DONE, 104, 10.0, mine) is None
        assert time.perf_counter() - begin < 2.0
        assert bell.await_token(doorbell.DONE, 104, 0.0) is None
    finally:
        os.waitpid(pid, 0)
        bell.close()


def test_a_referee_that_stops_spinning_says_so_and_the_contestant_stops_waiting():
    """A batch longer than the referee's spin: the referee marks LEFT and reads the socket; the contestant, done,
    finds the mark and replies at once rather than spinning on for a hand-off ring that will not come."""
    bell = doorbell.Bell()
    bell.ring(doorbell.GO, 5)
    assert bell.await_token(doorbell.DONE, 5, 0.01) is None
    begin = time.perf_counter()
    assert bell.await_new(doorbell.HANDOFF, None, 5.0, (doorbell.DONE, 5)) is None
    assert time.perf_counter() - begin < 1.0
    bell.ring(doorbell.HANDOFF, 6, [0, 0])  # a hand-off rung before the contestant looked still wins
    assert bell.await_new(doorbell.HANDOFF, None, 5.0, (doorbell.DONE, 5)) == (6, [0, 0])
    assert bell.await_new(doorbell.HANDOFF, 6, 0.01, (doorbell.DONE, 7)) is None  # another batch's mark: spins on
    bell.close()


def test_a_contestant_lands_its_outputs_where_the_referee_reads_them():
    """On the doorbell the contestant lays its outputs out itself (few operations: it runs on the clock); the
    referee reads them by exchange.handoff_layouts from their metadata: the same bytes, odd sizes, values and empty
    tensors included."""
    from types import SimpleNamespace

    from concur.verify.contestant import Contestant, leaf_meta

    pending = [
        [torch.arange(6, dtype=torch.float32).reshape(2, 3), 7, torch.arange(5, dtype=torch.int16)],
        [torch.ones(3, 1, dtype=torch.float64).t(), torch.empty(0), torch.tensor([True, False, True])],
    ]
    metas = [[leaf_meta(leaf) for leaf in call] for call in pending]
    target = torch.zeros(1 << 16, dtype=torch.uint8)
    views, sources = Contestant.landing(SimpleNamespace(pending=pending), target, 300, 512)
    torch._foreach_copy_(views, sources)
    layouts, _ = exchange.handoff_layouts(metas, 300, 512)
    for call, layout in zip(pending, layouts):
        for leaf, got in zip(call, exchange.values_of(target, layout)):
            assert torch.equal(got, leaf) if isinstance(leaf, torch.Tensor) else got == leaf
    with pytest.raises(ValueError):
        Contestant.landing(SimpleNamespace(pending=pending), target[:600], 300, 512)


def test_outputs_of_one_dtype_and_shape_land_end_to_end_from_one_view():
    """A batch of same-shaped outputs that fill whole ALIGN blocks takes one view of the arena, split in C++ (the
    hand-off runs on the clock); the bytes land where exchange.handoff_layouts says, a non-contiguous output and a
    value leaf included, and the arena's end is still enforced."""
    from types import SimpleNamespace

    from concur.verify.contestant import Contestant, leaf_meta

    pending = [[torch.randn(8, 32), 3] for _ in range(4)] + [[torch.randn(32, 8).t(), 4]]
    metas = [[leaf_meta(leaf) for leaf in call] for call in pending]
    target = torch.zeros(1 << 14, dtype=torch.uint8)
    base = 3 * exchange.ALIGN
    views, sources = Contestant.landing(SimpleNamespace(pending=pending), target, 0, base)
    size = 8 * 32 * 4
    assert [v.data_ptr() - target.data_ptr() for v in views] == [base + i * size for i in range(5)]
    assert all(v.shape == (8, 32) for v in views)  # one view split, not one per output
    torch._foreach_copy_(views, sources)
    layouts, _ = exchange.handoff_layouts(metas, 0, base)
    for call, layout in zip(pending, layouts):
        got = exchange.values_of(target, layout)
        assert torch.equal(got[0], call[0]) and got[1] == call[1]
    with pytest.raises(ValueError):
        Contestant.landing(SimpleNamespace(pending=pending), target[: base + 5 * size - 1], 0, base)


def test_every_call_of_a_timed_batch_is_read_where_its_outputs_landed():
    """The referee reads every call's checked elements on the hand-off's clock in one gather per dtype, from where
    the contestant landed them (any random base): the same elements as each leaf at its secret positions, small
    leaves whole, value leaves left to the reply."""
    from types import SimpleNamespace

    from concur.verify.contestant import Contestant, leaf_meta
    from concur.verify.measure import Sampler, positions, samples_per_call

    calls = [
        [torch.randn(40, 50), 3, torch.arange(7, dtype=torch.int16), torch.randn(900, dtype=torch.float64)]
        for _ in range(5)
    ]
    count = samples_per_call(len(calls))
    assert count == 820 and samples_per_call(64) == 64 and samples_per_call(1000) == 64
    meta = [leaf_meta(leaf) for leaf in calls[0]]
    referee = SimpleNamespace(torch=torch, device="cpu", positions=torch.Generator().manual_seed(5))
    where = positions(referee, meta, len(calls))
    assert [None if at is None else tuple(at.shape) for at in where] == [(5, count), None, None, (5, count)]
    sampler = Sampler(referee, meta, where, len(calls))
    target = torch.zeros(1 << 17, dtype=torch.uint8)
    base = 37 * exchange.ALIGN
    views, sources = Contestant.landing(SimpleNamespace(pending=calls), target, 0, base)
    torch._foreach_copy_(views, sources)
    picked = sampler.split(sampler.read(target, base))
    for call, (leaves, got_call) in enumerate(zip(calls, picked)):
        for leaf, at, got in zip(leaves, where, got_call):
            if not isinstance(leaf, torch.Tensor):
                assert got is None
                continue
            flat = leaf.reshape(-1)
            assert torch.equal(got, flat if at is None else flat[at[call]])
    assert len(sampler.groups) == 3  # one gather each for float32, int16 and float64


def test_the_referee_sleeps_only_through_the_first_half_of_a_step():
    """Before spinning on a timed step, the referee sleeps through at most half of that step's quickest answer so
    far, less what a sleep may overrun: an answer as quick as any before is never read late."""
    assert doorbell.idle_s(None) == 0.0  # nothing until the step was answered once
    assert doorbell.idle_s(0.0005) == 0.0  # a step this short is spun on all the way
    for quickest in (0.001, 0.002, 0.3):
        idle = doorbell.idle_s(quickest)
        assert 0.0 < idle and idle + doorbell.IDLE_SLACK_S <= 0.5 * quickest + 1e-12


def test_referees_take_the_largest_tasks_first(monkeypatch):
    """Tasks are handed out largest first (the greedy longest-first rule), so the referees finish together."""
    from concur.verify import orchestrate

    sizes = {"a": 1, "b": 4, "c": 2, "d": 4, "e": 1}
    payloads = [{"task_id": t, "candidate_id": f"{t}{i}"} for t, n in sizes.items() for i in range(n)]
    random.Random(0).shuffle(payloads)
    groups = orchestrate.task_groups(payloads)
    assert [len(g) for g in groups] == [4, 4, 2, 1, 1] and all(len({p["task_id"] for p in g}) == 1 for g in groups)
    assert sorted(p["candidate_id"] for g in groups for p in g) == sorted(p["candidate_id"] for p in payloads)

    ran: list[tuple[int, str]] = []

    def evaluate(handles, slot, payload, timeout):
        time.sleep(0.01)
        ran.append((slot, payload["task_id"]))
        return Report()

    monkeypatch.setattr(orchestrate, "referees", lambda settings, root: [None, None])
    monkeypatch.setattr(orchestrate, "evaluate_with_retry", evaluate)
    done = []
    orchestrate.evaluate_all(payloads, {"timeout_s": 1}, None, False, lambda p, r: done.append(p["candidate_id"]))
    assert sorted(done) == sorted(p["candidate_id"] for p in payloads)
    assert {task for _, task in ran[:2]} == {"b", "d"}  # the two largest, one on each referee


def test_a_referee_without_work_takes_the_last_candidate_of_the_fullest_task():
    """A task's candidates run in a row on the referee that took it, until every task is taken; then a referee left
    idle takes candidates from the end of the task with the most left, so the job ends one candidate after the
    last task is taken, not one task after. Every candidate is handed out once."""
    from concur.verify.orchestrate import TaskBoard

    groups = [[{"task_id": t, "candidate_id": f"{t}{i}"} for i in range(n)] for t, n in (("b", 4), ("a", 1))]
    board = TaskBoard(groups)
    ids = lambda slot: (board.take(slot) or {}).get("candidate_id")  # noqa: E731
    assert [ids(0), ids(1), ids(0)] == ["b0", "a0", "b1"]  # its own task, in order
    assert [ids(1), ids(1), ids(0), ids(1), ids(0)] == ["b3", "b2", None, None, None]  # the idle one, from the end


def test_both_sides_main_threads_share_one_core_of_their_own(monkeypatch):
    """On a GPU a microsecond kernel's time is mostly its side's launches, at the pace of the core making them: the
    reference and every candidate launch from one core (the last active one), which nothing else of the referee
    uses, nor that core's SMT siblings; with too few cores, nothing is set apart."""
    from concur.verify import referee

    monkeypatch.setattr(referee, "siblings", lambda core: {4: {3}, 3: {4}}.get(core, set()))
    assert referee.timing_core([0, 1, 2, 3, 4]) == (4, [0, 1, 2])
    assert referee.timing_core([0, 1, 2]) == (2, [0, 1])
    assert referee.timing_core([3, 4, 5]) == (5, [3, 4])
    monkeypatch.setattr(referee, "siblings", lambda core: {0, 1} - {core})
    assert referee.timing_core([0, 1, 2])[0] == 2 and referee.timing_core([1, 2]) == (None, [1, 2])
    assert referee.timing_core([0, 1]) == (None, [0, 1])
    # hardened times by its quickest batches; kernelbench mode means, as KernelBench's plain process is placed
    assert modes.MODES["hardened"].launch_core and not modes.MODES["kernelbench"].launch_core


def test_smt_siblings_are_read_from_the_system():
    from concur.verify import referee

    for core in sorted(os.sched_getaffinity(0)):
        found = referee.siblings(core)
        assert core not in found and all(isinstance(c, int) for c in found)
    assert referee.siblings(1 << 20) == set()  # no such core: none


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_timed_sides_main_thread_is_on_the_launch_core_only_while_timed():
    """`place` puts every thread of a judged side on the rest of the cores, and its main thread on the launch core
    for the outermost timed stretch only (`quiet`): a thread or compile worker it starts at other times keeps the
    rest. A dead side is dropped."""
    import subprocess
    import sys

    from concur.verify import referee

    main_core, *rest = sorted(os.sched_getaffinity(0))[-1:] + sorted(os.sched_getaffinity(0))[:-1]
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        gone = types.SimpleNamespace(pid=2**22 + 1)
        judge = types.SimpleNamespace(
            main_core=main_core, rest=rest, judged=[types.SimpleNamespace(pid=child.pid), gone], pin="timed"
        )
        judge.timing, judge.pool, judge.settle = 0, [], lambda: None
        judge.place = lambda timing: referee.Referee.place(judge, timing)

        def cores() -> dict[int, set[int]]:
            return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{child.pid}/task")}

        with referee.Referee.quiet(judge):
            with referee.Referee.quiet(judge):
                pass
            found = cores()  # the inner stretch left the placement as it was
            assert found.pop(child.pid) == {main_core} and all(c == set(rest) for c in found.values())
        assert all(c == set(rest) for c in cores().values()) and gone not in judge.judged
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("left_by", ["none", "candidate", "another process"])
def test_a_device_busy_past_the_drain_is_blamed_on_whoever_left_the_work(left_by, monkeypatch):
    """A device still busy past the drain's limit fails the candidate only where the work went with it: each judged
    candidate is killed and the device drained again. Clean then, the work was the candidate's (a timing failure);
    still busy, another process uses the GPU: the verifier's own failure, never the candidate's."""
    from types import SimpleNamespace

    from concur.verify.referee import DeviceBusy, Referee
    from concur.verify.runner import RunnerFailed

    class Side:
        def __init__(self, pid):
            self.pid, self.killed, self.ended = pid, False, False

        def kill(self):
            self.killed = True

        def end(self):
            self.ended = True

    reference, candidate = Side(1), Side(2)
    referee = Referee.__new__(Referee)
    referee.device, referee.clean_probe_ms, referee.ending = "cuda", 0.2, []
    referee.judged, referee.task = [reference, candidate], SimpleNamespace(runner=reference)
    leftovers = []  # what the zygote cleared: a settled candidate's tree
    referee.zygote = SimpleNamespace(clear_leftovers=lambda: leftovers.append("cleared") or [])
    referee.guard = lambda: None
    busy = {"none": lambda: False, "candidate": lambda: not candidate.killed, "another process": lambda: True}
    referee.probe = lambda: 5.0 if busy[left_by]() else 0.01
    referee.release = lambda held: None
    stopped = []
    monkeypatch.setattr(procs, "stop_tree", lambda pid: stopped.append(pid) or [pid])
    if left_by == "none":
        with referee.alone(reference, 0.05) as waited:
            assert waited == [0.0] and not candidate.killed
    elif left_by == "candidate":
        with pytest.raises(DeviceBusy, match="left on the device"):
            with referee.alone(reference, 0.05):
                pass
    else:
        with pytest.raises(RunnerFailed) as failed:
            with referee.alone(candidate, 0.05):
                pass
        assert failed.value.kind == "referee" and "another process" in failed.value.detail
    assert candidate.killed == candidate.ended == (left_by != "none") and not reference.killed
    assert leftovers == ([] if left_by == "none" else ["cleared"])
    assert stopped == ([1] if left_by == "another process" else [2])

"""One job on the referee: set up the task's reference, time it, then load, check and time the candidate.

Hardened: the reference is timed on batches of secret inputs before the candidate's module is loaded; the
candidate then runs the correctness trials (reference and candidate on the same fresh inputs, trial by trial, the
reference's outputs kept privately), replays the reference's timed batches (a sample of every timed output checked
against the reference's), and is profiled. kernelbench: KernelBench's trials and KernelBench's in-process timing
(the reference's once per task, before any candidate runs). The facts it returns are judged by concur.verify.checks.
"""

from __future__ import annotations

import contextlib
import secrets
import time

from concur.verify import checks, exchange, measure, timing
from concur.verify.reference import (
    FP64_MAX_BYTES,
    LOAD_FLOOR_S,
    PROFILE_EXTRA_S,
    SEED,
    CallFailed,
    ReferenceFailed,
    call_timeout,
    limit,
    load_message,
    mutated,
    ref_ask,
    ref_handoff,
    reference_side,
    task_for,
)
from concur.verify.runner import RunnerFailed

KEEP_PREVIOUS_BYTES = 1 << 30  # the previous trial's reference output is kept (for `other_inputs`) up to this size


def evaluate(referee, job: dict) -> dict:
    settings = job["settings"]
    start = time.perf_counter()
    facts: dict = {"device": referee.label, "trials": [], "stage_s": {}}
    stages = Stages(facts["stage_s"])
    candidate = None
    try:
        with stages("setup"):
            task = task_for(referee, job)
        facts["stage_s"].update({f"setup.{k}": v for k, v in task.setup_s.items()})  # the job that set it up
        task.setup_s = {}
        facts["baselines"] = task.baselines  # the reference's times under torch.compile (baselines.py)
        with stages("reference"):
            plan = (
                measure.time_reference(referee, task, settings)
                if task.mode == "hardened" and job.get("solution")
                else None
            )
        if not job.get("solution"):  # a probe of the task alone
            facts["degenerate"] = probe(referee, task, settings)
            return facts
        memory_mb = max(int(settings["memory_limit_mb"]), 2 * task.memory_mb)  # twice what the reference needs
        with stages("start"):
            candidate = referee.take(memory_mb, int(settings["max_processes"]))
        facts["sandbox"] = candidate.sandbox
        deadline = time.monotonic() + float(settings["timeout_s"])
        with stages("load"):
            loaded = load_candidate(referee, task, candidate, job, facts, deadline)
        if loaded:
            with stages("correctness"):
                passed = run_trials(referee, task, candidate, settings, facts, deadline)
            if passed:
                with stages("timing"):
                    measure.time_candidate(referee, task, candidate, job, facts, plan, deadline)
                facts["floor_ms"], facts["ref_hotspots"] = task.floor_ms, task.hotspots
    except ReferenceFailed as err:
        facts["reference_error"] = str(err)
    except CallFailed as err:  # the candidate answered a timing or hand-off command with an error
        facts["trials"].append({"number": len(facts["trials"]) + 1, "kind": "timing", "error": str(err)})
    except RunnerFailed as err:
        facts["failure"] = err.facts()
        if err.kind == "timeout":
            facts["failure"]["seconds"] = float(settings["timeout_s"]) if err.seconds <= 0 else err.seconds
    finally:
        with stages("end"):
            if candidate is not None:
                referee.dismiss(candidate)
        referee.refill()
        facts["gpu_s"] = time.perf_counter() - start
    return facts


class Stages:
    """Seconds spent per stage of a job (facts["stage_s"]): where a candidate's GPU time goes."""

    def __init__(self, into: dict):
        self.into = into

    @contextlib.contextmanager
    def __call__(self, name: str):
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - begin


def load_candidate(referee, task, candidate, job, facts, deadline) -> bool:
    program = candidate.folder / "solution.py"
    program.write_text(job["solution"])
    init = referee.stage(candidate, [task.init], "load")[0] if task.init else []
    message = load_message(job["settings"], "candidate", "ModelNew", program, init, job.get("build_dir"))
    reply = candidate.ask(message, "load", limit(deadline, LOAD_FLOOR_S))
    facts["load"] = {
        k: reply.get(k)
        for k in ("ok", "has_class", "error", "syntax_error", "build_error", "load_calls", "load_s", "init_s")
    }
    facts["counted_modules"] = reply.get("counted_modules", 0)
    return bool(reply.get("ok") and reply.get("has_class") and not reply.get("error"))


def trial_plan(settings: dict) -> list[tuple[int, int, str]]:
    """(number, seed, kind) per correctness trial. kernelbench: KernelBench's seeds (drawn one by one by
    torch.randint after manual_seed(42)); hardened: secret seeds, then `signed_trials` extra trials."""
    import torch

    n = int(settings["correctness_trials"])
    if settings["mode"] == "kernelbench":
        torch.manual_seed(SEED)
        seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(n)]
        return [(i + 1, s, "random") for i, s in enumerate(seeds)]
    plan = [(i + 1, secrets.randbits(62), "random") for i in range(n)]
    return plan + [(n + i + 1, secrets.randbits(62), "signed") for i in range(int(settings["signed_trials"]))]


def run_trials(referee, task, candidate, settings, facts, deadline) -> bool:
    """Reference then candidate on the same fresh inputs, trial by trial; stops at the first failure. The task's
    degenerate probe rides along on the reference's outputs (finished on the reference alone if the candidate
    fails early), once per task."""
    torch = referee.torch
    hardened = settings["mode"] == "hardened"
    plan, probe, calls, passed, done = trial_plan(settings), Probe(task, settings), 0, True, 0
    with contextlib.ExitStack() as stack:  # the pool stopped, once the calls are long (timing.slower_by_calls)
        for number, seed, kind in plan:
            done += 1
            values = referee.draw(task, seed, kind)
            ref = reference_outputs(referee, task, values, seed)
            probe.add(kind, ref, values)
            trial: dict = {"number": number, "kind": kind}
            facts["trials"].append(trial)
            if kind == "signed" and not all(torch.isfinite(r).all() for r in ref if isinstance(r, torch.Tensor)):
                trial["skipped"] = "reference output not finite on these inputs"
                continue
            specs = referee.stage(candidate, [values], "correctness")[0]
            first = number == 1  # its deadline has room for one-time set-up in forward; profiled (hardened)
            profiled = first and hardened
            begin = time.perf_counter()
            reply = candidate.ask(
                {"op": "call", "calls": [{"args": specs, "seed": seed}], "profile": profiled},
                "correctness",
                limit(deadline, call_timeout(task, 1, first=first) + (PROFILE_EXTRA_S if profiled else 0.0)),
                after_launch=call_timeout(task, 1) if first else None,
            )
            seconds = time.perf_counter() - begin
            facts.setdefault("call_s", []).append(seconds)
            if not reply.get("ok"):
                trial["error"] = reply.get("error")
                passed = False
                break
            if profiled:
                facts["profiled"] = reply.get("names")
            elif kind == "random":  # warm, unprofiled, on the inputs the timed batches draw from
                facts.setdefault("steady_call_s", []).append(seconds)
            if first and hardened and referee.device == "cuda" and timing.long_call(seconds, settings["timing_min_s"]):
                stack.enter_context(referee.quiet())
            calls += reply.get("kernel_calls", 0)
            facts["kernel_calls"] = calls
            metas = reply["outs"][0]
            trial["plain"] = all(m.get("plain", True) for m in metas) and all(m["t"] != "other" for m in metas)
            mismatch = checks.structure(metas, task.meta)
            if mismatch:
                kind_, _, detail = mismatch.partition(" ")
                trial.update(ok_shape=kind_ != "shape_mismatch", ok_dtype=False, detail=detail)
                passed = False
                break
            outputs, _ = referee.handoff(candidate, [metas], "correctness", limit(deadline, call_timeout(task, 1)))
            trial.update(checks.compare(outputs[0], ref, settings, strict_finite=hardened, leaf_scale=kind == "signed"))
            trial["mutated"] = mutated(torch, candidate, specs, values)
            if number == 1:  # last: the float64 reference's hand-off lands beside `ref` in the same arena
                begin = time.perf_counter()
                facts["precision"] = precision(referee, task, values, ref, outputs[0], seed)
                facts["stage_s"]["correctness.fp64"] = time.perf_counter() - begin
            if not checks.passes(trial) or trial["mutated"] and hardened:
                passed = False
                break
    if task.degenerate is None and not passed:
        for _, seed, kind in plan[done:]:
            if kind == "random":
                values = referee.draw(task, seed, kind)
                probe.add(kind, reference_outputs(referee, task, values, seed), values)
    if task.degenerate is None:
        task.degenerate = probe.kinds()
    facts["degenerate"] = task.degenerate
    return passed


class Probe:
    """Which trivial outputs pass the task's check on every random trial (checks.degenerate_kinds per trial)."""

    def __init__(self, task, settings: dict):
        self.task, self.settings, self.found, self.previous = task, settings, [], None

    def add(self, kind: str, ref: list, values: list) -> None:
        if kind != "random" or self.task.degenerate is not None:
            return
        self.found.append(checks.degenerate_kinds(ref, values, self.previous, self.settings))
        keep = self.task.output_bytes <= KEEP_PREVIOUS_BYTES
        self.previous = [r.clone() if hasattr(r, "clone") else r for r in ref] if keep else None

    def kinds(self) -> list[str]:
        return checks.degenerate_everywhere(self.found)


def reference_outputs(referee, task, values: list, seed: int) -> list:
    with reference_side():
        specs = referee.stage(task.runner, [values], "reference")[0]
    reply = ref_ask(task, {"op": "call", "calls": [{"args": specs, "seed": seed}]}, "reference")
    outputs, _ = ref_handoff(referee, task, reply["outs"])
    return outputs[0]  # views of the reference's output arena: valid until its next hand-off


def precision(referee, task, values, ref, new, seed) -> dict:
    """Errors of the float32 reference and of the candidate against the reference run in float64."""
    torch = referee.torch
    size = task.input_bytes + task.output_bytes
    if size > FP64_MAX_BYTES or not any(isinstance(r, torch.Tensor) and r.is_floating_point() for r in ref):
        return {"skipped": "too large or no floating output"}
    try:
        if task.has_double is None:
            task.has_double = bool(task.runner.ask({"op": "double"}, "reference", 600.0).get("ok"))
        if not task.has_double:
            return {"skipped": "the reference does not run in float64"}
        specs = referee.stage(task.runner, [values], "reference")[0]
        reply = task.runner.ask(
            {"op": "call", "calls": [{"args": specs, "seed": seed}], "fp64": True}, "reference", 600.0
        )
        if not reply.get("ok"):
            return {"skipped": f"float64 reference: {reply.get('error')}"}
        exact, _ = referee.handoff(
            task.runner, reply["outs"], "reference", 600.0, start=task.output_bytes + exchange.OUT_SLACK, grow=False
        )
    except CallFailed as err:
        return {"skipped": str(err)}
    except RunnerFailed as err:
        raise ReferenceFailed(str(err)) from None
    return {"e_ref": checks.relative_error(ref, exact[0]), "e_new": checks.relative_error(new, exact[0])}


def probe(referee, task, settings) -> list[str]:
    """The trivial outputs that pass this task's check on every random trial (a task alone, no candidate)."""
    if task.degenerate is None:
        found = Probe(task, settings)
        for _, seed, kind in trial_plan({**settings, "signed_trials": 0}):
            values = referee.draw(task, seed, kind)
            found.add(kind, reference_outputs(referee, task, values, seed), values)
        task.degenerate = found.kinds()
    return task.degenerate

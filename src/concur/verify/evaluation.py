"""One job on the referee: set up the task's reference, then load, check and time the candidate beside it.

Hardened: the candidate runs the correctness trials (reference and candidate on the same fresh inputs, trial by trial,
the reference's outputs kept privately); then the two take turns, a timed batch of the reference on secret inputs, then
the candidate's replay of it (a sample of every timed output checked against the reference's), each with the other
stopped; then the candidate is profiled. kernelbench: KernelBench's trials and KernelBench's in-process timing (the
reference's once per task, before any candidate runs). The report it returns (concur.verify.report) is judged by
concur.verify.verdict.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from concur.verify import comparisons, exchange, measure, modes, timing
from concur.verify.reference import (
    FP64_MAX_BYTES,
    LOAD_FLOOR_S,
    PROFILE_EXTRA_S,
    SEED,
    CallFailed,
    ReferenceFailed,
    TaskState,
    call_timeout,
    init_inputs,
    limit,
    load_message,
    mutated,
    ref_ask,
    ref_handoff,
    reference_side,
    task_for,
)
from concur.verify.report import Load, Precision, Report, Trial
from concur.verify.runner import Runner, RunnerFailed
from concur.verify.verdict import trial_settles

if TYPE_CHECKING:
    from concur.verify.referee import Referee

KEEP_PREVIOUS_BYTES = 1 << 30  # the previous trial's reference output is kept (for `other_inputs`) up to this size


@dataclass
class Bout:
    """One candidate's job on the referee, from its contestant's start to its end: what each of its steps reads."""

    referee: Referee
    task: TaskState
    candidate: Runner
    job: dict  # the orchestrator's payload: settings, solution, build_dir, own kernels, trace
    report: Report  # filled as the steps go
    deadline: float  # time.monotonic() at which the candidate's `timeout_s` runs out

    @property
    def settings(self) -> dict:
        return self.job["settings"]

    def limit(self, seconds: float) -> float:
        """A step's timeout: `seconds`, within the candidate's budget."""
        return limit(self.deadline, seconds)

    def call_limit(self, calls: int, first: bool = False, extra_s: float = 0.0) -> float:
        """A command of `calls` of the candidate's calls: its deadline (call_timeout: from the reference's time and
        the candidate's slowest correctness call so far but the first, which carries one-time set-up and the
        profiler) and `extra_s`, within the candidate's budget."""
        own_s = max(self.report.call_s[1:], default=0.0)
        return self.limit(call_timeout(self.task, calls, first, own_s) + extra_s)


def evaluate(referee: Referee, job: dict) -> Report:
    settings = job["settings"]
    start = time.perf_counter()
    facts = Report(device=referee.label)
    stages = Stages(facts.trace.setdefault("stage_s", {}) if job.get("trace") else {})
    candidate = None
    try:
        with stages("setup"):
            task = task_for(referee, job)
        stages.into.update({f"setup.{k}": v for k, v in task.setup_s.items()})  # the job that set it up
        task.setup_s = {}
        facts.baselines = task.baselines  # the reference's times under torch.compile (baselines.py)
        if not job.get("solution"):  # a probe of the task alone
            facts.degenerate = probe(referee, task, settings)
            return facts
        memory_mb = max(int(settings["memory_limit_mb"]), 2 * task.memory_mb)  # twice what the reference needs
        with stages("start"):
            candidate = referee.take(memory_mb, int(settings["max_processes"]))
        facts.sandbox = candidate.sandbox or ""
        bout = Bout(referee, task, candidate, job, facts, time.monotonic() + float(settings["timeout_s"]))
        with stages("load"):
            loaded = load_candidate(bout)
        if loaded:
            with stages("correctness"):
                passed = run_trials(bout, stages.into)
            if passed:
                with stages("timing"):
                    measure.time_candidate(bout)
                facts.floor_ms, facts.ref_hotspots = task.floor_ms, task.hotspots
    except ReferenceFailed as err:
        facts.reference_error = str(err)
    except CallFailed as err:  # the candidate answered a timing or hand-off command with an error
        facts.trials.append(Trial(len(facts.trials) + 1, "timing", error=str(err)))
    except RunnerFailed as err:
        facts.failure = err.failure()
        if err.kind == "timeout":
            facts.failure.seconds = float(settings["timeout_s"]) if err.seconds <= 0 else err.seconds
    finally:
        with stages("end"):
            if candidate is not None:
                referee.dismiss(candidate)
        referee.refill()
        facts.gpu_s = time.perf_counter() - start
    return facts


class Stages:
    """Seconds spent per stage of a job (traced: the report's trace["stage_s"]): where a candidate's GPU time
    goes."""

    def __init__(self, into: dict):
        self.into = into

    @contextlib.contextmanager
    def __call__(self, name: str):
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - begin


def load_candidate(bout: Bout) -> bool:
    referee, task, candidate, job, facts = bout.referee, bout.task, bout.candidate, bout.job, bout.report
    program = candidate.folder / "solution.py"
    program.write_text(job["solution"])
    init, init_program = init_inputs(referee, task, candidate, "load")
    settings, build_dir = job["settings"], job.get("build_dir")
    message = load_message(settings, "candidate", "ModelNew", program, init, build_dir, None, init_program)
    reply = candidate.ask(message, "load", bout.limit(LOAD_FLOOR_S))
    facts.load = Load(
        ok=bool(reply.get("ok")),
        has_class=bool(reply.get("has_class")),
        error=_text(reply.get("error")),
        syntax_error=bool(reply.get("syntax_error")),
        build_error=_text(reply.get("build_error")),
        load_calls=_number(reply.get("load_calls"), int),
        load_s=_number(reply.get("load_s"), float),
        init_s=_number(reply.get("init_s"), float),
    )
    facts.counted_modules = _number(reply.get("counted_modules"), int)
    return bool(reply.get("ok") and reply.get("has_class") and not reply.get("error"))


def _text(value) -> str | None:
    """A string the contestant sent, as a string (None stays None)."""
    return None if value is None else str(value)


def _number(value, kind):
    """A number the contestant sent, as `kind` (0 where it sent none, or something else)."""
    try:
        return kind(value or 0)
    except (TypeError, ValueError):
        return kind(0)


def trial_plan(settings: dict) -> list[tuple[int, int, str]]:
    """(number, seed, kind) per correctness trial. kernelbench: KernelBench's seeds (drawn one by one by
    torch.randint after manual_seed(42)); hardened: secret seeds, then `signed_trials` extra trials."""
    import torch

    n, mode = int(settings["correctness_trials"]), modes.of(settings)
    if not mode.secret_seeds:
        torch.manual_seed(SEED)
        seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(n)]
        plan = [(i + 1, s, "random") for i, s in enumerate(seeds)]
    else:
        plan = [(i + 1, secrets.randbits(62), "random") for i in range(n)]
    signed = int(settings["signed_trials"]) if mode.signed else 0
    return plan + [(n + i + 1, secrets.randbits(62), "signed") for i in range(signed)]


def run_trials(bout: Bout, stage_s: dict) -> bool:
    """Reference then candidate on the same fresh inputs, trial by trial; stops at the first trial that settles the
    verdict (concur.verify.verdict.trial_settles). The task's degenerate probe rides along on the reference's
    outputs (finished on the reference alone if the candidate fails early), once per task."""
    referee, task, candidate, settings, facts = bout.referee, bout.task, bout.candidate, bout.settings, bout.report
    torch, mode = referee.torch, modes.of(settings)
    plan, probe, calls, passed, done = trial_plan(settings), Probe(task, settings), 0, True, 0
    with contextlib.ExitStack() as stack:  # the pool stopped, once the calls are long (timing.slower_by_calls)
        for number, seed, kind in plan:
            done += 1
            values = referee.draw(task, seed, kind)
            ref = reference_outputs(referee, task, values, seed)
            probe.add(kind, ref, values)
            trial = Trial(number, kind)
            facts.trials.append(trial)
            if kind == "signed" and not all(torch.isfinite(r).all() for r in ref if isinstance(r, torch.Tensor)):
                trial.skipped = "reference output not finite on these inputs"
                continue
            specs = referee.stage(candidate, [values], "correctness")[0]
            first = number == 1  # its deadline has room for one-time set-up in forward; profiled (hardened)
            profiled = first and mode.profile
            begin = time.perf_counter()
            reply = candidate.ask(
                {"op": "call", "calls": [{"args": specs, "seed": seed}], "profile": profiled},
                "correctness",
                bout.call_limit(1, first=first, extra_s=PROFILE_EXTRA_S if profiled else 0.0),
                after_launch=call_timeout(task, 1) if first else None,
            )
            seconds = time.perf_counter() - begin
            facts.call_s.append(seconds)
            if not reply.get("ok"):
                trial.error = _text(reply.get("error")) or "the call failed"
                passed = False
                break
            if profiled:
                facts.profiled.append(reply.get("names"))
            elif kind == "random":  # warm, unprofiled, on the inputs the timed batches draw from
                facts.steady_call_s.append(seconds)
            long = timing.long_call(seconds, settings["timing_min_s"])
            if first and mode.batches and referee.device == "cuda" and long:
                stack.enter_context(referee.quiet())
            calls += _number(reply.get("kernel_calls"), int)
            facts.kernel_calls = calls
            metas = reply["outs"][0]
            trial.plain = all(m.get("plain", True) for m in metas) and all(m["t"] != "other" for m in metas)
            trial.comparison = comparisons.structure(metas, task.meta)
            if trial.comparison is not None:  # not laid out as the reference's outputs: nothing to hand off
                passed = False
                break
            outputs, _ = referee.handoff(candidate, [metas], "correctness", bout.call_limit(1))
            trial.comparison = comparisons.compare(
                outputs[0], ref, settings, strict_finite=mode.strict_finite, leaf_scale=kind == "signed"
            )
            trial.mutated = [i for i in mutated(torch, candidate, specs, values) if i not in task.writes]
            trial.unready = comparisons.unready(reply.get("taken"), outputs)
            if number == 1:  # last: the float64 reference's hand-off lands beside `ref` in the same arena
                begin = time.perf_counter()
                facts.precision = precision(referee, task, values, ref, outputs[0], seed)
                stage_s["correctness.fp64"] = time.perf_counter() - begin
            if trial_settles(trial, settings["mode"]):
                passed = False
                break
    if task.degenerate is None and not passed:
        for _, seed, kind in plan[done:]:
            if kind == "random":
                values = referee.draw(task, seed, kind)
                probe.add(kind, reference_outputs(referee, task, values, seed), values)
    if task.degenerate is None:
        task.degenerate = probe.kinds()
    facts.degenerate = task.degenerate
    return passed


class Probe:
    """Which trivial outputs pass the task's check on every random trial (comparisons.degenerate_kinds per trial)."""

    def __init__(self, task, settings: dict):
        self.task, self.settings, self.found, self.previous = task, settings, [], None

    def add(self, kind: str, ref: list, values: list) -> None:
        if kind != "random" or self.task.degenerate is not None:
            return
        self.found.append(comparisons.degenerate_kinds(ref, values, self.previous, self.settings))
        keep = self.task.output_bytes <= KEEP_PREVIOUS_BYTES
        self.previous = [r.clone() if hasattr(r, "clone") else r for r in ref] if keep else None

    def kinds(self) -> list[str]:
        return comparisons.degenerate_everywhere(self.found)


def reference_outputs(referee: Referee, task: TaskState, values: list, seed: int) -> list:
    with reference_side():
        specs = referee.stage(task.runner, [values], "reference")[0]
    reply = ref_ask(task, {"op": "call", "calls": [{"args": specs, "seed": seed}]}, "reference")
    outputs, _ = ref_handoff(referee, task, reply["outs"])
    task.writes.update(mutated(referee.torch, task.runner, specs, values))  # a candidate may change these too
    return outputs[0]  # views of the reference's output arena: valid until its next hand-off


def precision(referee: Referee, task: TaskState, values, ref, new, seed) -> Precision:
    """Errors of the float32 reference and of the candidate against the reference run in float64."""
    torch = referee.torch
    size = task.input_bytes + task.output_bytes
    if size > FP64_MAX_BYTES or not any(isinstance(r, torch.Tensor) and r.is_floating_point() for r in ref):
        return Precision(skipped="too large or no floating output")
    try:
        if task.has_double is None:
            task.has_double = bool(task.runner.ask({"op": "double"}, "reference", 600.0).get("ok"))
        if not task.has_double:
            return Precision(skipped="the reference does not run in float64")
        specs = referee.stage(task.runner, [values], "reference")[0]
        reply = task.runner.ask(
            {"op": "call", "calls": [{"args": specs, "seed": seed}], "fp64": True}, "reference", 600.0
        )
        if not reply.get("ok"):
            return Precision(skipped=f"float64 reference: {reply.get('error')}")
        exact, _ = referee.handoff(
            task.runner, reply["outs"], "reference", 600.0, start=task.output_bytes + exchange.OUT_SLACK, grow=False
        )
    except CallFailed as err:
        return Precision(skipped=str(err))
    except RunnerFailed as err:
        raise ReferenceFailed(str(err)) from None
    return Precision(comparisons.relative_error(ref, exact[0]), comparisons.relative_error(new, exact[0]))


def probe(referee: Referee, task: TaskState, settings) -> list[str]:
    """The trivial outputs that pass this task's check on every random trial (a task alone, no candidate)."""
    if task.degenerate is None:
        found = Probe(task, settings)
        for _, seed, kind in trial_plan({**settings, "signed_trials": 0}):
            values = referee.draw(task, seed, kind)
            found.add(kind, reference_outputs(referee, task, values, seed), values)
        task.degenerate = found.kinds()
    return task.degenerate

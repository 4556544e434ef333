"""The reference under torch.compile: the baselines besides eager that a candidate's speedup is also taken over
(`verify.baselines`).

Each is timed once per task and referee, while the task is set up and before any candidate of it runs: the task's
reference program loaded in a contestant of its own (the reference is trusted, but runs out of the referee's
process as eager does), made as eager's model is (seed 42, the same init inputs, the task's precision) and wrapped
in `torch.compile` with the baseline's inductor mode. Its first call, on the task's seed-42 inputs, compiles it:
that call's time is the compile cost, reported (`compile_s`, and the task's `setup.baseline.<name>.compile`
stage). Its outputs there must match eager's on the same inputs by the task's tolerance (a stochastic task's are
not compared), else the baseline has no time. It is then timed exactly as eager is: hardened, by
measure.time_reference (timed batches of secret inputs, the same clock, round trip and checks of every call's
layout); kernelbench, by KernelBench's own timing (`kb_time`), as KernelBench's measure_ref_program_time times a
compiled reference. A baseline that fails leaves the task and its other baselines alone: its speedups are NaN and
its `error` says why.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from concur.contracts import COMPILE_BASELINES
from concur.verify import comparisons, measure, timing
from concur.verify.reference import (
    REFERENCE_MEMORY_MB,
    SEED,
    CallFailed,
    Clock,
    ReferenceFailed,
    TaskState,
    init_inputs,
    kb_time_message,
    load_message,
    ref_ask,
    reference_side,
)
from concur.verify.report import Baseline, Times
from concur.verify.runner import RunnerFailed

if TYPE_CHECKING:
    from concur.verify.referee import Referee


def setup(referee: Referee, task: TaskState, settings: dict) -> None:
    """Time the task's reference under every compiled baseline in `settings["baselines"]` (eager is the task's own
    timing): `task.baselines[name]`, a report.Baseline."""
    for name in settings.get("baselines") or []:
        if name != "eager":
            task.baselines[name] = measure_baseline(referee, task, settings, name)


def measure_baseline(referee: Referee, task: TaskState, settings: dict, name: str) -> Baseline:
    clock = Clock(task.setup_s)
    found = Baseline()
    eager = task.runner
    runner = referee.take(REFERENCE_MEMORY_MB, 256)
    try:
        program = runner.folder / "reference.py"
        program.write_text(task.code)
        with reference_side():
            init, init_program = init_inputs(referee, task, runner, "reference")
        task.runner = runner  # every reference step below (ref_ask, measure.time_reference) runs the compiled one
        message = load_message(
            settings, "reference", "Model", program, init, None, COMPILE_BASELINES[name], init_program
        )
        reply = ref_ask(task, message, "reference")
        if reply.get("error") or not reply.get("has_class"):
            raise ReferenceFailed(reply.get("error") or "no Model")
        clock(f"baseline.{name}.load")
        values = referee.draw(task, SEED, "random")
        begin = time.perf_counter()
        compiled = one_call(referee, task, values)
        found.compile_s = time.perf_counter() - begin
        clock(f"baseline.{name}.compile")
        task.runner = eager
        expected = one_call(referee, task, values)
        task.runner = runner
        if not task.stochastic:
            compared = comparisons.compare(compiled, expected, settings, strict_finite=False)
            if not compared.passes():
                raise ReferenceFailed(f"compiled outputs differ from eager's: {compared.detail}")
        found.ref = time_baseline(referee, task, settings)
        clock(f"baseline.{name}.timing")
    except (ReferenceFailed, CallFailed, RunnerFailed) as err:
        found.error = str(err)
    finally:
        task.runner = eager
        referee.dismiss(runner)
    return found


def one_call(referee: Referee, task: TaskState, values: list) -> list:
    """The outputs of one call of the task's current reference runner on `values` (copies: the arena is reused)."""
    from concur.verify.evaluation import reference_outputs

    torch = referee.torch
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in reference_outputs(referee, task, values, SEED)]


def time_baseline(referee: Referee, task: TaskState, settings: dict) -> Times:
    """The current reference runner's time as eager's is taken (its timing summary)."""
    if task.mode.batches:
        return measure.time_reference(referee, task, settings).summary(task)
    values = referee.draw(task, SEED, "random")
    with reference_side():
        specs = referee.stage(task.runner, [values], "reference")[0]
    with referee.quiet():
        return timing.kernelbench_summary(ref_ask(task, kb_time_message(specs, settings), "reference")["times_ms"])

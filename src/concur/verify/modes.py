"""What each `verify.mode` does: every difference between `hardened` and `kernelbench`, decided here once.

The verifier's modules ask a `Mode` what to do (`of(settings)`) rather than testing the mode's name, so a
difference between the modes is one field here and the code that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    secret_seeds: bool  # correctness trials on seeds only the referee knows (else KernelBench's, from seed 42)
    signed: bool  # `signed_trials` trials on inputs of both signs, and signed draws among the timed calls
    strict_finite: bool  # a NaN or inf in the candidate's outputs fails
    batches: bool  # timed in batches of secret inputs on the referee's clock, every call checked (else KernelBench's
    # in-process timing of one input set, its mean the time)
    profile: bool  # the forward profiled (CUDA kernels: its own must run; CPU operators), its backend state read
    fixed_backend: bool  # both models under fixed backend flags (full float32 precision, no autotuning)
    cast_float32: bool  # floating inputs and models cast to float32 as KernelBench's default precision does
    screen: bool  # the static screen runs before any process
    strict_checks: bool  # the checks marked hardened-only in verdict.CHECKS apply
    speedup_stat: str  # the time a speedup divides: the quickest batch, or KernelBench's mean
    launch_core: bool  # on a GPU both sides launch from one core of their own (referee.timing_core; else, as
    # KernelBench's plain process, wherever the scheduler puts them)
    ready_check: bool  # a call is done when its outputs are ready on the caller's stream: calls are taken as they
    # return and checked (contestant.take, comparisons.unready; else KernelBench's device-wide synchronisation)


MODES = {
    "hardened": Mode(
        "hardened",
        secret_seeds=True,
        signed=True,
        strict_finite=True,
        batches=True,
        profile=True,
        fixed_backend=True,
        cast_float32=False,
        screen=True,
        strict_checks=True,
        speedup_stat="best_ms",
        launch_core=True,
        ready_check=True,
    ),
    "kernelbench": Mode(
        "kernelbench",
        secret_seeds=False,
        signed=False,
        strict_finite=False,
        batches=False,
        profile=False,
        fixed_backend=False,
        cast_float32=True,
        screen=False,
        strict_checks=False,
        speedup_stat="mean_ms",
        launch_core=False,
        ready_check=False,
    ),
}


def of(settings: dict) -> Mode:
    """The mode `settings["mode"]` names."""
    return MODES[settings["mode"]]

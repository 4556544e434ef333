"""Which of this machine's cores slow the verifier's launch core when they are busy.

A microsecond kernel's time is mostly its side's launches, at the pace of the core that makes them (the launch core,
referee.timing_core). On a virtual machine, cores the guest sees as separate can be hardware threads of one physical
core of the host, unseen (`lscpu` then says one thread a core), and the host may move them: a neighbour that spins
then slows the launch core's Python. This pins a pure-Python loop to the launch core and prints its pace alone,
with each other core spinning in turn (a process pinned there, as the referee spins on its doorbell), and with all of
them spinning, `--rounds` times, since the host may place its threads again between rounds. The launch core is the
one the first GPU's referee would use with `small_speedups.py`'s workers (`--core` to choose another; without a
GPU, the last core).

    python benchmarks/core_interference.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
LOOP_STEPS = 300_000  # about 10 ms of Python on a 2 GHz server core
BEST_OF = 7
SETTLE_S = 0.15  # a spinner's start-up, before the launch core is timed beside it


def pace_ms(core: int) -> float:
    """The quickest of BEST_OF runs of a fixed Python loop on `core` (this thread pinned there), in ms."""
    os.sched_setaffinity(0, [core])
    best = float("inf")
    for _ in range(BEST_OF):
        start, total = time.perf_counter(), 0
        for i in range(LOOP_STEPS):
            total += i & 7
        best = min(best, time.perf_counter() - start)
    return 1000.0 * best


def launch_core() -> int:
    """The verifier's launch core on a GPU machine (small_speedups.launch_core), else the last core."""
    from concur.verify.settings import visible_gpus

    if visible_gpus():
        from small_speedups import launch_core as gpu_launch_core

        return int(gpu_launch_core()[0])
    return sorted(os.sched_getaffinity(0))[-1]


def beside(core: int, busy_cores: list[int]) -> float:
    """The launch core's pace with a process spinning on each of `busy_cores`."""
    from small_speedups import busy

    spinners = busy(busy_cores)
    try:
        time.sleep(SETTLE_S)
        return pace_ms(core)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=int, help="the core to time (default: the verifier's launch core)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    main_core = launch_core() if args.core is None else args.core
    if main_core not in cores:
        raise SystemExit(f"--core {main_core}: not one of this process's cores {cores}")
    others = [c for c in cores if c != main_core]
    print(f"launch core {main_core}; a loop of {LOOP_STEPS} Python steps, the quickest of {BEST_OF}")
    print("| round | busy | ms | × alone |")
    print("|---:|---|---:|---:|")
    try:
        for number in range(1, args.rounds + 1):
            alone = pace_ms(main_core)
            print(f"| {number} | nothing | {alone:.2f} | 1.000 |", flush=True)
            for other in others:
                ms = beside(main_core, [other])
                print(f"| {number} | core {other} | {ms:.2f} | {ms / alone:.3f} |", flush=True)
            ms = beside(main_core, others)
            print(f"| {number} | all {len(others)} others | {ms:.2f} | {ms / alone:.3f} |", flush=True)
    finally:
        os.sched_setaffinity(0, cores)


if __name__ == "__main__":
    main()

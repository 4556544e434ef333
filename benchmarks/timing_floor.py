"""How steady a speedup can be on this GPU without the referee: the fixture kernels and eager timed in plain
processes, one fresh process per run, with nothing between the two models but a cache flush.

Each run times `--batches` batches of `--calls` calls of eager, then of the kernel (inputs drawn fresh on the GPU,
the cache flushed, the host clock and CUDA events around the batch), then copies the outputs once more (what a
hand-off costs), and prints the CV over runs of the ratio of medians. Compare with verify_throughput.py's CV: the gap
is what the referee's process boundary and hand-offs add.

    python benchmarks/timing_floor.py --runs 8 --variants fast,fast_vec
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tests" / "fixtures" / "verify_cuda" / "task_relu_add.py"


def one_run(variant: str, batches: int, calls: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from verify_cuda_solutions import solution

    task, program = {}, {}
    exec(compile(TASK.read_text(), str(TASK), "exec"), task)
    exec(compile(solution(variant), f"{variant}.py", "exec"), program)
    init = task["get_init_inputs"]()
    models = {"ref": task["Model"](*init).cuda(), "new": program["ModelNew"](*init).cuda()}
    flush = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")

    def batch(model) -> tuple[float, float, float]:
        with torch.device("cuda"):
            inputs = [task["get_inputs"]() for _ in range(calls)]
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin = time.perf_counter()
        start.record()
        outputs = [model(*args) for args in inputs]
        end.record()
        torch.cuda.synchronize()
        wall = time.perf_counter() - begin
        begin = time.perf_counter()
        copies = [out.clone() for out in outputs]
        torch.cuda.synchronize()
        del copies
        return 1000 * wall / calls, start.elapsed_time(end) / calls, 1000 * (time.perf_counter() - begin)

    for _ in range(3):
        batch(models["ref"]), batch(models["new"])
    return {side: [batch(model) for _ in range(batches)] for side, model in models.items()}


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--variants", type=lambda text: text.split(","), default=["fast", "fast_vec"])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument(
        "--calls", type=int, default=21, help="calls per batch (the referee's for this task on an H100)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.batches, args.calls)))
        return
    # the kernels are built once per invocation, in a folder of its own: a build lock left in torch's shared cache
    # by a run that was cut off would make every later run wait on it
    builds = tempfile.mkdtemp(prefix="timing-floor-")
    env = {"TORCH_EXTENSIONS_DIR": builds, **os.environ}
    found, rows = {}, []
    for variant in args.variants:
        runs = []
        for _ in range(args.runs):
            cmd = [
                sys.executable,
                __file__,
                "--one",
                variant,
                "--batches",
                str(args.batches),
                "--calls",
                str(args.calls),
            ]
            runs.append(
                json.loads(
                    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1]
                )
            )
            print(f"{variant}: run {len(runs)} of {args.runs}", file=sys.stderr, flush=True)
        found[variant] = runs
        medians = {
            clock: [[statistics.median(b[i] for b in run[side]) for side in ("ref", "new")] for run in runs]
            for i, clock in enumerate(("host clock", "CUDA events", "copy"))
        }
        for clock in ("host clock", "CUDA events"):
            speedups = [ref / new for ref, new in medians[clock]]
            rows.append(
                (
                    variant,
                    clock,
                    100 * cv(speedups),
                    statistics.fmean(speedups),
                    100 * cv([n for _, n in medians[clock]]),
                )
            )
        rows.append((variant, "output copy", float("nan"), float("nan"), 100 * cv([n for _, n in medians["copy"]])))
    shutil.rmtree(builds, ignore_errors=True)
    print(f"{args.runs} fresh processes per kernel, {args.batches} batches of {args.calls} calls per model")
    print(f"{'kernel':<10}{'clock':<14}{'speedup CV':>12}{'speedup':>10}{'kernel time CV':>16}")
    for variant, clock, spread, mean, own in rows:
        print(f"{variant:<10}{clock:<14}{spread:>11.2f}%{mean:>10.3f}{own:>15.2f}%")
    if args.out:
        args.out.write_text(json.dumps(found))


if __name__ == "__main__":
    main()

"""How steady a speedup can be on this GPU without the referee: the fixture kernels and eager timed in plain
processes, one fresh process per run, with nothing between the two models but a cache flush.

Each run times `--batches` batches of `--calls` calls of eager, then of the kernel (inputs drawn fresh on the GPU,
the cache flushed, the host clock and CUDA events around the batch), then copies the outputs once more (what a
hand-off costs), and prints the CV over runs of the ratio of medians. Compare with verify_throughput.py's CV: the gap
is what the referee's process boundary and hand-offs add. `--setups` adds what a contestant has and a plain
process lacks, one at a time: `cupti` starts the CUDA profiler once before timing (as hardened contestants do at
start), `block` draws every batch's inputs into one block allocated once by torch, `driver` into one raw driver
allocation of the process's own, `ipc` into one that another process allocated and shared (the referee's input
arena, as a contestant sees it).

    python benchmarks/timing_floor.py --runs 8 --variants fast,fast_vec --setups plain,cupti,block,driver,ipc
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
SETUPS = ("plain", "cupti", "block", "driver", "ipc")
ARENA_ENV = "CONCUR_FLOOR_ARENA"


def one_run(variant: str, batches: int, calls: int, setup: str = "plain") -> dict:
    import torch

    if setup == "cupti":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            torch.empty(1, device="cuda").add_(1)

    sys.path.insert(0, str(ROOT / "tests"))
    from verify_cuda_solutions import solution

    task, program = {}, {}
    exec(compile(TASK.read_text(), str(TASK), "exec"), task)
    exec(compile(solution(variant), f"{variant}.py", "exec"), program)
    init = task["get_init_inputs"]()
    models = {"ref": task["Model"](*init).cuda(), "new": program["ModelNew"](*init).cuda()}
    flush = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    block = input_block(setup, calls * sum(x.numel() for x in task["get_inputs"]()))

    def batch(model) -> tuple[float, float, float]:
        with torch.device("cuda"):
            inputs = [task["get_inputs"]() for _ in range(calls)]
        if block is not None:  # the same values, moved into views of the one block
            views, at = [], 0
            for call in inputs:
                views.append([])
                for x in call:
                    views[-1].append(block[at : at + x.numel()].view(x.shape).copy_(x))
                    at += x.numel()
            inputs = views
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


def input_block(setup: str, floats: int):
    """The float32 buffer every batch's inputs are moved into (None: they stay where get_inputs made them)."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from concur.verify import exchange

    if setup == "block":
        return torch.empty(floats, device="cuda")
    if setup == "driver":
        torch.empty(1, device="cuda")  # torch's context current for the driver call
        return exchange._device_bytes(exchange.driver().alloc(4 * floats), 4 * floats).view(torch.float32)
    if setup == "ipc":
        torch.empty(1, device="cuda")
        mapped = exchange.Mapped(json.loads(os.environ[ARENA_ENV]), [])
        return mapped.bytes[: 4 * floats].view(torch.float32)
    return None


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def table_rows(name: str, runs: list[dict]) -> list[tuple]:
    """Per clock: the speedup's CV over runs, its mean, and the CV of the kernel's own median time."""
    medians = {
        clock: [[statistics.median(b[i] for b in run[side]) for side in ("ref", "new")] for run in runs]
        for i, clock in enumerate(("host clock", "CUDA events", "copy"))
    }
    rows = []
    for clock in ("host clock", "CUDA events"):
        speedups = [ref / new for ref, new in medians[clock]]
        own = 100 * cv([n for _, n in medians[clock]])
        rows.append((name, clock, 100 * cv(speedups), statistics.fmean(speedups), own))
    rows.append((name, "output copy", float("nan"), float("nan"), 100 * cv([n for _, n in medians["copy"]])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--variants", type=lambda text: text.split(","), default=["fast", "fast_vec"])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument(
        "--calls", type=int, default=21, help="calls per batch (the referee's for this task on an H100)"
    )
    parser.add_argument("--setups", type=lambda text: text.split(","), default=["plain"], help=", ".join(SETUPS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if set(args.setups) - set(SETUPS):
        parser.error(f"--setups: each one of {', '.join(SETUPS)}")
    if args.one:
        variant, setup = args.one.split(":")
        print(json.dumps(one_run(variant, args.batches, args.calls, setup)))
        return
    # the kernels are built once per invocation, in a folder of its own: a build lock left in torch's shared cache
    # by a run that was cut off would make every later run wait on it
    builds = tempfile.mkdtemp(prefix="timing-floor-")
    env = {"TORCH_EXTENSIONS_DIR": builds, **os.environ}
    if "ipc" in args.setups:  # shared by this process, as the referee shares its arenas
        sys.path.insert(0, str(ROOT / "src"))
        import torch

        from concur.verify import exchange

        torch.empty(1, device="cuda")
        arena = exchange.Arena("cuda", 4 * args.calls * (2 << 24))  # the fixture task's two 4096x4096 inputs
        env[ARENA_ENV] = json.dumps(arena.share()[0])
    found, rows = {}, []
    for variant in args.variants:
        for setup in args.setups:
            runs = []
            for _ in range(args.runs):
                cmd = [sys.executable, __file__, "--one", f"{variant}:{setup}"]
                cmd += ["--batches", str(args.batches), "--calls", str(args.calls)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                runs.append(json.loads(done.stdout.splitlines()[-1]))
                print(f"{variant}, {setup}: run {len(runs)} of {args.runs}", file=sys.stderr, flush=True)
            found[f"{variant}:{setup}"] = runs
            rows += table_rows(f"{variant}, {setup}", runs)
    shutil.rmtree(builds, ignore_errors=True)
    print(f"{args.runs} fresh processes per kernel, {args.batches} batches of {args.calls} calls per model")
    print(f"{'kernel':<18}{'clock':<14}{'speedup CV':>12}{'speedup':>10}{'kernel time CV':>16}")
    for name, clock, spread, mean, own in rows:
        print(f"{name:<18}{clock:<14}{spread:>11.2f}%{mean:>10.3f}{own:>15.2f}%")
    if args.out:
        args.out.write_text(json.dumps(found))


if __name__ == "__main__":
    main()

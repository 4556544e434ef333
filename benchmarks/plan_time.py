"""How long `snakemake -n` takes on the paper's config at KernelBook scale (target: <= 15 s on 2 cores).

Writes a synthetic KernelBook-shaped parquet (entry-point classes, `[args, kwargs]` init inputs) and a small
KernelBench folder into a temporary directory, points configs/paper.yaml's task sources at them with --config, and
times the dry run; the default config is timed alongside. With --stage it also times the tasks stage's own work on
the same data in-process (loading, normalising, dedupe, contamination; references are not run).

    .venv/bin/python benchmarks/plan_time.py [--tasks 18162] [--repeats 3] [--stage]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
UNARY = [
    "torch.relu",
    "torch.sigmoid",
    "torch.tanh",
    "torch.exp",
    "torch.abs",
    "torch.sin",
    "torch.cos",
    "F.gelu",
    "F.silu",
    "F.softplus",
    "torch.neg",
    "torch.square",
]
BINARY = ["+", "-", "*"]
REDUCE = ["sum", "mean", "amax", "amin"]


def synthetic_program(rng: random.Random, class_name: str) -> tuple[str, str]:
    """A KernelBook-like module: a random chain of ops, a `scale` keyword init argument, [args, kwargs] inputs."""
    lines = ["y = x"]
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.5:
            lines.append(f"y = {rng.choice(UNARY)}(y)")
        elif kind < 0.85:
            lines.append(f"y = y {rng.choice(BINARY)} self.scale")
        else:
            lines.append(f"y = y.{rng.choice(REDUCE)}(dim={rng.randint(0, 1)}, keepdim=True)")
    body = "\n        ".join(lines)
    shape = [rng.choice([4, 8, 16]) for _ in range(rng.randint(2, 4))]
    code = f"""import torch
import torch.nn as nn
import torch.nn.functional as F


class {class_name}(nn.Module):

    def __init__(self, scale=1.0):
        super({class_name}, self).__init__()
        self.scale = scale

    def forward(self, x):
        {body}
        return y


def get_inputs():
    return [torch.rand({shape})]


def get_init_inputs():
    return [[], {{'scale': {rng.choice([0.5, 1.0, 2.0, 3.0])}}}]
"""
    return code, class_name


def write_kernelbook(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        code, entry = synthetic_program(rng, f"Module{i}")
        rows.append(
            {
                "entry_point": entry,
                "python_code": code,
                "uuid": i,
                "repo_name": f"synthetic/repo{i % 997}",
                "module_name": entry,
                "synthetic": True,
                "licenses": ["MIT"],
                "stars": 0,
                "sha": "0" * 40,
                "triton_code": "",
            }
        )
    pd.DataFrame(rows).to_parquet(path, index=False)


def write_kernelbench(root: Path, per_level: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for level in (1, 2):
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        for i in range(1, per_level + 1):
            code, _ = synthetic_program(rng, "Model")
            code = code.replace("return [[], {'scale': ", "return [").replace("}]\n", "]\n")
            (folder / f"{i}_Synthetic{level}x{i}.py").write_text(code)


def time_command(args: list[str], repeats: int) -> tuple[float, int]:
    """Median wall seconds over `repeats` runs, and the job count of the plan."""
    times, jobs = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"plan_time: {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        jobs = int(proc.stdout.split("Job stats:")[1].split("total")[1].split()[0])
    return statistics.median(times), jobs


def time_stage(kernelbook: Path, kernelbench: Path) -> float:
    sys.path.insert(0, str(ROOT / "src"))
    from concur.tasks import build_tasks

    start = time.perf_counter()
    build_tasks(
        [
            {"kind": "kernelbook", "path": str(kernelbook), "split": "train"},
            {"kind": "kernelbench", "path": str(kernelbench), "split": "eval", "levels": [1, 2]},
        ],
        {"validate_run": False},
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=18162, help="synthetic KernelBook programs")
    parser.add_argument("--eval-per-level", type=int, default=100, help="synthetic KernelBench programs per level")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage", action="store_true", help="also time the tasks stage's work (no reference runs)")
    args = parser.parse_args()
    snakemake = [sys.executable, "-m", "snakemake", "-n", "--cores", "2"]
    with tempfile.TemporaryDirectory(prefix="concur-plan-") as tmp:
        tmp = Path(tmp)
        kernelbook, kernelbench = tmp / "kernelbook.parquet", tmp / "kb"
        write_kernelbook(kernelbook, args.tasks)
        write_kernelbench(kernelbench, args.eval_per_level)
        sources = [
            {"kind": "kernelbook", "path": str(kernelbook), "split": "train"},
            {"kind": "kernelbench", "path": str(kernelbench), "split": "eval", "levels": [1, 2]},
        ]
        # --config turns nested numbers into strings: the override names no levels (the folder holds only 1 and 2)
        override = "tasks=" + json.dumps({"sources": [{k: v for k, v in s.items() if k != "levels"} for s in sources]})
        rows = [
            (
                "default config.yaml (builtin suite)",
                20,
                *time_command(snakemake + ["--config", f"results={tmp}/default"], args.repeats),
            ),
            (
                "configs/paper.yaml (synthetic KernelBook + KernelBench)",
                args.tasks + 2 * args.eval_per_level,
                *time_command(
                    snakemake + ["--configfile", "configs/paper.yaml", "--config", f"results={tmp}/paper", override],
                    args.repeats,
                ),
            ),
        ]
        print(f"\n{'plan':<58} {'tasks':>7} {'jobs':>6} {'median s':>9}")
        for name, tasks, seconds, jobs in rows:
            print(f"{name:<58} {tasks:>7} {jobs:>6} {seconds:>9.2f}")
        if args.stage:
            seconds = time_stage(kernelbook, kernelbench)
            print(
                f"{'tasks stage in-process (load, dedupe, contamination)':<58} "
                f"{args.tasks + 2 * args.eval_per_level:>7} {'-':>6} {seconds:>9.2f}"
            )


if __name__ == "__main__":
    main()

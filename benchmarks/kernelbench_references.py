"""Every KernelBench problem of the chosen levels (default 1 and 2; level 3's whole models too, `--levels 3`) at its
current size through the verifier, with a pure-PyTorch candidate.

The candidate of each problem is the reference program itself with `ModelNew = Model`: an honest solution that
KernelBench's own harness accepts. In `kernelbench` mode all of them must come back correct and none may be killed
for memory; the probe's degenerate tasks (a trivial output passes the check) are listed. Problems go in chunks, each
chunk's verdicts appended to the output table, so a run cut short keeps what it finished, and a rerun with the same
--out goes on where it stopped (`--budget-s` stops starting chunks after that long). `--precision fp16|bf16` runs
the tasks in that precision (inputs and both models' weights cast to it, KernelBench's tolerance for it); the table
records it per row, and a rerun into a table of another precision stops. `--only 4,8` takes those problem numbers of
each level (a quick check: `--device cpu --levels 3 --only 4,8`).

    python benchmarks/kernelbench_references.py --kernelbench .bench/KernelBench --out results/bench/kb_refs.csv
    python benchmarks/kernelbench_references.py --kernelbench .bench/KernelBench --levels 3 --chunk 5 \
        --out results/bench/kb_refs_l3.csv
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from verify_frames import candidates_frame, tasks_frame  # noqa: E402

from concur.verify import compile_frame, verify_frame  # noqa: E402


def problems(root: Path, levels: list[int], only: set[int] | None = None) -> list[tuple[str, str]]:
    """(task_id, program) of every problem file of the levels (of the problem numbers `only`), in problem order."""
    found = []
    for level in levels:
        folder = root / "KernelBench" / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(f"{folder} is missing")
        files = sorted(folder.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
        found += [(f"L{level}/{p.stem}", p.read_text()) for p in files if not only or int(p.name.split("_")[0]) in only]
    return found


class MemoryWatch:
    """The most device memory in use (all processes) seen while it runs, sampled every half second."""

    def __init__(self):
        import torch

        self.torch, self.peak_gb, self.running = torch, 0.0, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            free, total = self.torch.cuda.mem_get_info()
            self.peak_gb = max(self.peak_gb, (total - free) / 2**30)
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernelbench", type=Path, required=True, help="a KernelBench checkout (its KernelBench/)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--limit", type=int, default=0, help="only the first N problems (0: all)")
    parser.add_argument("--budget-s", type=float, default=0, help="stop starting chunks after this long (0: none)")
    parser.add_argument("--timing-trials", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of small problems")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="the tasks' precision")
    parser.add_argument("--only", default="", help="comma-separated problem numbers, in each level (default: all)")
    args = parser.parse_args()

    only = {int(x) for x in args.only.split(",") if x.strip()}
    found = problems(args.kernelbench, args.levels, only)[: args.limit or None]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.exists():
        earlier = pd.read_csv(args.out)
        other = set(earlier.get("precision", pd.Series(["fp32"])).fillna("fp32")) - {args.precision}
        if other:
            raise SystemExit(f"{args.out} holds {', '.join(sorted(other))} verdicts: give another --out")
        done = set(earlier["task_id"])
    todo = [p for p in found if p[0] not in done]
    settings = {
        "device": args.device,
        "mode": "kernelbench",
        "workers": 2,
        "timing_trials": args.timing_trials,
        "build_cache": str(args.out.parent / "kb-refs-cache"),
    }
    watch = MemoryWatch() if args.device == "cuda" else type("NoWatch", (), {"peak_gb": 0.0})()
    start = time.perf_counter()
    for begin in range(0, len(todo), args.chunk):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget spent: {len(todo) - begin} problems not run", flush=True)
            break
        chunk = todo[begin : begin + args.chunk]
        tasks = tasks_frame(chunk, precision=args.precision)
        candidates = candidates_frame([(task_id, task_id, code + "\n\nModelNew = Model\n") for task_id, code in chunk])
        work = args.out.parent / "kb-refs-work"
        builds = compile_frame(candidates, settings, work, progress=False, tasks=tasks)
        verdicts = verify_frame(candidates, tasks, settings, work, progress=False, builds=builds)
        verdicts = verdicts.assign(precision=args.precision)
        verdicts.to_csv(args.out, mode="a", header=not args.out.exists(), index=False)
        print(
            f"{begin + len(chunk)}/{len(todo)} problems, {time.perf_counter() - start:.0f} s, peak "
            f"{watch.peak_gb:.1f} GiB: {verdicts['status'].value_counts().to_dict()}",
            flush=True,
        )
    watch.running = False
    table = pd.read_csv(args.out)
    memory = table["reason"].astype("string").fillna("").str.contains("memory")
    degenerate = table[~table["trusted"]]
    print(
        f"\nproblems: {len(table)} ({args.precision})  correct: {int(table['correct'].sum())}  killed for memory: "
        f"{int(memory.sum())}  peak device memory: {watch.peak_gb:.1f} GiB"
    )
    print(table["status"].value_counts().to_string())
    for row in table[~table["correct"]].itertuples():
        print(f"not correct: {row.task_id}: {row.status}: {row.reason}")
    print(f"degenerate tasks ({len(degenerate)}):")
    for row in degenerate.itertuples():
        print(f"  {row.task_id}: {row.flags}")
    print(
        f"eval seconds per problem: mean {table['eval_s'].mean():.2f}, max {table['eval_s'].max():.1f} "
        f"({table.loc[table['eval_s'].idxmax(), 'task_id']})"
    )


if __name__ == "__main__":
    main()

"""Verification on 1, 2, ... GPUs of one node: the same builds verified with each GPU count, side by side in one run.

    python benchmarks/verify_gpus.py --config CONFIG --candidates CANDS.parquet --tasks TASKS.parquet --gpus 1 2

The candidates are compiled once (`concur compile`, the CPU pool; `--gpus` with no count compiles only), then
`concur verify` checks and times them with CUDA_VISIBLE_DEVICES set to the first N GPUs (one referee a GPU, its turns
exclusive on that GPU). The table gives the verify wall time, the candidates' time on the referees, candidates per
hour, the speedup over the first GPU count and its bound, and how many verdicts (status and correctness) match the
first count's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
KEPT = ["status", "correct"]  # what must agree between GPU counts (times differ)


def concur(*args: str, gpus: str | None = None) -> float:
    """Run one `concur` step in a child process; its wall time in seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "concur.cli", *args], check=True, env=env)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--candidates", required=True)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--gpus", type=int, nargs="*", default=[1, 2], help="none: compile only")
    parser.add_argument("--workdir", default="results/bench/verify_gpus")
    args = parser.parse_args(argv)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    common = ["--config", args.config, "--candidates", args.candidates, "--tasks", args.tasks]
    builds = work / "builds.parquet"
    if not builds.exists():  # a workdir keeps its builds: later GPU counts can run in another call
        compile_s = concur("compile", *common, "--out", str(builds), "--workdir", str(work / "compile"))
        print(f"compiled in {compile_s:.0f} s", flush=True)
    times = work / "times.json"
    seconds_of = json.loads(times.read_text()) if times.exists() else {}
    for count in args.gpus:
        seconds_of[str(count)] = concur(
            "verify",
            *common,
            "--builds",
            str(builds),
            "--out",
            str(work / f"verified_{count}.parquet"),
            "--workdir",
            str(work / f"v{count}"),
            gpus=",".join(str(i) for i in range(count)),
        )
        times.write_text(json.dumps(seconds_of))
        print(f"{count} GPU(s): verified in {seconds_of[str(count)]:.0f} s", flush=True)
    if seconds_of:
        table(work, seconds_of)


def table(work: Path, seconds_of: dict) -> None:
    """Every GPU count verified in this workdir so far, against the fewest. `referee s`: the candidates' own time on
    the referees (their `eval_s`), the rest of the first count's wall time being the job's fixed part (start,
    references); `bound`: the most the count could gain over the first, that fixed part kept and the referees'
    time split evenly (never below the longest candidate)."""
    counts = sorted(int(c) for c in seconds_of)
    first = pd.read_parquet(work / f"verified_{counts[0]}.parquet").set_index("candidate_id")
    base = seconds_of[str(counts[0])]
    fixed = max(0.0, base - float(first["eval_s"].sum()) / counts[0])
    print("| GPUs | candidates | correct | verify s | referee s | candidates/hour | vs first | bound | same verdicts |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for count in counts:
        verdicts = pd.read_parquet(work / f"verified_{count}.parquet").set_index("candidate_id")
        same = int((verdicts[KEPT].reindex(first.index) == first[KEPT]).all(axis=1).sum())
        seconds, n, busy = seconds_of[str(count)], len(verdicts), float(verdicts["eval_s"].sum())
        bound = base / (fixed + max(busy / count, float(verdicts["eval_s"].max())))
        print(
            f"| {count} | {n} | {int(verdicts['correct'].sum())} | {seconds:.0f} | {busy:.0f} "
            f"| {n / seconds * 3600:,.0f} | {base / seconds:.2f}x | {bound:.2f}x | {same}/{n} |"
        )


if __name__ == "__main__":
    main()

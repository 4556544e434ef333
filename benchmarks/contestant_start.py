"""How a GPU referee's pool of contestants keeps up with its jobs, by the pool's size (`verify.workers`).

The whole pool starts at once, each contestant on the spare cores (a CUDA context, and CUPTI in hardened mode: seconds
of CPU each). Each size runs in a fresh process: a referee of the hardened kind, then `--takes` jobs simulated one
every `--every` seconds, the first half of each with the pool stopped as timing stops it (`quiet`). Printed per size:
the referee's start, what the first take waited (the first job), and the waits of later takes (mean and max: a pool
that runs dry makes a job wait a whole start).

    python benchmarks/contestant_start.py --workers 4,8,16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def one_setting(workers: int, takes: int, every: float, profiler: bool, device: str) -> dict:
    from concur.verify.referee import Referee

    work = tempfile.mkdtemp(prefix="contestant-start-")
    hello = {
        "device": device,
        "workdir": work,
        "cache_root": work,
        "threads": 1,
        "workers": workers,
        "profiler": profiler,
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    begin = time.perf_counter()
    referee = Referee(hello)
    made = time.perf_counter() - begin
    waits = []
    try:
        for _ in range(takes):
            asked = time.perf_counter()
            runner = referee.take(16384, 64)
            waits.append(time.perf_counter() - asked)
            with referee.quiet():
                time.sleep(every / 2)
            time.sleep(every / 2)
            referee.dismiss(runner)
            referee.refill()
    finally:
        referee.close()
    return {"workers": workers, "referee_s": made, "waits": waits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=lambda text: [int(x) for x in text.split(",")], default=[4, 8, 16])
    parser.add_argument("--takes", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.7, help="seconds between takes (a job, half of it timed)")
    parser.add_argument("--no-profiler", action="store_true", help="kernelbench-mode contestants (no CUPTI)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        found = one_setting(args.one, args.takes, args.every, not args.no_profiler, args.device)
        print(json.dumps(found))
        return
    results = []
    for workers in args.workers:
        cmd = [sys.executable, __file__, "--one", str(workers)]
        cmd += ["--takes", str(args.takes), "--every", str(args.every), "--device", args.device]
        cmd += ["--no-profiler"] * args.no_profiler
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.splitlines()[-1]))
        print(f"workers {workers}: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    print(f"a take every {args.every} s, {args.takes} takes, profiler {not args.no_profiler}")
    heads = [("workers", 8), ("referee s", 11), ("first take s", 14), ("later mean s", 14), ("later max s", 13)]
    print("".join(f"{name:>{width}}" for name, width in heads))
    for r in results:
        later = r["waits"][1:] or [0.0]
        print(
            f"{r['workers']:>8}{r['referee_s']:>11.2f}{r['waits'][0]:>14.2f}{statistics.fmean(later):>14.3f}"
            f"{max(later):>13.3f}"
        )
    if args.out:
        args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()

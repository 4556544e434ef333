"""How fast a GPU referee's pool of contestants gets going, by how many of them start at once (referee.STARTING).

Each setting runs in a fresh process: a referee of the hardened kind (CUDA, CUPTI started in every contestant) with a
pool of `--workers`, then `--takes` jobs simulated one every `--every` seconds, the first half of each spent with the
pool stopped as timing stops it (`quiet`). Printed per setting: how long the first contestant took to be ready (what
the first job waits), the wait of later takes (mean and max), and when the pool was first full and ready.

    python benchmarks/contestant_start.py --starting 2,4,16
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


def one_setting(starting: int, workers: int, takes: int, every: float, profiler: bool, device: str) -> dict:
    from concur.verify import referee as referee_module

    referee_module.STARTING = starting
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
    referee = referee_module.Referee(hello)
    made = time.perf_counter() - begin
    waits, full_at = [], None
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
            if full_at is None and len(referee.pool) == workers and all(r.started() for r in referee.pool):
                full_at = time.perf_counter() - begin
    finally:
        referee.close()
    return {"starting": starting, "referee_s": made, "waits": waits, "full_at_s": full_at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starting", type=lambda text: [int(x) for x in text.split(",")], default=[2, 4, 16])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--takes", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.7, help="seconds between takes (a job, half of it timed)")
    parser.add_argument("--no-profiler", action="store_true", help="kernelbench-mode contestants (no CUPTI)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        found = one_setting(args.one, args.workers, args.takes, args.every, not args.no_profiler, args.device)
        print(json.dumps(found))
        return
    results = []
    for starting in args.starting:
        cmd = [sys.executable, __file__, "--one", str(starting), "--workers", str(args.workers)]
        cmd += ["--takes", str(args.takes), "--every", str(args.every), "--device", args.device]
        cmd += ["--no-profiler"] * args.no_profiler
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.splitlines()[-1]))
        print(f"starting {starting}: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    print(f"pool of {args.workers}, a take every {args.every} s, {args.takes} takes, profiler {not args.no_profiler}")
    print(
        f"{'starting':>9}{'referee s':>11}{'first take s':>14}{'later mean s':>14}{'later max s':>13}{'full at s':>11}"
    )
    for r in results:
        later = r["waits"][1:] or [0.0]
        full = f"{r['full_at_s']:.1f}" if r["full_at_s"] is not None else "never"
        print(
            f"{r['starting']:>9}{r['referee_s']:>11.2f}{r['waits'][0]:>14.2f}{statistics.fmean(later):>14.3f}"
            f"{max(later):>13.3f}{full:>11}"
        )
    if args.out:
        args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()

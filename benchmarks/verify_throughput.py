"""Verifier throughput on a GPU machine: compile on the CPU pool, then check and time on the GPU.

Prints one table with the issue's targets next to what was measured, side by side in one run:
  GPU-seconds per candidate (verify wall time / candidates, one GPU)      target <= 3
  candidates per hour on the node (compile and verify overlapped, as the workflow's CPU and GPU jobs are)
                                                                         target >= 500
  coefficient of variation of one kernel's speedup over repeated runs    target <= 2 %
Candidates: a level-1 elementwise task and a level-2 GEMM task, honest fast/slow, wrong and cheating kernels;
each carries a unique extension name, so every build is cold, as it is for model-written candidates.

    python benchmarks/verify_throughput.py --candidates 16 --repeats 10 --out results/bench/verify.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import verify_frames  # noqa: E402
from verify_cuda_solutions import solution  # noqa: E402

from concur.verify import api, compile_frame, normalize_settings, orchestrate, verify_frame  # noqa: E402

TASKS = {"relu_add": "task_relu_add.py", "gemm_bias_relu": "task_gemm_bias_relu.py"}
MIX = [
    ("fast", "relu_add"),
    ("gemm_bias_relu", "gemm_bias_relu"),
    ("slow", "relu_add"),
    ("wrong", "relu_add"),
    ("aten_wrapper", "relu_add"),
    ("side_stream", "relu_add"),
]


def candidates_frame(n: int, also: list[str] = ()) -> pd.DataFrame:
    """n candidates of the mix, then one of each variant in `also` that the mix did not reach (relu_add ones)."""
    mix = [MIX[i % len(MIX)] for i in range(n)]
    mix += [(v, "relu_add") for v in dict.fromkeys(also) if v not in {m for m, _ in mix}]
    return verify_frames.candidates_frame(
        [(f"c{i:03d}-{variant}", task, solution(variant, tag=f"_{i}")) for i, (variant, task) in enumerate(mix)]
    )


def tasks_frame() -> pd.DataFrame:
    folder = ROOT / "tests" / "fixtures" / "verify_cuda"
    return verify_frames.tasks_frame([(t, (folder / f).read_text()) for t, f in TASKS.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10, help="repeated verifications of one kernel (CV)")
    parser.add_argument(
        "--cv-variants",
        type=lambda text: text.split(","),
        default=["fast"],
        help="the kernels repeated for the CV (variants of tests/verify_cuda_solutions.py; built if not in the mix)",
    )
    parser.add_argument("--compile-workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--mode", default="hardened", choices=["kernelbench", "hardened"])
    parser.add_argument("--workers", type=int, default=8, help="contestants each GPU's referee keeps ready")
    parser.add_argument(
        "--verify-copies",
        type=int,
        default=1,
        help="verify each built candidate this many times (new ids, cached build): the GPU side in "
        "steady state rather than one round of children",
    )
    parser.add_argument(
        "--doorbell",
        default="on",
        choices=["on", "off", "both"],
        help="timed steps signalled on the shared-memory doorbell (on), on the socket alone (off), or the repeats "
        "run both ways side by side (what the doorbell gains)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, help="work folder (build cache included); default: a fresh temporary one")
    args = parser.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="concur-bench-"))
    settings = {
        "device": "cuda",
        "mode": args.mode,
        "timeout_s": 900,
        "workers": args.workers,
        "timing_trials": 100,
        "warmup": 3,
        "compile_workers": args.compile_workers,
        "build_cache": str(work / "cache"),
    }
    candidates, tasks = candidates_frame(args.candidates, args.cv_variants), tasks_frame()

    resolved = normalize_settings(settings, for_compile=True)
    start = time.perf_counter()
    builds = compile_frame(candidates, settings, work / "compile", progress=False, tasks=tasks)
    compile_wall = time.perf_counter() - start

    to_verify, verify_builds = copies(candidates, args.verify_copies), copies(builds, args.verify_copies)
    reports: list[dict] = []
    api.TRACE_SINK = lambda candidate_id, report: reports.append({"gpu_s": report.gpu_s, **report.trace})
    start = time.perf_counter()
    verdicts = verify_frame(to_verify, tasks, settings, work / "verify", progress=False, builds=verify_builds)
    verify_wall = time.perf_counter() - start
    api.TRACE_SINK = None

    print(verdicts[["candidate_id", "status", "speedup", "compile_s", "eval_s", "reason"]].to_string(max_colwidth=60))
    spread = {}
    for bell in {"on": [True], "off": [False], "both": [True, False]}[args.doorbell]:
        orchestrate.DOORBELL = bell  # the referees start again with it (their pool's key holds it)
        for v in args.cv_variants:
            label = v if args.doorbell != "both" else f"{v}, doorbell {'on' if bell else 'off'}"
            spread[label] = repeat_speedups(v, candidates, builds, tasks, settings, work, args.repeats)
    orchestrate.DOORBELL = True
    for variant, found in spread.items():
        print(f"repeats of {variant}:")
        print(pd.DataFrame(found["repeats"]).drop(columns=["per_call_ms", "batch_ms", *PATHS]).to_string())
        for key, step in PATHS.items():
            legs = [
                {f"{side}.{leg}": ms for side, path in r[key].items() for leg, ms in path.items()}
                for r in found["repeats"]
            ]
            print(f"the timed {step}'s path, median ms per leg (referee asks, contestant works, referee hears back):")
            print(pd.DataFrame(legs).to_string())

    stages = job_stages(reports)
    n = len(candidates)
    gpu_s = verify_wall / len(to_verify)  # the GPU is taken in turns: wall time per candidate is what it costs it
    compile_s = compile_wall / n
    per_hour_pipelined = 3600.0 / max(gpu_s, compile_s)
    per_hour_sequential = 3600.0 * n / (compile_wall + verify_wall)
    results = {
        "device": verdicts["device"].iloc[0],
        "candidates": n,
        "compile_workers": args.compile_workers,
        "workers": args.workers,
        "verify_copies": args.verify_copies,
        "host_compiler": resolved["host_compiler"],
        "cv": spread,
        "compile_wall_s": compile_wall,
        "verify_wall_s": verify_wall,
        "gpu_s_per_candidate": gpu_s,
        "compile_s_per_candidate_amortized": compile_s,
        "build_s_median": float(builds["compile_s"].median()),
        "candidates_per_hour_pipelined": per_hour_pipelined,
        "candidates_per_hour_sequential": per_hour_sequential,
        "eval_s_median": float(verdicts["eval_s"].median()),
        "statuses": verdicts["status"].value_counts().to_dict(),
        "child_stage_s_median": stages,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(
        f"\nverifier throughput on {results['device']}, {n} candidates (verified {args.verify_copies}x), "
        f"{args.compile_workers} compile workers, "
        f"{args.workers} children per GPU, host compiler {resolved['host_compiler']}"
    )
    print(f"{'metric':<44}{'measured':>12}{'target':>10}")
    job_s = [f["gpu_s"] for f in reports if f.get("gpu_s") is not None]
    rows = [
        ("GPU-seconds per candidate", f"{gpu_s:.2f}", "<= 3"),
        (
            "  of it in referee jobs, mean / median",
            f"{statistics.fmean(job_s):.2f} / {statistics.median(job_s):.2f}",
            "",
        ),
        ("candidates/hour (compile || verify)", f"{per_hour_pipelined:.0f}", ">= 500"),
        ("candidates/hour (compile, then verify)", f"{per_hour_sequential:.0f}", ""),
        ("one build, median s (parallel pool)", f"{results['build_s_median']:.1f}", ""),
        ("compile wall s / candidate (amortized)", f"{compile_s:.2f}", ""),
    ]
    for variant, found in spread.items():
        rows.append((f"speedup CV, {args.repeats} runs of {variant}", f"{100 * found['cv']:.2f} %", "<= 2 %"))
        rows.append(("  of the means", f"{100 * found['mean_cv']:.2f} %", ""))
        rows.append(("  of the medians", f"{100 * found['median_cv']:.2f} %", ""))
        rows.append(("  forward times only (no hand-offs)", f"{100 * found['forward_cv']:.2f} %", ""))
        names = {"wall_ms": "contestants' own wall clocks", "events_ms": "contestants' own CUDA events"}
        for clock, seen in found.get("own_clock", {}).items():
            rows.append((f"  by the {names[clock]}", f"{100 * seen['cv']:.2f} %", ""))
        means = [f"{found['referee_speedup_mean']:.3f}"]
        means += [f"{found['own_clock'][c]['mean']:.3f}" for c in ("wall_ms", "events_ms") if c in found["own_clock"]]
        rows.append(("  mean speedup: referee / own wall / events", " / ".join(means), ""))
        trips = [r["round_trip_ms"] for r in found["repeats"] if r.get("round_trip_ms") is not None]
        jobs = [r["job_s"] for r in found["repeats"] if r.get("job_s") is not None]
        if trips and jobs:
            rows.append(("  round trip ms / job s, medians", f"{statistics.median(trips):.4f} / "
                         f"{statistics.median(jobs):.2f}", ""))  # fmt: skip
    for name, value, target in rows:
        print(f"{name:<44}{value:>12}{target:>10}")
    print("where a candidate's GPU time goes (median s):", json.dumps({k: round(v, 3) for k, v in stages.items()}))


def repeat_speedups(variant, candidates, builds, tasks, settings, work, repeats) -> dict:
    """One kernel verified `repeats` times, each with a referee of its own: its speedups, their CV, and each run's
    timing (every batch's time per call, both sides)."""
    one = candidates[candidates["candidate_id"].str.endswith(f"-{variant}")].iloc[[0]]
    speedups, mean_speedups, median_speedups, forward_speedups, rows = [], [], [], [], []
    own_speedups: dict[str, list[float]] = {"events_ms": [], "wall_ms": []}
    for r in range(repeats):
        traced: list[dict] = []
        api.TRACE_SINK = lambda candidate_id, report, into=traced: into.append(
            {**timing_view(report), "gpu_s": report.gpu_s}
        )
        row = verify_frame(one, tasks, settings, work / f"repeat-{variant}-{r}", progress=False, builds=builds).iloc[0]
        api.TRACE_SINK = None
        speedups.append(float(row["speedup"]))  # hardened: of the quickest batches; kernelbench: of means
        mean_speedups.append(float(row["ref_ms"] / row["new_ms"]))
        median_speedups.append(float(row["ref_median_ms"] / row["new_median_ms"]))
        timed = traced[0] if traced else {}
        if timed.get("per_call_ms"):
            forward_speedups.append(forward_only(timed))
        for clock, found in own_speedups.items():
            ratio = own_clock_speedup(timed, clock)
            if ratio is not None:
                found.append(ratio)
        rows.append(
            {
                **{
                    k: row[k]
                    for k in ("ref_best_ms", "new_best_ms", "ref_median_ms", "new_median_ms", "speedup", "flags")
                },
                "calls_per_batch": timed.get("calls_per_batch"),
                "batches": [timed.get(side, {}).get("batches") for side in ("ref", "new")],
                "batch_cv": [round(timed.get(side, {}).get("cv", 0.0), 4) for side in ("ref", "new")],
                "per_call_ms": timed.get("per_call_ms"),
                "batch_ms": timed.get("batch_ms"),
                **{key: path_medians(timed, key) for key in PATHS},
                "rung": rung_share(timed),
                "round_trip_ms": timed.get("batch_ms", {}).get("overhead"),
                "job_s": traced[0]["gpu_s"] if traced else None,
            }
        )
    return {
        "repeats": rows,
        "cv": variation(speedups),
        "mean_cv": variation(mean_speedups),
        "median_cv": variation(median_speedups),
        "forward_cv": variation(forward_speedups) if forward_speedups else float("nan"),
        "speedups": speedups,
        "own_clock": {
            clock: {"mean": statistics.fmean(found), "cv": variation(found)}
            for clock, found in own_speedups.items()
            if found
        },
        "referee_speedup_mean": statistics.fmean(forward_speedups) if forward_speedups else float("nan"),
    }


def timing_view(report) -> dict:
    """A traced report's timing as one dict: the summary's fields and the referee's clock readings beside them."""
    found = dataclasses.asdict(report.timing) if report.timing is not None else {}
    return {**found, **{k: v for k, v in report.trace.items() if k in ("per_call_ms", "batch_ms")}}


def forward_only(timed: dict) -> float:
    """The speedup the batches' forward times alone give, the copies' excess left out (what the copy rule adds to
    the spread is the difference between the two CVs): quickest batches, as the verdict's."""
    forward = timed["per_call_ms"]  # each batch's forward time per call, the round trip taken off
    return min(forward["ref"]) / min(forward["new"])


def own_clock_speedup(timed: dict, clock: str) -> float | None:
    """The speedup by the contestants' own clocks (medians of per-call times): where the referee's clock differs,
    the time went to messages and process wake-ups. Self-reported, so a benchmark's view, never a verdict's."""
    own = timed.get("batch_ms", {}).get("own_clock", {})
    calls = timed.get("calls_per_batch") or 1
    medians = []
    for side in ("ref", "new"):
        times = [b[clock] / calls for b in own.get(side, []) if clock in b]
        if not times:
            return None
        medians.append(statistics.median(times))
    return medians[0] / medians[1] if medians[1] > 0 else None


PATHS = {"path_ms": "forward", "handoff_path_ms": "hand-off"}  # measure.own_clock


def path_medians(timed: dict, key: str) -> dict:
    """Per side, the median ms of each leg of a timed step's path (measure.own_clock): where the referee's clock
    and the contestant's own part."""
    own = timed.get("batch_ms", {}).get("own_clock", {})
    found = {}
    for side in ("ref", "new"):
        paths = [b[key] for b in own.get(side, []) if key in b]
        if paths:
            found[side] = {leg: round(statistics.median(p[leg] for p in paths), 4) for leg in paths[0]}
    return found


def rung_share(timed: dict) -> str:
    """Per side, the share of timed batches whose forward and hand-off were both answered on the doorbell."""
    own = timed.get("batch_ms", {}).get("own_clock", {})
    shares = []
    for side in ("ref", "new"):
        rung = [all((b.get("rung") or {"": False}).values()) for b in own.get(side, [])]
        shares.append(f"{sum(rung)}/{len(rung)}")
    return " ".join(shares)


def copies(frame: pd.DataFrame, k: int) -> pd.DataFrame:
    """`k` copies of each row, ids suffixed after the first (a build row's copy points at the same built module)."""
    parts = [frame.assign(candidate_id=frame["candidate_id"] + (f"-copy{j}" if j else "")) for j in range(k)]
    return pd.concat(parts, ignore_index=True)


def variation(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else float("nan")


def job_stages(reports: list[dict]) -> dict[str, float]:
    """Median seconds per stage of a candidate's job on the referee (reference, start, load, correctness, timing)."""
    samples: dict[str, list[float]] = {}
    for facts in reports:
        for name, seconds in {"job": facts.get("gpu_s"), **(facts.get("stage_s") or {})}.items():
            if seconds is not None:
                samples.setdefault(name, []).append(seconds)
    return {name: statistics.median(values) for name, values in samples.items()}


if __name__ == "__main__":
    main()

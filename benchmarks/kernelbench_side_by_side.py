"""Our verifier (`kernelbench` and `hardened` modes) and KernelBench's own harness on the same model-written
KernelBench candidates, on one GPU machine: GPU-seconds per candidate, candidates per hour per node, CPU-seconds per
build, and how often `kernelbench` mode agrees with KernelBench's verdict.

Input: a folder from benchmarks/kernelbench_candidates.py (`<id>.py` + `manifest.jsonl`) and a KernelBench checkout.
Each part writes its own file under --out, so a run cut short, or parts run in separate calls (`--parts`), still
make one table (`--parts report` prints it from what is there). `--shard K/N` runs our part on every Nth problem
into --out/shard-K-of-N, for machines lent a few minutes a command; the report adds up the shards it finds:

    ours.jsonl       one line per candidate and mode (status, reason, speedup, eval_s)
    ours.json        build wall and CPU seconds, verify wall seconds per mode
    kernelbench.jsonl  benchmarks/kernelbench_harness.py's output (a fresh process per candidate, after a pre-build)

`--precision fp16|bf16` (default fp32) runs both parts in that precision: our tasks get it as their `precision`
(inputs and both models' weights cast to it, KernelBench's tolerance for it) and KernelBench's harness gets
`--precision`. Its files go to --out/<precision>/ (fp32 stays in --out itself), so one --out holds the runs of each
precision side by side and never mixes them; ours.json and every kernelbench.jsonl line record the precision, and
the report (run with the same --precision) prints it and stops where a file says another.

    python benchmarks/kernelbench_side_by_side.py .bench/kb_candidates --kernelbench .bench/KernelBench \
        --out results/bench/kb_side --problems 16 [--precision bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(HERE)]

from kernelbench_harness import load_candidates, read_jsonl  # noqa: E402
from verify_frames import candidates_frame, tasks_frame  # noqa: E402

MODES = ("kernelbench", "hardened")
# KernelBench's outcome names for ours: it has no static screen and no `rejected`
AGREE = {"correct": "correct", "incorrect": "incorrect", "compile_error": "compile_error"}


def spread_problems(cands: list[dict], problems: int) -> list[dict]:
    """Every candidate of `problems` problems spread evenly over the manifest's problem order (0: all)."""
    order = list(dict.fromkeys((c["level"], c["problem_id"]) for c in cands))
    if problems and problems < len(order):
        step = len(order) / problems
        order = [order[int(i * step)] for i in range(problems)]
    keep = set(order)
    return [c for c in cands if (c["level"], c["problem_id"]) in keep]


def shard_of(cands: list[dict], shard: str | None) -> list[dict]:
    """The candidates of shard "K/N": the problems whose place in the candidates' problem order is K-1 modulo N."""
    if not shard:
        return cands
    k, n = (int(x) for x in shard.split("/"))
    if not 1 <= k <= n:
        raise SystemExit(f"--shard {shard}: K must be within 1..N")
    order = list(dict.fromkeys((c["level"], c["problem_id"]) for c in cands))
    keep = set(order[k - 1 :: n])
    return [c for c in cands if (c["level"], c["problem_id"]) in keep]


def ours_dirs(out: Path) -> list[Path]:
    """Where our part's files are: --out itself, or the shards under it."""
    if (out / "ours.json").is_file():
        return [out]
    return sorted(d for d in out.glob("shard-*-of-*") if (d / "ours.json").is_file())


def read_ours(out: Path) -> tuple[pd.DataFrame, dict, list[dict]]:
    """Our verdicts and build and verify totals over --out or its shards (sums; each shard paid its own once-per-run
    costs), and each shard's own summary."""
    rows, parts = [], []
    for folder in ours_dirs(out):
        parts.append(json.loads((folder / "ours.json").read_text()))
        if (folder / "ours.jsonl").is_file():
            rows += [json.loads(x) for x in (folder / "ours.jsonl").read_text().splitlines()]
    keys = {k for p in parts for k in p if k not in ("build_steps_s", "precision")}  # the precision: checked apart
    summed = lambda k: k in ("candidates", "built") or k.endswith(("_wall_s", "_cpu_s"))  # noqa: E731
    summary = {k: (sum if summed(k) else max)(p.get(k, 0) for p in parts) for k in keys}
    summary["runs"] = len(parts)
    ours = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["mode", "candidate_id"])
    return ours, summary, parts


def frames(cands: list[dict], precision: str = "fp32") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The candidates and tasks tables (docs/data.md contracts 1 and 3) of the chosen candidates, the tasks in
    `precision`."""
    task_of = {c["id"]: f"L{c['level']}/{Path(c['reference']).stem}" for c in cands}
    references = {task_of[c["id"]]: Path(c["reference"]).read_text() for c in cands}
    return (
        candidates_frame([(c["id"], task_of[c["id"]], Path(c["program"]).read_text()) for c in cands]),
        tasks_frame(list(references.items()), precision=precision),
    )


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine spent busy (user, nice, system, irq, softirq), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_ours(cands: list[dict], args: argparse.Namespace) -> None:
    """Build every candidate once (shared by both modes), then verify all of them in each mode."""
    from concur.verify import api, compile_frame, verify_frame

    candidates, tasks = frames(cands, args.precision)
    folder = args.out / f"shard-{args.shard.replace('/', '-of-')}" if args.shard else args.out
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / "ours-work"
    settings = {
        "device": "cuda",
        "workers": args.workers,
        "compile_workers": args.build_workers,
        "build_cache": str(work / "cache"),
        "timeout_s": 900,
    }
    summary = {"candidates": len(candidates), "build_workers": args.build_workers, "workers": args.workers,
               "precision": args.precision}  # fmt: skip
    summary["node_cores"] = len(os.sched_getaffinity(0))
    build_settings = {**settings, "mode": "hardened"}
    cpu0, t0 = busy_cpu_s(), time.perf_counter()
    summary["pch_programs"] = shared_pchs(candidates, build_settings, work)
    summary["pch_wall_s"], summary["pch_cpu_s"] = time.perf_counter() - t0, busy_cpu_s() - cpu0
    cpu0, t0 = busy_cpu_s(), time.perf_counter()
    builds = compile_frame(candidates, build_settings, work / "compile", progress=False, tasks=tasks)
    summary["build_wall_s"], summary["build_cpu_s"] = time.perf_counter() - t0, busy_cpu_s() - cpu0
    summary["built"] = int((builds["status"] == "built").sum())
    summary["build_steps_s"] = build_steps(work / "cache")
    print(f"[ours] build steps, median seconds: {summary['build_steps_s']}", flush=True)
    with open(folder / "ours.jsonl", "w") as out:
        for mode in args.modes.split(","):
            stages: dict[str, dict] = {}  # where each candidate's GPU time went
            api.TRACE_SINK = lambda cid, report, into=stages: into.__setitem__(cid, report.trace.get("stage_s"))
            t0 = time.perf_counter()
            verdicts = verify_frame(candidates, tasks, {**settings, "mode": mode}, work / mode, False, builds=builds)
            summary[f"{mode}_wall_s"] = time.perf_counter() - t0
            api.TRACE_SINK = None
            for v in verdicts.to_dict("records"):
                keep = ("candidate_id", "task_id", "status", "reason", "speedup", "eval_s", "flags")
                row = {"mode": mode, **{k: v[k] for k in keep}, "stage_s": stages.get(v["candidate_id"])}
                out.write(json.dumps(row, default=float) + "\n")
            print(f"[ours] {mode}: {len(verdicts)} candidates in {summary[f'{mode}_wall_s']:.0f} s", flush=True)
    (folder / "ours.json").write_text(json.dumps(summary, indent=1))


def shared_pchs(candidates: pd.DataFrame, settings: dict, work: Path) -> int:
    """The shared PCHs of the candidates' flag sets, built first and timed apart: once per flag set and node, so at
    a paper run's scale (90,810 candidates) they cost nothing per build. Built by the compile step's own warm-up
    (its tiny programs, compiled as candidates afterwards, hit the cache)."""
    from concur.verify import api, compile_frame, compiling

    programs = compiling.warm_programs(list(candidates["code"]), api.normalize_settings(settings, True))
    if programs:
        warm = candidates_frame([(f"warm-{i}", "warm", code) for i, code in enumerate(programs)])
        compile_frame(warm, settings, work / "compile-pch", progress=False)
    return len(programs)


def build_steps(cache: Path) -> dict:
    """Median seconds of each build step over the cache's builds, from ninja's logs: the binding unit (main.o), the
    .cu file through nvcc (cuda.o) and the link (.so)."""
    steps: dict[str, list[float]] = {}
    for log in cache.rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start, end, _, target, _ = line.split("\t")
            name = "link" if target.endswith(".so") else Path(target).name
            steps.setdefault(name, []).append((int(end) - int(start)) / 1000.0)
    return {name: round(statistics.median(times), 1) for name, times in sorted(steps.items())}


def run_kernelbench(cands: list[dict], args: argparse.Namespace) -> None:
    """KernelBench's harness on the same candidates, in a process of its own (its children import KernelBench)."""
    cmd = [
        sys.executable,
        str(HERE / "kernelbench_harness.py"),
        str(args.candidates),
        "--kernelbench",
        str(args.kernelbench),
        "--out",
        str(args.out / "kernelbench.jsonl"),
        "--work",
        str(args.out / "kb-work"),
        "--build-workers",
        str(args.build_workers),
        "--ids",
        ",".join(c["id"] for c in cands),
        "--precision",
        args.precision,
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"[kernelbench] {len(cands)} candidates in {time.perf_counter() - t0:.0f} s", flush=True)


def report(cands: list[dict], args: argparse.Namespace) -> dict:
    """The table of what is under --out, printed and returned."""
    ids = [c["id"] for c in cands]
    precision = getattr(args, "precision", "fp32")
    ours, summary, parts = read_ours(args.out)
    if len(parts) > 1:
        print(f"our part: {len(parts)} shards, {summary['candidates']} candidates, each shard its own machine")
    kb = read_jsonl(args.out / "kernelbench.jsonl") if (args.out / "kernelbench.jsonl").is_file() else {}
    kb = {i: kb[i] for i in ids if i in kb}
    found = {p.get("precision", "fp32") for p in parts} | {r.get("precision", "fp32") for r in kb.values()}
    if found - {precision}:  # files written before the precision was recorded are fp32 runs
        raise SystemExit(f"{args.out}: results in {', '.join(sorted(found))}, report asked for {precision}")
    print(f"precision: {precision} ({args.out})")
    rows = []
    cores = args.node_cores or summary.get("node_cores") or len(os.sched_getaffinity(0))
    build_cpu = summary.get("build_cpu_s", 0) / max(1, summary.get("candidates", 1))  # shared PCHs apart
    if "pch_cpu_s" in summary:
        print(
            f"shared PCHs: {summary['pch_programs']} flag sets, {summary['pch_cpu_s'] / len(parts):.0f} CPU-s once per"
            f" node{f' (mean of {len(parts)} shards)' if len(parts) > 1 else ''}"
            f" ({summary['pch_cpu_s'] / max(1, summary['candidates']):.1f} a build on these"
            f" {summary['candidates']}); CPU-s/build below leaves them out"
        )
    for mode in MODES:
        part = ours[ours["mode"] == mode]
        if part.empty:
            continue
        gpu = summary[f"{mode}_wall_s"] / len(part)  # one GPU taken in turns: wall per candidate is its cost
        rows.append(
            row(
                f"ours, {mode}",
                len(part),
                gpu,
                statistics.median(part["eval_s"]),
                build_cpu,
                cores,
                (part["status"] == "correct").sum(),
            )
        )
    if kb:
        gpu = [r["gpu_s"] for r in kb.values() if r.get("gpu_s") is not None]
        builds = [r["build_cpu_s"] for r in kb.values() if r.get("build_cpu_s")]
        rows.append(
            row(
                "KernelBench harness",
                len(kb),
                statistics.fmean(gpu),
                statistics.median(gpu),
                statistics.fmean(builds) if builds else 0.0,
                cores,
                sum(r["status"] == "correct" for r in kb.values()),
            )
        )
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    stages = stage_seconds(ours)
    result = {
        "precision": precision,
        "table": rows,
        "stages": stages,
        "per_job": per_job(ours, summary),
        "agreement": agreement(ours[ours["mode"] == "kernelbench"], kb),
    }
    (args.out / "report.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def stage_seconds(ours: pd.DataFrame) -> dict:
    """GPU-seconds per candidate in each stage of our jobs, per mode ("setup.*" and "correctness.fp64" are parts of
    "setup" and "correctness": where setting up a task's reference, and the float64 check, go)."""
    found: dict[str, dict] = {}
    for mode in MODES if "stage_s" in ours else ():
        part = ours[ours["mode"] == mode]
        totals: dict[str, float] = {}
        for stages in part["stage_s"]:
            for name, seconds in (stages or {}).items():
                totals[name] = totals.get(name, 0.0) + seconds
        if totals:
            found[mode] = {k: round(v / len(part), 3) for k, v in sorted(totals.items())}
    if found:
        print("\nGPU-seconds per candidate by stage of the job:")
        print(pd.DataFrame(found).fillna(0.0).to_string(float_format=lambda x: f"{x:.3f}"))
    return found


def per_job(ours: pd.DataFrame, summary: dict) -> dict:
    """The verify run's wall split into the candidates' jobs and what it spends once (the referee's and the
    contestants' start, loading the tasks, the end): the GPU-s mean above carries the latter over these few
    candidates, a shard of a paper-scale run over about a thousand."""
    found = {}
    runs_note = f" (summed over {summary['runs']} runs)" if summary.get("runs", 1) > 1 else ""
    for mode in MODES:
        part = ours[ours["mode"] == mode]
        if part.empty or f"{mode}_wall_s" not in summary:
            continue
        jobs = float(part["eval_s"].sum())
        found[mode] = {"in_jobs_s_per_cand": jobs / len(part), "once_s": summary[f"{mode}_wall_s"] - jobs}
        print(
            f"{mode}: {found[mode]['in_jobs_s_per_cand']:.2f} GPU-s a candidate in its job,"
            f" {found[mode]['once_s']:.1f} s once per verify run"
            f"{runs_note}"
        )
    return found


def row(name: str, n: int, mean_gpu: float, median_gpu: float, build_cpu: float, cores: int, correct: int) -> dict:
    # compile and verify overlapped on one node: the slower of the GPU and the CPU pool sets the pace
    per_hour = 3600.0 / max(mean_gpu, build_cpu / cores)
    return {
        "verifier": name,
        "candidates": n,
        "correct": int(correct),
        "GPU-s/cand mean": mean_gpu,
        "GPU-s/cand median": median_gpu,
        "CPU-s/build": build_cpu,
        "cand/h/node": per_hour,
    }


def agreement(ours: pd.DataFrame, kb: dict) -> dict:
    """Whether each candidate is correct, ours (`kernelbench` mode) against KernelBench's; disagreements listed."""
    both = [
        (r["candidate_id"], r["status"], kb[r["candidate_id"]]["status"])
        for r in ours.to_dict("records")
        if r["candidate_id"] in kb
    ]
    differ = [
        {
            "id": cid,
            "ours": mine,
            "kernelbench": theirs,
            "reason": ours.set_index("candidate_id").at[cid, "reason"],
            "kb_error": kb[cid].get("error") or kb[cid].get("error_name"),
        }
        for cid, mine, theirs in both
        if (mine == "correct") != (theirs == "correct")
    ]
    same_kind = sum(AGREE.get(m, "error") == AGREE.get(t, "error") for _, m, t in both)
    n = len(both)
    print(
        f"\nkernelbench mode vs KernelBench: correct/not agree on {n - len(differ)}/{n}"
        f" ({100.0 * (n - len(differ)) / max(1, n):.1f} %), same outcome kind on {same_kind}/{n}"
    )
    for d in differ:
        print(
            f"  {d['id']}: ours {d['ours']} ({str(d['reason'])[:100]}), KernelBench {d['kernelbench']}"
            f" ({str(d['kb_error'])[:100]})"
        )
    return {"compared": n, "agree": n - len(differ), "same_kind": same_kind, "disagreements": differ}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidates", type=Path)
    parser.add_argument("--kernelbench", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=int, default=0, help="this many problems, spread evenly (0: all)")
    parser.add_argument("--parts", default="ours,kernelbench,report", help="any of ours, kernelbench, report")
    parser.add_argument("--shard", help="K/N: our part on every Nth problem from the Kth, into --out/shard-K-of-N")
    parser.add_argument("--modes", default=",".join(MODES), help="our modes to run, of " + ",".join(MODES))
    parser.add_argument("--workers", type=int, default=16, help="our contestants per GPU")
    parser.add_argument("--build-workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--node-cores", type=int, help="cores per node (default: as recorded by our part, else here)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                        help="both parts' precision; other than fp32, the files go to --out/<precision>")  # fmt: skip
    args = parser.parse_args(argv)
    if args.precision != "fp32":
        args.out = args.out / args.precision
    cands, problems = load_candidates(args.candidates, args.kernelbench)
    for p in problems:
        print(f"[skip] {p}")
    cands = spread_problems(cands, args.problems)
    parts = set(args.parts.split(","))
    if args.shard and "kernelbench" in parts:
        raise SystemExit("--shard: our part only; run KernelBench's harness (--parts kernelbench) without it")
    cands = shard_of(cands, args.shard)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(cands)} candidates over {len({(c['level'], c['problem_id']) for c in cands})} problems", flush=True)
    if "ours" in parts:
        run_ours(cands, args)
    if "kernelbench" in parts:
        run_kernelbench(cands, args)
    if "report" in parts:
        report(cands, args)


if __name__ == "__main__":
    main()

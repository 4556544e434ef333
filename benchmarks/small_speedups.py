"""Honest kernels' speedups from small to large tasks: the verifier's against an independent reading.

The independent reading runs in a fresh plain process per variant, one at a time, no referee: the reference and
the kernel called in turn in a plain loop over a pool of input sets larger than twice the L2 (so a call's inputs are
cold, as in a timed batch), CUDA events around each loop of at least 20 ms, the quickest loop's time per call over
`--repeats` loops; its speedup is the ratio of the two, as the verifier's is of its quickest batches (the medians'
ratio is shown beside it). The verifier's comes from `verify_frame` on the same candidates. The table shows both
side by side and their ratio (the target: within 10 % on every row). `--doorbell both` verifies the candidates with
the timed steps on the doorbell and on the socket alone, a row each; `--launch-core both` with each side's main
thread on the launch core while it is timed and from its take on (orchestrate.LAUNCH_CORE); `--cupti` adds two plain
readings taken after one profiled call of each model: CUPTI left attached, and CUPTI detached as the verifier's
contestants detach it (TEARDOWN_CUPTI=1, contestant.let_cupti_detach);
`--trace FILE` writes each verification's batch readings (api.TRACE_SINK) there, as JSON.

    python benchmarks/small_speedups.py --variants fast,fast_vec --sizes 256x1024,1024x1024,4096x4096
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
MIN_LOOP_S = 0.02


def task_code(size: str) -> str:
    from verify_cuda_solutions import relu_add_task

    rows, cols = size.split("x")
    return relu_add_task(int(rows), int(cols))


def independent(variant: str, sizes: list[str], repeats: int, cupti: bool = False) -> dict:
    """In this process: per size, the reference's and the kernel's quickest time per call (ms) by CUDA events.
    `cupti`: each model's first call runs under torch's profiler, as a profiled call does in the verifier (then
    CUPTI detached where TEARDOWN_CUPTI=1)."""
    import torch
    from verify_cuda_solutions import solution

    from concur.verify.contestant import let_cupti_detach

    kernel_scope: dict = {}
    exec(compile(solution(variant), f"<{variant}>", "exec"), kernel_scope)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    found = {}
    for size in sizes:
        scope: dict = {}
        exec(compile(task_code(size), f"<task {size}>", "exec"), scope)
        init = scope["get_init_inputs"]()
        models = {"eager": scope["Model"](*init).cuda(), "kernel": kernel_scope["ModelNew"](*init).cuda()}
        one = [t.cuda() for t in scope["get_inputs"]()]
        per_set = sum(t.numel() * t.element_size() for t in one)
        pool = [[torch.randn_like(t) for t in one] for _ in range(max(4, -(-2 * l2 // per_set) + 1))]
        times: dict[str, list[float]] = {name: [] for name in models}
        calls = {}
        with torch.no_grad():
            if cupti:
                for model in models.values():
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        model(*pool[0])
                        torch.cuda.synchronize()
                    if os.environ.get("TEARDOWN_CUPTI") == "1":
                        let_cupti_detach(prof)
            for name, model in models.items():  # warm, and how many calls make a loop of MIN_LOOP_S
                for args in pool:
                    model(*args)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for args in pool:
                    model(*args)
                end.record()
                end.synchronize()
                per_call = start.elapsed_time(end) / len(pool) / 1000.0
                calls[name] = max(len(pool), int(MIN_LOOP_S / max(per_call, 1e-7)))
            for _ in range(repeats):
                for name, model in models.items():
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for i in range(calls[name]):
                        model(*pool[i % len(pool)])
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end) / calls[name])
        medians = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        found[size] = {"eager_ms": min(times["eager"]), "kernel_ms": min(times["kernel"]),
                       "median_ratio": medians["eager"] / medians["kernel"]}  # fmt: skip
    return found


def verifier(
    variants: list[str], sizes: list[str], mode: str, work: Path, cache: Path, bell=True, core="timed", traced=None
) -> dict:
    """The verifier's readings; `traced`: a dict given each candidate's trace and timing summary."""
    from verify_cuda_solutions import solution
    from verify_frames import candidates_frame, tasks_frame

    from concur.verify import api, compile_frame, orchestrate, verify_frame

    orchestrate.DOORBELL, orchestrate.LAUNCH_CORE = bell, core  # the referees start again (their pool's key)

    tasks = tasks_frame([(f"relu_add_{size}", task_code(size)) for size in sizes])
    candidates = candidates_frame(
        [(f"{size}:{v}", f"relu_add_{size}", solution(v)) for size in sizes for v in variants]
    )
    settings = {"device": "cuda", "mode": mode, "workers": 4, "timeout_s": 300, "build_cache": str(cache)}
    builds = compile_frame(candidates, settings, work / "compile", False)
    if traced is not None:
        api.TRACE_SINK = lambda cid, report: traced.__setitem__(
            cid, {**report.trace, "timing": dataclasses.asdict(report.timing) if report.timing else None}
        )
    try:
        table = verify_frame(candidates, tasks, settings, work / "verify", False, builds=builds)
    finally:
        api.TRACE_SINK = None
    table = table.set_index("candidate_id")
    return {
        cid: (row["status"], row["speedup"], row["ref_best_ms"], row["new_best_ms"]) for cid, row in table.iterrows()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=lambda t: t.split(","), default=["fast", "fast_vec"])
    parser.add_argument("--sizes", type=lambda t: t.split(","), default=["256x1024", "1024x1024", "4096x4096"])
    parser.add_argument("--mode", default="hardened", choices=["hardened", "kernelbench"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--doorbell", choices=["on", "off", "both"], default="on")
    parser.add_argument("--launch-core", choices=["timed", "taken", "both"], default="timed")
    parser.add_argument("--cupti", action="store_true", help="also a plain reading with CUPTI attached")
    parser.add_argument("--trace", type=Path, help="write the verifier's batch readings here (JSON)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: the independent reading of one variant
    parser.add_argument("--attach-cupti", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(independent(args.one, args.sizes, args.repeats, args.attach_cupti)))
        return
    work = Path(tempfile.mkdtemp(prefix="concur-small-"))
    readings = [("plain", [], "0")]
    if args.cupti:
        readings += [
            ("plain, CUPTI attached", ["--attach-cupti"], "0"),
            ("plain, CUPTI detached", ["--attach-cupti"], "1"),
        ]
    plain: dict[str, dict] = {label: {} for label, _, _ in readings}
    for v in args.variants:  # one at a time: two readings side by side on one GPU would slow each other
        for label, extra, teardown in readings:
            child = subprocess.run(
                [sys.executable, __file__, "--one", v, "--sizes", ",".join(args.sizes), "--repeats", str(args.repeats)]
                + extra,
                stdout=subprocess.PIPE,
                text=True,
                env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(work / f"ext-{v}"), TEARDOWN_CUPTI=teardown),
                check=True,
            )
            plain[label][v] = json.loads(child.stdout.strip().splitlines()[-1])
            print(json.dumps({"reading": label, "variant": v, **plain[label][v]}), flush=True)  # kept if cut short
    bells = {"on": [True], "off": [False], "both": [True, False]}[args.doorbell]
    holds = ["timed", "taken"] if args.launch_core == "both" else [args.launch_core]
    judged, traces = {}, {}
    for bell in bells:
        for core in holds:
            label = f"verifier, doorbell {'on' if bell else 'off'}" + (f", core {core}" if len(holds) > 1 else "")
            traced = traces[label] = {} if args.trace else None
            judged[label] = verifier(
                args.variants, args.sizes, args.mode, work / f"v-{bell}-{core}", work / "cache", bell, core, traced
            )
            print(json.dumps({"reading": label, **judged[label]}), flush=True)
            if args.trace:
                args.trace.write_text(json.dumps({"plain": plain, "verifier": traces}))
    print("| task | variant | reading | ref / kernel ms (quickest) | speedup | vs plain loop |")
    print("|---|---|---|---:|---:|---:|")
    for size in args.sizes:
        for v in args.variants:
            own = plain["plain"][v][size]
            other = own["eager_ms"] / own["kernel_ms"]
            for label, found in plain.items():
                r = found[v][size]
                ratio = r["eager_ms"] / r["kernel_ms"]
                print(
                    f"| {size} | {v} | {label} | {r['eager_ms']:.4f} / {r['kernel_ms']:.4f} | "
                    f"{ratio:.2f} (medians' {r['median_ratio']:.2f}) | {ratio / other:.3f} |"
                )
            for label, table in judged.items():
                status, speedup, ref_ms, new_ms = table[f"{size}:{v}"]
                print(
                    f"| {size} | {v} | {label} | {ref_ms:.4f} / {new_ms:.4f} | "
                    f"{speedup:.2f} ({status}) | {speedup / other:.3f} |"
                )


if __name__ == "__main__":
    main()

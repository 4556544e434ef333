"""Honest kernels' speedups from small to large tasks: the verifier's against an independent reading.

The independent reading runs in a fresh plain process per variant, one at a time, no referee: the reference and
the kernel called in turn in a plain loop over a pool of input sets larger than twice the L2 (so a call's inputs are
cold, as in a timed batch), CUDA events around each loop of at least 20 ms, the quickest loop's time per call over
`--repeats` loops; its speedup is the ratio of the two, as the verifier's is of its quickest batches (the medians'
ratio is shown beside it). The verifier's comes from `verify_frame` on the same candidates. The table shows both
side by side and their ratio (the target: within 10 % on every row). `--doorbell both` verifies the candidates with
the timed steps on the doorbell and on the socket alone, a row each; `--launch-core both` with each side's main
thread on the launch core while it is timed and from its take on (orchestrate.LAUNCH_CORE), `all` also with none
(`off`: each side's threads where the scheduler puts them, as in `kernelbench` mode); `--cupti` adds two plain
readings taken after one profiled call of each model: CUPTI left attached, and CUPTI detached as the verifier's
contestants detach it (TEARDOWN_CUPTI=1, contestant.let_cupti_detach); `--harness` adds two plain readings whose
loops also do the timed loop's own work on each call (outputs kept, 4 random bytes drawn), the second under the
seccomp filter the sides run under (sandbox.stay_in_tree); `--pinned` a plain reading with the main thread on the
core the verifier times each side's main thread on (referee.timing_core); `--busy` the same with a process
spinning on each of the verifier's other cores (the rest of the referee and the timed side: its doorbell spin);
`--bursts [GAP_MS]` two plain readings whose loops are as long as a timed batch (10 ms of the reference's calls, the
same calls for the kernel), each after a gap (5 ms unless given) asleep or spinning, as timed batches follow the
referee's other steps;
`--rounds N` takes every reading N times, round by round, and the table shows each row's median and range (the
host's pace moves between levels over a run, on the H200 virtual machines measured by up to 1.5x from batch to
batch); `--trace FILE` writes each verification's batch readings (api.TRACE_SINK) there, as JSON.
`--device cpu`: the same for the CPU's honest C++ relu_add (variant `cpp`), the plain loop timed by the host clock
on the verifier's thread count (all cores, one worker), over a pool of inputs larger than twice the last-level
cache, its extension built by the compiler the verifier builds with (verify.host_compiler `auto`), and where that is
not load_inline's own (CXX, else c++), a reading built by that one too: the compiler alone can change a CPU kernel's
speed.

    python benchmarks/small_speedups.py --variants fast,fast_vec --sizes 256x1024,1024x1024,4096x4096
    python benchmarks/small_speedups.py --variants fast,fast_vec --sizes 256x1024,1024x1024 --repeats 3 --rounds 4
    python benchmarks/small_speedups.py --device cpu --sizes 8x16,64x256,256x1024
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
MIN_LOOP_S = 0.02
BATCH_S, BURSTS = 0.01, 4  # --bursts: loops of a timed batch's length, each after a gap
GPU_WORKERS = 4  # contestants a GPU's referee keeps ready in `verifier`


CPU_FIXTURES = ROOT / "tests" / "fixtures" / "verify"


def task_code(size: str, device: str = "cuda") -> str:
    from verify_cuda_solutions import relu_add_task

    rows, cols = size.split("x")
    if device == "cpu":
        program = (CPU_FIXTURES / "task_relu_add.py").read_text()
        return program.replace("rows = 8", f"rows = {rows}").replace("cols = 16", f"cols = {cols}")
    return relu_add_task(int(rows), int(cols))


def solution_code(variant: str, device: str = "cuda") -> str:
    if device == "cpu":
        if variant != "cpp":
            raise SystemExit(f"--device cpu has one variant, cpp (not {variant})")
        return (CPU_FIXTURES / "solution_correct.py").read_text()
    from verify_cuda_solutions import solution

    return solution(variant)


def loop_ms(model, pool: list, calls: int, cuda: bool, harness: bool = False) -> float:
    """Milliseconds a call of `calls` back-to-back calls over `pool`: by CUDA events on a GPU, the host clock on
    the CPU. `harness`: each call also does what the verifier's timed loop does on every call (its outputs kept
    until the loop ends, 4 random bytes drawn from the kernel as it returns), so what that work costs a call can be
    told from the rest of the verifier's gap."""
    import time

    import torch

    kept: list = []
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    begin = time.perf_counter()
    for i in range(calls):
        out = model(*pool[i % len(pool)])
        if harness:
            kept.append(out)
            os.urandom(4)
    if not cuda:
        return 1000.0 * (time.perf_counter() - begin) / calls
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def independent(
    variant: str, sizes: list[str], repeats: int, cupti: bool = False, device: str = "cuda", harness: bool = False
) -> dict:
    """In this process: per size, the reference's and the kernel's quickest time per call (ms) by `loop_ms`, over
    a pool of inputs larger than twice the cache in front of memory (a GPU's L2; the CPU's last level, at least
    32 MB assumed); on the CPU on every core (the verifier gives its one worker all of them). `cupti`: each model's
    first call runs under torch's profiler, as a profiled call does in the verifier (then CUPTI detached where
    TEARDOWN_CUPTI=1)."""
    import torch

    from concur.verify.contestant import let_cupti_detach

    cuda = device == "cuda"
    kernel_scope: dict = {}
    exec(compile(solution_code(variant, device), f"<{variant}>", "exec"), kernel_scope)
    if cuda:
        cache = torch.cuda.get_device_properties(0).L2_cache_size
    else:
        torch.set_num_threads(os.cpu_count() or 1)
        cache = max(os.sysconf("SC_LEVEL3_CACHE_SIZE") if "SC_LEVEL3_CACHE_SIZE" in os.sysconf_names else 0, 32 << 20)
    found = {}
    for size in sizes:
        scope: dict = {}
        exec(compile(task_code(size, device), f"<task {size}>", "exec"), scope)
        init = scope["get_init_inputs"]()
        models = {"eager": scope["Model"](*init).to(device), "kernel": kernel_scope["ModelNew"](*init).to(device)}
        one = [t.to(device) for t in scope["get_inputs"]()]
        per_set = sum(t.numel() * t.element_size() for t in one)
        pool = [[torch.randn_like(t) for t in one] for _ in range(max(4, -(-2 * cache // per_set) + 1))]
        if os.environ.get("SMALL_SPEEDUPS_CORE"):  # this (the main) thread alone, as the verifier places a side's
            os.sched_setaffinity(0, [int(os.environ["SMALL_SPEEDUPS_CORE"])])
        spinners = busy([int(c) for c in os.environ.get("SMALL_SPEEDUPS_BUSY", "").split(",") if c])
        if os.environ.get("SMALL_SPEEDUPS_FILTER") == "1":  # the seccomp filter every side's process runs under
            from concur.verify import sandbox

            sandbox._no_new_privileges()
            assert sandbox.stay_in_tree(keep_children=True), "the contestants' seccomp filter could not be installed"
        times: dict[str, list[float]] = {name: [] for name in models}
        calls = {}
        with torch.no_grad():
            if cupti and cuda:
                for model in models.values():
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        model(*pool[0])
                        torch.cuda.synchronize()
                    if os.environ.get("TEARDOWN_CUPTI") == "1":
                        let_cupti_detach(prof)
            for name, model in models.items():  # warm, and how many calls make a loop of MIN_LOOP_S
                loop_ms(model, pool, len(pool), cuda, harness)
                per_call_s = loop_ms(model, pool, len(pool), cuda, harness) / 1000.0
                calls[name] = max(len(pool), int(MIN_LOOP_S / max(per_call_s, 1e-7)))
            burst, _, gap_ms = os.environ.get("SMALL_SPEEDUPS_BURST", "").partition(":")  # "sleep:5", "spin:5"
            if burst:  # the same calls for both, B filling BATCH_S by the reference's pace (as timing.batch_size)
                per_call_s = loop_ms(models["eager"], pool, len(pool), cuda, harness) / 1000.0
                calls = dict.fromkeys(models, max(1, int(BATCH_S / max(per_call_s, 1e-7))))
            try:
                for _ in range(repeats * (BURSTS if burst else 1)):
                    for name, model in models.items():
                        if burst:
                            rest(float(gap_ms) / 1000.0, burst == "spin")
                        times[name].append(loop_ms(model, pool, calls[name], cuda, harness))
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
        medians = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        found[size] = {"eager_ms": min(times["eager"]), "kernel_ms": min(times["kernel"]),
                       "median_ratio": medians["eager"] / medians["kernel"]}  # fmt: skip
    return found


def verifier(
    variants: list[str],
    sizes: list[str],
    mode: str,
    work: Path,
    cache: Path,
    bell=True,
    core="timed",
    traced=None,
    device: str = "cuda",
) -> dict:
    """The verifier's readings; `traced`: a dict given each candidate's trace and timing summary."""
    from concur.verify import orchestrate

    orchestrate.DOORBELL, orchestrate.LAUNCH_CORE = bell, core  # the referees start again (their pool's key)
    program = lambda variant, size: solution_code(variant, device)  # noqa: E731
    table = verdicts(program, variants, sizes, mode, work, cache, device, traced)
    return {
        cid: (row["status"], row["speedup"], row["ref_best_ms"], row["new_best_ms"]) for cid, row in table.iterrows()
    }


def verdicts(
    program, variants: list[str], sizes: list[str], mode: str, work: Path, cache: Path, device: str, traced=None
):
    """The verdict table (by candidate id, "size:variant") of `program(variant, size)` on relu_add at each size,
    built and verified as the verifier's readings are; `traced`: as in `verifier`."""
    from verify_frames import candidates_frame, tasks_frame

    from concur.verify import api, compile_frame, verify_frame

    tasks = tasks_frame([(f"relu_add_{size}", task_code(size, device)) for size in sizes])
    candidates = candidates_frame(
        [(f"{size}:{v}", f"relu_add_{size}", program(v, size)) for size in sizes for v in variants]
    )
    workers = GPU_WORKERS if device == "cuda" else 1
    settings = {"device": device, "mode": mode, "workers": workers, "timeout_s": 300, "build_cache": str(cache)}
    builds = compile_frame(candidates, settings, work / "compile", False)
    if traced is not None:
        api.TRACE_SINK = lambda cid, report: traced.__setitem__(
            cid, {**report.trace, "timing": dataclasses.asdict(report.timing) if report.timing else None}
        )
    try:
        table = verify_frame(candidates, tasks, settings, work / "verify", False, builds=builds)
    finally:
        api.TRACE_SINK = None
    return table.set_index("candidate_id")


def launch_core() -> tuple[str, str]:
    """The core the verifier's referee of the first GPU runs a timed side's main thread on, with the workers
    `verifier` gives it (orchestrate.gpu_shares, referee.split_cores and timing_core, as the referee places it), and
    the cores of the rest of the referee and the timed side, comma-separated."""
    from concur.verify import orchestrate, referee

    _, threads, cpus = orchestrate.gpu_shares(GPU_WORKERS)
    active, _ = referee.split_cores(cpus[0], threads)
    main, rest = referee.timing_core(active)
    if main is None:
        raise SystemExit("--pinned: the verifier sets no launch core on this machine (fewer than 4 cores)")
    return str(main), ",".join(map(str, rest))


def rest(seconds: float, spin: bool) -> None:
    """A gap between two bursts: asleep (the core may idle, as between two timed batches), or spinning on it."""
    import time

    if not spin:
        return time.sleep(seconds)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def busy(cores: list[int]) -> list[subprocess.Popen]:
    """A process spinning on each of `cores`, as the referee spins on its doorbell while a side is timed."""
    spin = "import os, sys\nos.sched_setaffinity(0, [int(sys.argv[1])])\nwhile True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin, str(core)]) for core in cores]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--variants", type=lambda t: t.split(","))
    parser.add_argument("--sizes", type=lambda t: t.split(","))
    parser.add_argument("--mode", default="hardened", choices=["hardened", "kernelbench"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=1, help="the plain readings and the verifier's, in turn")
    parser.add_argument("--doorbell", choices=["on", "off", "both"], default="on")
    parser.add_argument("--launch-core", choices=["timed", "taken", "off", "both", "all"], default="timed")
    parser.add_argument("--cupti", action="store_true", help="also a plain reading with CUPTI attached")
    parser.add_argument("--harness", action="store_true", help="also a plain reading with the timed loop's own work")
    parser.add_argument("--pinned", action="store_true", help="also a plain reading on the verifier's launch core")
    parser.add_argument("--busy", action="store_true", help="also a pinned reading with the other cores spinning")
    parser.add_argument("--bursts", type=float, nargs="?", const=5.0, metavar="GAP_MS", help="also short bursts")
    parser.add_argument("--trace", type=Path, help="write the verifier's batch readings here (JSON)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: the independent reading of one variant
    parser.add_argument("--attach-cupti", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--harness-loop", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.variants = args.variants or (["cpp"] if cpu else ["fast", "fast_vec"])
    args.sizes = args.sizes or (["8x16", "64x256", "256x1024"] if cpu else ["256x1024", "1024x1024", "4096x4096"])
    if cpu and (args.cupti or args.pinned or args.busy or args.launch_core != "timed"):
        parser.error("--cupti, --pinned, --busy and --launch-core are for --device cuda")
    if args.one:
        print(
            json.dumps(
                independent(args.one, args.sizes, args.repeats, args.attach_cupti, args.device, args.harness_loop)
            )
        )
        return
    work = Path(tempfile.mkdtemp(prefix="concur-small-"))
    readings = [("plain", [], {"TEARDOWN_CUPTI": "0"})]
    if args.cupti:
        readings += [
            ("plain, CUPTI attached", ["--attach-cupti"], {"TEARDOWN_CUPTI": "0"}),
            ("plain, CUPTI detached", ["--attach-cupti"], {"TEARDOWN_CUPTI": "1"}),
        ]
    if args.harness:
        readings.append(("plain, the timed loop's work", ["--harness-loop"], {"TEARDOWN_CUPTI": "0"}))
        filtered = {"TEARDOWN_CUPTI": "0", "SMALL_SPEEDUPS_FILTER": "1"}
        readings.append(("plain, the timed loop's work, filtered", ["--harness-loop"], filtered))
    if args.bursts is not None:
        for how in ("sleep", "spin"):
            label = f"plain, {BATCH_S * 1000:g} ms bursts after {args.bursts:g} ms of {how}"
            readings.append((label, [], {"TEARDOWN_CUPTI": "0", "SMALL_SPEEDUPS_BURST": f"{how}:{args.bursts}"}))
    if args.pinned or args.busy:
        main_core, rest = launch_core()
        pinned = {"TEARDOWN_CUPTI": "0", "SMALL_SPEEDUPS_CORE": main_core}
        if args.pinned:
            readings.append(("plain, on the launch core", [], pinned))
        if args.busy:
            readings.append(("plain, on the launch core, the rest busy", [], {**pinned, "SMALL_SPEEDUPS_BUSY": rest}))
    if cpu:  # the plain loop's kernel built by the verifier's compiler; and by load_inline's own, where they differ
        from concur.verify.compiling import real_compiler
        from concur.verify.settings import resolve_host_compiler

        chosen = real_compiler({"host_compiler": resolve_host_compiler("auto")})
        readings[0][2]["CXX"] = chosen
        default = os.environ.get("CXX") or "c++"
        if Path(chosen).name != default:
            readings.append((f"plain, built by {default}", [], {"CXX": default}))
    bells = {"on": [True], "off": [False], "both": [True, False]}[args.doorbell]
    holds = {"both": ["timed", "taken"], "all": ["timed", "taken", "off"]}.get(args.launch_core, [args.launch_core])
    plain: dict[str, dict[str, list]] = {label: {v: [] for v in args.variants} for label, _, _ in readings}
    judged: dict[str, list] = {}
    traces: dict[str, list] = {}
    for number in range(args.rounds):  # round by round, as the host's pace moves between levels over a run
        for v in args.variants:  # one at a time: two readings side by side on one GPU would slow each other
            for n, (label, extra, env) in enumerate(readings):
                child = subprocess.run(
                    [sys.executable, __file__, "--one", v, "--sizes", ",".join(args.sizes)]
                    + ["--repeats", str(args.repeats), "--device", args.device]
                    + extra,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(work / f"ext-{v}-{n if cpu else 0}"), **env),
                    check=True,
                )
                found = json.loads(child.stdout.strip().splitlines()[-1])
                plain[label][v].append(found)
                print(json.dumps({"round": number + 1, "reading": label, "variant": v, **found}), flush=True)
        for bell in bells:
            for core in holds:
                label = f"verifier, doorbell {'on' if bell else 'off'}" + (f", core {core}" if len(holds) > 1 else "")
                traced = {} if args.trace else None
                table = verifier(
                    args.variants,
                    args.sizes,
                    args.mode,
                    work / f"v-{bell}-{core}-{number}",
                    work / "cache",
                    bell,
                    core,
                    traced,
                    args.device,
                )
                judged.setdefault(label, []).append(table)
                traces.setdefault(label, []).append(traced)
                print(json.dumps({"round": number + 1, "reading": label, **table}), flush=True)  # kept if cut short
                if args.trace:
                    args.trace.write_text(json.dumps({"plain": plain, "verifier": traces}))
    print_table(args.sizes, args.variants, plain, judged)


def print_table(sizes: list[str], variants: list[str], plain: dict, judged: dict) -> None:
    """Per task, variant and reading: the quickest times and the speedup, each the median over the rounds (with
    the speedup's range where there were several), and the speedup's median against the plain loop's."""
    rounds = max(len(found) for by_variant in plain.values() for found in by_variant.values())
    speedup = "speedup (median, range)" if rounds > 1 else "speedup"
    print(f"| task | variant | reading | ref / kernel ms (quickest) | {speedup} | vs plain loop |")
    print("|---|---|---|---:|---:|---:|")
    for size in sizes:
        for v in variants:
            rows = []
            for label, by_variant in plain.items():
                found = [r[size] for r in by_variant[v]]
                ratios = [r["eager_ms"] / r["kernel_ms"] for r in found]
                note = f" (medians' {statistics.median([r['median_ratio'] for r in found]):.2f})"
                rows.append((label, [r["eager_ms"] for r in found], [r["kernel_ms"] for r in found], ratios, note))
            for label, tables in judged.items():
                found = [table[f"{size}:{v}"] for table in tables]
                statuses = ", ".join(sorted({status for status, *_ in found}))
                rows.append(
                    (label, [r[2] for r in found], [r[3] for r in found], [r[1] for r in found], f" ({statuses})")
                )
            other = statistics.median(rows[0][3])
            for label, ref_ms, new_ms, ratios, note in rows:
                spread = f" {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""
                ratio, ref, new = (statistics.median(x) for x in (ratios, ref_ms, new_ms))
                print(
                    f"| {size} | {v} | {label} | {ref:.4f} / {new:.4f} | "
                    f"{ratio:.2f}{spread}{note} | {ratio / other:.3f} |"
                )


if __name__ == "__main__":
    main()

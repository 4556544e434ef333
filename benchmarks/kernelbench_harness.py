"""KernelBench's own evaluation of a candidate folder, batched the way its scripts/eval_from_generations.py does.

Input: a folder made by benchmarks/kernelbench_candidates.py (`<id>.py` + `manifest.jsonl`) and a KernelBench
checkout (its `src/` is imported, nothing of it is copied; references are read from
`<checkout>/KernelBench/level<L>/<problem_name>`). Two phases, as with `build_cache=True` in KernelBench:

1. Pre-build: every candidate's extension is built on the CPU by `kernelbench.eval.build_compile_cache` into its
   own build directory (`<work>/build/<id>`), `--build-workers` at a time, each build in a fresh Python process.
   A failed build's directory is removed (as KernelBench does), so the evaluation tries to build it again.
2. Evaluation: each candidate in a fresh Python process, one process at a time per GPU, killed after `--timeout`
   seconds (KernelBench: 180), calling `kernelbench.eval.eval_kernel_against_ref(ref, candidate,
   num_correct_trials=5, num_perf_trials=100, measure_performance=True, timing_method="cuda_event",
   build_dir=<work>/build/<id>, device=cuda:<i>, backend="cuda", precision=--precision)`. An exception escaping it is
   recorded as KernelBench's eval_from_generations records it (not compiled; a `cuda_error` when the message
   contains "CUDA error", else `other_error`); a timeout as not compiled with the error "Evaluation timed out".

Output (`--out`, JSON lines, one per candidate, appended as each finishes; a rerun skips the ids already there):
    id, level, problem_id, problem_name, source, model, recorded_status (what the dump recorded)
    status        correct | incorrect | compile_error | runtime_error | timeout | crash | no_result
    compiled, correctness, runtime, ref_runtime, speedup, runtime_stats, ref_runtime_stats, error_name, error,
    excessive_speedup, metadata
                  as KernelBench reports them (runtime and ref_runtime are the means of KernelBench's timing
                  statistics: its timing functions return milliseconds, although its result class says us)
    gpu_s         wall time of the candidate's evaluation process (start to exit: the GPU-seconds it cost)
    eval_call_s   time inside eval_kernel_against_ref; import_s: Python start to KernelBench imported
    eval_cpu_s    CPU time (user+sys) of the evaluation process and its children
    build_status  built | failed | timeout | skipped;  build_s: wall time of the build process;
    build_cpu_s   CPU time (user+sys) of the build process and every compiler it ran;  build_call_s
    device, precision (--precision: fp32, fp16 or bf16; inputs and weights cast to it, KernelBench's tolerance
                  for it), tolerance (the allclose tolerance used), stubbed (modules replaced by stand-ins, see below)

At the end it prints counts per status, mean and median GPU-seconds per candidate, candidates per hour on the
GPUs used, and the build seconds (wall and CPU).

KernelBench's package imports `openai`, `litellm`, `dotenv`, `tqdm` and `requests` when it is imported (for its LLM
queries, progress bars and downloads, never on the evaluation path). Where one of them is not installed, the child
processes put an inert stand-in module in its place and record its name in `stubbed`; `pydantic` (used by eval.py)
must be installed: `pip install --no-index --find-links <wheel folder> pydantic python-dotenv tqdm`.

    python benchmarks/kernelbench_harness.py CANDIDATES --kernelbench CHECKOUT --out kb.jsonl [--work DIR]
        [--gpus 1] [--build-workers N] [--timeout 180] [--gpu-arch Hopper] [--precision fp32|fp16|bf16]
        [--ids a,b] [--limit N] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
STATUSES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "crash", "no_result")
BUILD_STATUSES = ("built", "failed", "timeout", "skipped")


# ----------------------------------------------------------------------------------------------- candidates


def load_candidates(folder: Path, checkout: Path, ids: list[str] | None = None, limit: int | None = None
                    ) -> tuple[list[dict], list[str]]:  # fmt: skip
    """The manifest's candidates with their program and reference paths, and a line per one that cannot run."""
    manifest = folder / "manifest.jsonl"
    if not manifest.is_file():
        raise SystemExit(f"{manifest} is missing")
    wanted = set(ids) if ids else None
    cands, problems = [], []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if wanted is not None and row["id"] not in wanted:
            continue
        program = folder / f"{row['id']}.py"
        ref = reference_path(checkout, int(row["level"]), int(row["problem_id"]), row.get("problem_name"))
        if not program.is_file():
            problems.append(f"{row['id']}: {program.name} is missing")
            continue
        if ref is None:
            problems.append(f"{row['id']}: no level {row['level']} problem {row['problem_id']} in {checkout}")
            continue
        cands.append({**row, "program": str(program), "reference": str(ref), "problem_name": ref.name})
        if limit and len(cands) >= limit:
            break
    return cands, problems


def reference_path(checkout: Path, level: int, problem_id: int, name: str | None) -> Path | None:
    folder = checkout / "KernelBench" / f"level{level}"
    if name and (folder / name).is_file():
        return folder / name
    matches = sorted(folder.glob(f"{problem_id}_*.py"))
    return matches[0] if len(matches) == 1 else None


# --------------------------------------------------------------------------------------------- child side


def _unavailable(*_a, **_k):
    raise RuntimeError("not installed: this harness never queries a model or the network")


class _NullBar:
    def update(self, *_a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_a):
        return False


# KernelBench's imports that its evaluation never uses, and the stand-ins' contents where one is not installed
STAND_INS = {
    "openai": {"OpenAI": _unavailable},
    "litellm": {"completion": _unavailable},
    "dotenv": {"load_dotenv": lambda *a, **k: False},
    "tqdm": {"tqdm": lambda iterable=None, *a, **k: iterable if iterable is not None else _NullBar()},
    "requests": {"get": _unavailable, "post": _unavailable},  # eval.py imports it and calls none of it
}


def import_kernelbench(checkout: Path) -> list[str]:
    """Put <checkout>/src first on sys.path and import kernelbench; returns the modules given stand-ins."""
    import importlib
    import types

    sys.path.insert(0, str(checkout / "src"))
    stubbed = []
    for name, attrs in STAND_INS.items():
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
            stubbed.append(name)
    importlib.import_module("kernelbench.eval")
    return stubbed


def check_importable(checkout: Path) -> None:
    """Stop before any build if the children could not import KernelBench: every candidate would read as a crash."""
    cmd = [sys.executable, str(HERE), "--child-check", "--kernelbench", str(checkout.resolve())]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"error: KernelBench from {checkout / 'src'} does not import here: {last}")


def set_arch(arch: str) -> None:
    """KernelBench's set_gpu_arch for its names (Hopper, Ada, ...); a number such as 9.0 is used as it is."""
    names = [a for a in arch.replace(",", ";").split(";") if a]
    if all(n[:1].isdigit() for n in names):
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(names)
    else:
        from kernelbench.utils import set_gpu_arch

        set_gpu_arch(names)


def _short(value, limit: int = 2000):
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def child_build(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    stubbed = import_kernelbench(Path(args.kernelbench))
    set_arch(args.gpu_arch)
    from kernelbench.eval import build_compile_cache

    src = Path(args.program).read_text()
    t0 = time.perf_counter()
    ok, _stdout, error = build_compile_cache(custom_model_src=src, verbose=False, build_dir=args.build_dir)
    out = {"ok": bool(ok), "error": _short(error or ""), "build_call_s": time.perf_counter() - t0,
           "import_s": t0 - start, "stubbed": stubbed}  # fmt: skip
    Path(args.result).write_text(json.dumps(out))


def child_eval(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    stubbed = import_kernelbench(Path(args.kernelbench))
    set_arch(args.gpu_arch)
    import torch
    from kernelbench import eval as kb_eval

    if args.fp32_tolerance is not None:  # a deliberate override, recorded in the output
        override, original = args.fp32_tolerance, kb_eval.get_tolerance_for_precision
        kb_eval.get_tolerance_for_precision = lambda p: override if p in ("fp32", torch.float32) else original(p)
    tolerance = kb_eval.get_tolerance_for_precision(args.precision)  # the one this precision's check uses
    device = torch.device(f"cuda:{args.device}")
    ref_src, cand_src = Path(args.reference).read_text(), Path(args.program).read_text()
    t0 = time.perf_counter()
    try:
        result = kb_eval.eval_kernel_against_ref(
            original_model_src=ref_src, custom_model_src=cand_src, num_correct_trials=args.num_correct_trials,
            num_perf_trials=args.num_perf_trials, measure_performance=True, timing_method=args.timing_method,
            verbose=False, build_dir=args.build_dir, device=device, backend="cuda",
            precision=kb_eval.get_torch_dtype_from_string(args.precision))  # fmt: skip
        escaped = None
    except Exception as exc:  # what eval_from_generations records for an exception escaping the evaluation
        result, escaped = None, exc
    call_s = time.perf_counter() - t0
    try:
        device_name = torch.cuda.get_device_name(device)
    except Exception:  # no usable GPU: the result says why
        device_name = None
    out = {"eval_call_s": call_s, "import_s": t0 - start, "stubbed": stubbed, "tolerance": tolerance,
           "device_name": device_name, "torch": torch.__version__}  # fmt: skip
    if escaped is not None:
        key = "cuda_error" if "CUDA error" in str(escaped) else "other_error"
        meta = {key: _short(f"{'CUDA Error' if key == 'cuda_error' else 'error'}: {escaped}"),
                f"{key}_name": kb_eval.get_error_name(escaped)}  # fmt: skip
        out["kb"] = {"compiled": False, "correctness": False, "runtime": -1.0, "ref_runtime": -1.0,
                     "metadata": meta, "escaped": True}  # fmt: skip
    elif result is None:
        out["kb"] = None  # KernelBench returns None for a lock-file error during compilation ("please retry")
    else:
        dumped = result.model_dump() if hasattr(result, "model_dump") else result.dict()
        dumped["metadata"] = kb_eval.check_metadata_serializable_all_types(dumped.get("metadata") or {})
        out["kb"] = json.loads(json.dumps(dumped, default=str))
    Path(args.result).write_text(json.dumps(out, default=str))


# -------------------------------------------------------------------------------------------- parent side


def child_command(kind: str, cand: dict, args: argparse.Namespace, work: Path, device: int | None = None
                  ) -> list[str]:  # fmt: skip
    cmd = [sys.executable, str(HERE), f"--child-{kind}", "--kernelbench", str(Path(args.kernelbench).resolve()),
           "--program", cand["program"], "--build-dir", str(work / "build" / cand["id"]),
           "--result", str(result_path(work, kind, cand["id"])), "--gpu-arch", args.gpu_arch]  # fmt: skip
    if kind == "eval":
        cmd += ["--reference", cand["reference"], "--device", str(device), "--precision", args.precision,
                "--num-correct-trials", str(args.num_correct_trials), "--num-perf-trials", str(args.num_perf_trials),
                "--timing-method", args.timing_method]  # fmt: skip
        if args.fp32_tolerance is not None:
            cmd += ["--fp32-tolerance", repr(args.fp32_tolerance)]
    return cmd


def result_path(work: Path, kind: str, cid: str) -> Path:
    return work / f"{kind}-results" / f"{cid}.json"


def run_measured(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run a command in its own process group; wall time, CPU time of it and its reaped children, exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)  # fmt: skip
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > timeout and not timed_out:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if not timed_out:  # leftovers of a finished child (a daemon it started) go too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "returncode": proc.returncode, "timed_out": timed_out}  # fmt: skip


def read_jsonl(path: Path) -> dict[str, dict]:
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut off by a kill
                continue
            rows[row["id"]] = row
    return rows


def prebuild(cands: list[dict], args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Build every candidate's extension, --build-workers at a time; records are kept in <work>/builds.jsonl."""
    done = read_jsonl(work / "builds.jsonl")
    todo = [c for c in cands if c["id"] not in done]
    lock = threading.Lock()
    jobs: queue.Queue = queue.Queue()
    for c in todo:
        jobs.put(c)
    t_start = time.perf_counter()

    def worker() -> None:
        while True:
            try:
                c = jobs.get_nowait()
            except queue.Empty:
                return
            build_dir = work / "build" / c["id"]
            shutil.rmtree(build_dir, ignore_errors=True)
            build_dir.mkdir(parents=True)
            res_file = result_path(work, "build", c["id"])
            res_file.parent.mkdir(parents=True, exist_ok=True)
            res_file.unlink(missing_ok=True)
            m = run_measured(child_command("build", c, args, work), work / "logs" / f"{c['id']}.build.log",
                             args.build_timeout)  # fmt: skip
            res = json.loads(res_file.read_text()) if res_file.is_file() else {}
            if m["timed_out"]:
                status = "timeout"
            elif res.get("ok"):
                status = "built"
            else:
                status = "failed"
            if status != "built":
                shutil.rmtree(build_dir, ignore_errors=True)  # as KernelBench: the evaluation builds it again
            rec = {"id": c["id"], "build_status": status, "build_s": m["wall_s"], "build_cpu_s": m["cpu_s"],
                   "build_call_s": res.get("build_call_s"), "build_error": res.get("error", "")[:500],
                   "build_returncode": m["returncode"]}  # fmt: skip
            with lock:
                done[c["id"]] = rec
                with open(work / "builds.jsonl", "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                n = len(done)
            print(f"[build {n}/{len(cands)}] {c['id']}: {status} in {m['wall_s']:.1f} s "
                  f"(cpu {m['cpu_s']:.1f} s)", flush=True)  # fmt: skip

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(args.build_workers, len(todo))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if todo:
        print(f"[build] {len(todo)} builds in {time.perf_counter() - t_start:.1f} s wall", flush=True)
    return done


def classify(kb: dict | None, timed_out: bool, got_result: bool) -> tuple[str, str, str]:
    """(status, error name, error message) of one KernelBench result."""
    if timed_out:
        return "timeout", "timeout", "Evaluation timed out"
    if not got_result:
        return "crash", "crash", "the evaluation process ended without a result"
    if kb is None:
        return "no_result", "lock_file_error", "eval_kernel_against_ref returned None"
    meta = kb.get("metadata") or {}
    name = next((meta[k] for k in ("compilation_error_name", "runtime_error_name", "cuda_error_name",
                                   "other_error_name", "correctness_issue_name") if meta.get(k)), "")  # fmt: skip
    message = next((str(meta[k]) for k in ("compilation_error", "runtime_error", "cuda_error", "other_error",
                                           "correctness_issue", "error") if meta.get(k)), "")  # fmt: skip
    if not kb.get("compiled"):
        status = "runtime_error" if ("cuda_error" in meta or "other_error" in meta) else "compile_error"
    elif kb.get("correctness"):
        status = "correct"
    elif "runtime_error" in meta:
        status = "runtime_error"
    else:
        status = "incorrect"
    if status == "incorrect" and not name:
        name = "correctness_issue" if meta.get("correctness_issue") else ""
    return status, name, _short(message, 500)


def evaluate(cands: list[dict], builds: dict[str, dict], args: argparse.Namespace, work: Path, out: Path) -> None:
    """Each candidate in a fresh process, one at a time per GPU; records appended to `out` as they finish."""
    done = read_jsonl(out)
    todo = [c for c in cands if c["id"] not in done]
    jobs: queue.Queue = queue.Queue()
    for c in todo:
        jobs.put(c)
    lock = threading.Lock()
    counter = {"n": len(done)}

    def gpu_worker(device: int) -> None:
        while True:
            try:
                c = jobs.get_nowait()
            except queue.Empty:
                return
            res_file = result_path(work, "eval", c["id"])
            res_file.parent.mkdir(parents=True, exist_ok=True)
            res_file.unlink(missing_ok=True)
            m = run_measured(child_command("eval", c, args, work, device), work / "logs" / f"{c['id']}.eval.log",
                             args.timeout)  # fmt: skip
            res = json.loads(res_file.read_text()) if res_file.is_file() and not m["timed_out"] else None
            kb = res.get("kb") if res else None
            status, err_name, err = classify(kb, m["timed_out"], res is not None)
            kb = kb or {}
            meta = kb.get("metadata") or {}
            runtime, ref_runtime = kb.get("runtime", -1.0), kb.get("ref_runtime", -1.0)
            rec = {"id": c["id"], "level": c["level"], "problem_id": c["problem_id"],
                   "problem_name": c["problem_name"], "source": c.get("source"), "model": c.get("model"),
                   "recorded_status": (c.get("recorded") or {}).get("status"), "status": status,
                   "compiled": bool(kb.get("compiled")), "correctness": bool(kb.get("correctness")),
                   "runtime": runtime, "ref_runtime": ref_runtime,
                   "speedup": ref_runtime / runtime if runtime and runtime > 0 and ref_runtime > 0 else None,
                   "runtime_stats": kb.get("runtime_stats") or {},
                   "ref_runtime_stats": kb.get("ref_runtime_stats") or {},
                   "excessive_speedup": bool(meta.get("excessive_speedup")), "error_name": err_name, "error": err,
                   "metadata": {k: _short(v, 500) for k, v in meta.items() if k != "runtime_error_traceback"},
                   "gpu_s": m["wall_s"], "eval_cpu_s": m["cpu_s"], "returncode": m["returncode"],
                   "eval_call_s": res.get("eval_call_s") if res else None,
                   "import_s": res.get("import_s") if res else None,
                   "device": f"cuda:{device}", "precision": args.precision,
                   "device_name": res.get("device_name") if res else None,
                   "torch": res.get("torch") if res else None,
                   "tolerance": res.get("tolerance") if res else args.fp32_tolerance,
                   "stubbed": res.get("stubbed") if res else None}  # fmt: skip
            rec.update({k: v for k, v in builds.get(c["id"], {"build_status": "skipped"}).items() if k != "id"})
            with lock:
                with open(out, "a") as fh:
                    fh.write(json.dumps(rec, default=str) + "\n")
                counter["n"] += 1
                n = counter["n"]
            print(f"[eval {n}/{len(cands)} cuda:{device}] {c['id']}: {status}"
                  f"{' ' + err_name if err_name else ''} in {m['wall_s']:.1f} s", flush=True)  # fmt: skip

    threads = [threading.Thread(target=gpu_worker, args=(d,)) for d in range(args.gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def summarize(out: Path, ids: set[str], gpus: int, eval_wall: float | None) -> dict:
    rows = [r for r in read_jsonl(out).values() if r["id"] in ids]
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    gpu = [r["gpu_s"] for r in rows]
    built = [r for r in rows if r.get("build_status") == "built"]
    summary = {
        "candidates": len(rows),
        "status": {k: v for k, v in counts.items() if v},
        "compiled": sum(r["compiled"] for r in rows),
        "correct": sum(r["compiled"] and r["correctness"] for r in rows),
        "gpu_s_mean": statistics.fmean(gpu) if gpu else None,
        "gpu_s_median": statistics.median(gpu) if gpu else None,
        "gpu_s_total": sum(gpu),
        "candidates_per_hour_gpu": 3600 * gpus / statistics.fmean(gpu) if gpu else None,
        "eval_phase_wall_s": eval_wall,
        "build_status": {s: sum(r.get("build_status") == s for r in rows) for s in BUILD_STATUSES},
        "build_s_mean": statistics.fmean(r["build_s"] for r in built) if built else None,
        "build_s_median": statistics.median(r["build_s"] for r in built) if built else None,
        "build_cpu_s_mean": statistics.fmean(r["build_cpu_s"] for r in built) if built else None,
        "build_cpu_s_median": statistics.median(r["build_cpu_s"] for r in built) if built else None,
    }
    print("\nKernelBench eval_kernel_against_ref, fresh process per candidate:")
    for k, v in summary.items():
        shown = "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
        print(f"  {k:<26} {shown}")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidates", type=Path, nargs="?", help="folder with <id>.py and manifest.jsonl")
    parser.add_argument("--kernelbench", required=True, help="KernelBench checkout (src/, KernelBench/)")
    parser.add_argument("--out", type=Path, help="JSON lines, one per candidate (appended; rerun resumes)")
    parser.add_argument("--work", type=Path, help="build dirs, logs, per-candidate results (default <out>.work)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs cuda:0..N-1, one evaluation at a time on each")
    parser.add_argument("--build-workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="parallel pre-builds (default: the CPU count)")  # fmt: skip
    parser.add_argument("--build-timeout", type=float, default=600.0,
                        help="seconds per pre-build (KernelBench's compile step uses its 180 s timeout and "
                             "starts a timed-out build again; default 600, no retry)")  # fmt: skip
    parser.add_argument("--no-prebuild", action="store_true", help="skip phase 1: each evaluation builds its own")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds per evaluation process (KernelBench: 180)"
    )
    parser.add_argument(
        "--gpu-arch",
        default="Hopper",
        help="KernelBench arch name(s) (Hopper, Ada, ...; ';'-separated) or numbers (9.0)",
    )
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument(
        "--fp32-tolerance",
        type=float,
        default=None,
        help="override KernelBench's fp32 allclose tolerance (its own at 423217d: 1e-4; "
        "KernelBench v0/v0.1 and concur's kernelbench mode: 1e-2); default: KernelBench's",
    )
    parser.add_argument("--num-correct-trials", type=int, default=5)
    parser.add_argument("--num-perf-trials", type=int, default=100)
    parser.add_argument("--timing-method", default="cuda_event")
    parser.add_argument("--ids", default="", help="comma-separated candidate ids (default: all)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N candidates of the manifest")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    # the child processes
    parser.add_argument("--child-build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-eval", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-check", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--program", "--reference", "--build-dir", "--result"):
        parser.add_argument(flag, help=argparse.SUPPRESS)
    parser.add_argument("--device", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_build:
        return child_build(args)
    if args.child_eval:
        return child_eval(args)
    if args.child_check:
        import_kernelbench(Path(args.kernelbench))
        return None
    if args.candidates is None or (args.out is None and not args.dry_run):
        parser.error("CANDIDATES and --out are required")

    checkout = Path(args.kernelbench)
    cands, problems = load_candidates(args.candidates, checkout, [i for i in args.ids.split(",") if i] or None,
                                      args.limit)  # fmt: skip
    out = (args.out or Path("kernelbench_harness.jsonl")).resolve()
    work = (args.work or out.with_name(out.name + ".work")).resolve()
    for p in problems:
        print(f"[skip] {p}")
    if args.dry_run:
        print(f"plan: {len(cands)} candidates (level 1: {sum(c['level'] == 1 for c in cands)}, level 2: "
              f"{sum(c['level'] == 2 for c in cands)}; {len({(c['level'], c['problem_id']) for c in cands})} "
              f"problems), KernelBench from {checkout.resolve() / 'src'}")  # fmt: skip
        print(
            f"phase 1: {'skipped (--no-prebuild)' if args.no_prebuild else 'pre-build'} with "
            f"{args.build_workers} workers, {args.build_timeout:.0f} s each, into {work / 'build'}/<id>"
        )
        print(f"phase 2: one process at a time on each of cuda:0..{args.gpus - 1}, {args.timeout:.0f} s each; "
              f"{args.num_correct_trials} correctness trials, {args.num_perf_trials} timed ({args.timing_method}), "
              f"{args.precision}, fp32 tolerance "
              f"{'KernelBench' + chr(39) + 's' if args.fp32_tolerance is None else args.fp32_tolerance}; "
              f"results to {out}")  # fmt: skip
        for i, c in enumerate(cands):
            print(f"{c['id']}  L{c['level']} {c['problem_name']}  <- {c.get('repo')}:{c.get('path')}")
            if i < 2 or args.ids:
                if not args.no_prebuild:
                    print("  build: " + shlex.join(child_command("build", c, args, work)))
                print("  eval:  " + shlex.join(child_command("eval", c, args, work, i % args.gpus)))
        return None

    check_importable(checkout)
    work.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    builds: dict[str, dict] = {}
    if not args.no_prebuild:
        t0 = time.perf_counter()
        builds = prebuild(cands, args, work)
        print(f"[phase 1] pre-build: {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    evaluate(cands, builds, args, work, out)
    eval_wall = time.perf_counter() - t0
    print(f"[phase 2] evaluation: {eval_wall:.1f} s", flush=True)
    summary = summarize(out, {c["id"] for c in cands}, args.gpus, eval_wall)
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    return None


if __name__ == "__main__":
    main()

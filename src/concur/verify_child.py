"""What runs inside the isolated verifier process: build the candidate, then check and time it against the reference.

Started by `concur.verify` as `python verify_child.py <job_dir> <phase>` with the run's nonce in the environment.
It reads `job.json`, `reference.py` and `solution.py` from `job_dir` and writes `result.json` (after each phase, so
a crash later still leaves the earlier facts). It reports raw facts only; the parent decides the verdict.
Phases: `pch` (build the shared precompiled header), `compile` (exec the solution module, which runs load_inline),
`all` (compile, then evaluate: correctness trials and timing). Self-contained: stdlib and torch only.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path

NONCE_ENV = "CONCUR_VERIFY_NONCE"
SEED = 42
PCH_CFLAGS = ["-O3"]  # flags of the shared precompiled header; gcc ignores it for builds with incompatible flags
LOCK_NAME = "extension.h.concur-lock"

if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # the package folder must not shadow top-level modules for the solution


class Reporter:
    """Accumulates facts and writes them atomically, stamped with the nonce the parent gave this run."""

    def __init__(self, job_dir: Path, nonce: str):
        self.path = job_dir / "result.json"
        self.facts: dict = {"nonce": nonce, "complete": False}

    def update(self, **facts) -> None:
        self.facts.update(facts)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.facts, default=_jsonable))
        os.replace(tmp, self.path)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(err: BaseException) -> str:
    return one_line(f"{type(err).__name__}: {err}")


def first_error_line(message: str) -> str:
    """The first compiler `error:` line of a build log (file path shortened), else its first non-empty line."""
    # gcc quotes names with typographic quotes under a UTF-8 locale: report the same line whatever the locale
    message = str(message).translate({0x2018: "'", 0x2019: "'"})
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for line in lines:
        if "error:" in line:
            return one_line(re.sub(r"^\S*/(?=[^/\s]+:\d+)", "", line))
    return one_line(lines[0]) if lines else "build failed"


# ---------------------------------------------------------------- process limits and seeding


def apply_limits(spec: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit_mb = spec.get("memory_limit_mb")
    if limit_mb:
        as_bytes = int(limit_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def exec_program(source: str, filename: str, module_name: str) -> dict:
    """Run a program as a fresh module and return its namespace (registered in sys.modules for pickling/dataclasses)."""
    import types

    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module.__dict__


# ---------------------------------------------------------------- build: load_inline wrapper and shared PCH


def torch_include_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "include" / "torch"


def pch_lock_path() -> Path:
    folder = torch_include_dir()
    return folder / LOCK_NAME if os.access(folder, os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp")) / LOCK_NAME


def ensure_shared_pch(original_check, extra_cflags=None, extra_include_paths=None) -> None:
    """Build torch/extension.h.gch once, under an fcntl lock; never rebuild an existing one (others may read it)."""
    import fcntl

    if (torch_include_dir() / "extension.h.gch").exists():
        return
    with open(pch_lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (torch_include_dir() / "extension.h.gch").exists():
            original_check(extra_cflags, extra_include_paths)


class BuildRecorder:
    """Wraps cpp_extension.load_inline/load: injects use_pch for CPU C++ builds and records build failures."""

    def __init__(self, device: str):
        self.device = device
        self.calls = 0
        self.error: str | None = None

    def install(self) -> None:
        from torch.utils import cpp_extension

        original_check = cpp_extension._check_and_build_extension_h_precompiler_headers
        cpp_extension._check_and_build_extension_h_precompiler_headers = (
            lambda extra_cflags=None, extra_include_paths=None, *args, **kwargs: ensure_shared_pch(
                original_check, extra_cflags, extra_include_paths
            )
        )
        cpp_extension.remove_extension_h_precompiler_headers = lambda: None  # the header is shared: never delete it
        cpp_extension.load_inline = self.wrap(cpp_extension.load_inline, inline=True)
        cpp_extension.load = self.wrap(cpp_extension.load, inline=False)

    def wrap(self, original, inline: bool):
        def recorded(*args, **kwargs):
            self.calls += 1
            if inline and self.device == "cpu" and not kwargs.get("cuda_sources"):
                kwargs.setdefault("use_pch", True)
            try:
                cached = load_cached(args, kwargs) if inline else None
                if cached is not None:
                    return cached
                module = original(*args, **kwargs)
                mark_built(args, kwargs)
                return module
            except BaseException as err:
                if self.error is None:
                    self.error = first_error_line(str(err))
                raise

        return recorded


BUILT_MARKER = ".concur-built"
_LOADED_NAMES: set = set()


def _build_dir(args: tuple, kwargs: dict) -> Path | None:
    name = kwargs.get("name", args[0] if args else None)
    root = kwargs.get("build_directory") or os.environ.get("TORCH_EXTENSIONS_DIR")
    if not isinstance(name, str) or not root:
        return None
    return Path(root) if kwargs.get("build_directory") else Path(root) / name


def load_cached(args: tuple, kwargs: dict):
    """Import a module this cache entry already built, without asking ninja.

    The cache key covers the code and build environment, so the module is current; ninja could still decide to
    rebuild when the shared precompiled header it depended on was deleted or rebuilt by someone else.
    """
    from torch.utils import cpp_extension

    folder = _build_dir(args, kwargs)
    name = kwargs.get("name", args[0] if args else None)
    if name in _LOADED_NAMES:  # a second load of one name in one process: torch versions it, let torch handle it
        return None
    _LOADED_NAMES.add(name)
    if folder is None or not (folder / BUILT_MARKER).exists() or not (folder / f"{name}.so").exists():
        return None
    return cpp_extension._import_module_from_library(name, str(folder), kwargs.get("is_python_module", True))


def mark_built(args: tuple, kwargs: dict) -> None:
    folder = _build_dir(args, kwargs)
    if folder is not None and folder.is_dir():
        (folder / BUILT_MARKER).write_text("ok\n")


def build_pch(spec: dict, report: Reporter) -> None:
    from torch.utils import cpp_extension

    start = time.perf_counter()
    ensure_shared_pch(cpp_extension._check_and_build_extension_h_precompiler_headers, PCH_CFLAGS, None)
    report.update(pch_s=time.perf_counter() - start, complete=True)


# ---------------------------------------------------------------- phase 1: compile (exec the solution module)


def compile_phase(spec: dict, job_dir: Path, report: Reporter) -> dict | None:
    recorder = BuildRecorder(spec["device"])
    recorder.install()
    source = (job_dir / "solution.py").read_text()
    facts: dict = {"ok": False, "load_calls": 0, "build_error": None, "error": None, "syntax_error": False}
    start = time.perf_counter()
    namespace = None
    try:
        namespace = exec_program(source, str(job_dir / "solution.py"), "concur_solution")
        facts["ok"] = True
    except SyntaxError as err:
        facts.update(syntax_error=True, error=one_line(f"SyntaxError: {err.msg} (line {err.lineno})"))
    except BaseException as err:  # SystemExit included: the solution must not end the run
        facts["error"] = describe(err)
        facts["traceback"] = traceback.format_exc(limit=-3)
    facts["seconds"] = time.perf_counter() - start
    facts["load_calls"] = recorder.calls
    facts["build_error"] = recorder.error
    facts["has_model_new"] = bool(namespace) and "ModelNew" in namespace
    report.update(compile=facts)
    return namespace if facts["ok"] else None


# ---------------------------------------------------------------- phase 2: evaluate (correctness, then timing)


def pick_device(name: str):
    import torch

    if name == "cuda":
        return torch.device("cuda"), f"cuda:{torch.cuda.get_device_name(0)}"
    return torch.device("cpu"), "cpu"


def to_device(values, device):
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def leaves(output) -> list:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in leaves(item)]
    return [output]


def compare(new, ref, atol: float, rtol: float) -> dict:
    """Raw facts about one candidate output against the reference output."""
    import torch

    new_leaves, ref_leaves = leaves(new), leaves(ref)
    if len(new_leaves) != len(ref_leaves):
        return {"ok_shape": False, "detail": f"{len(new_leaves)} outputs, expected {len(ref_leaves)}"}
    facts = {"ok_shape": True, "ok_dtype": True, "ok_finite": True, "allclose": True, "max_abs_err": 0.0}
    for i, (a, b) in enumerate(zip(new_leaves, ref_leaves)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                facts.update(allclose=False, detail=f"output {i}: {a!r} != {b!r}")
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            return {"ok_shape": False, "detail": f"output {i}: got {got}, expected {tuple(b.shape)}"}
        if a.dtype != b.dtype:
            facts.update(ok_dtype=False, detail=f"output {i}: got {a.dtype}, expected {b.dtype}")
            continue
        a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
        if bool((~torch.isfinite(a) & torch.isfinite(b)).any()):
            facts.update(ok_finite=False, detail=f"output {i}: non-finite values where the reference is finite")
        facts["max_abs_err"] = max(facts["max_abs_err"], max_abs_error(a, b))
        if not torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
            facts["allclose"] = False
    return facts


def max_abs_error(a, b) -> float:
    import torch

    if a.numel() == 0:
        return 0.0
    diff = (a - b).abs()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same, torch.zeros_like(diff), diff)
    return float(torch.nan_to_num(diff, nan=math.inf).max())


def snapshot(values) -> list:
    import torch

    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def mutated_inputs(before: list, after: list) -> list[int]:
    import torch

    return [
        i
        for i, (b, a) in enumerate(zip(before, after))
        if isinstance(b, torch.Tensor) and not torch.equal(torch.nan_to_num(b), torch.nan_to_num(a.detach()))
    ]


def seeded_inputs(reference: dict, seed: int, device) -> list:
    seed_everything(seed)
    return to_device(list(reference["get_inputs"]()), device)


def build_reference_model(reference: dict, device):
    """Init inputs and Model, each drawn right after seeding (KernelBench order of seeding)."""
    seed_everything(SEED)
    init = list(reference["get_init_inputs"]())
    seed_everything(SEED)
    return init, reference["Model"](*init).to(device)


def build_candidate_model(solution: dict, init: list, device):
    seed_everything(SEED)
    return solution["ModelNew"](*init).to(device)


def correctness_trials(spec: dict, reference: dict, model, model_new, device, report: Reporter) -> list[dict]:
    import torch

    seed_everything(SEED)
    seeds = torch.randint(0, 2**32 - 1, (spec["correctness_trials"],)).tolist()
    hardened = spec["mode"] == "hardened"
    trials = []
    for trial_seed in seeds:
        trial: dict = {"seed": trial_seed, "checks": []}
        if hardened:
            trial["checks"].append(run_candidate(model_new, reference, trial_seed, device, "candidate_first", trial))
        with torch.no_grad():
            try:
                ref = model(*seeded_inputs(reference, trial_seed, device))
            except BaseException as err:
                trial["reference_error"] = describe(err)
                trials.append(trial)
                break
        trial["checks"].append(run_candidate(model_new, reference, trial_seed, device, "candidate", trial))
        for check in trial["checks"]:
            if "output" in check:
                check.update(compare(check.pop("output"), ref, spec["atol"], spec["rtol"]))
        trials.append(trial)
        report.update(trials=trials)
        if any(c.get("error") for c in trial["checks"]):
            break
    return trials


def run_candidate(model_new, reference: dict, trial_seed: int, device, name: str, trial: dict) -> dict:
    import torch

    inputs = seeded_inputs(reference, trial_seed, device)
    before = snapshot(inputs)
    check: dict = {"name": name}
    try:
        with torch.no_grad():
            check["output"] = model_new(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except BaseException as err:
        check["error"] = describe(err)
        return check
    changed = mutated_inputs(before, inputs)
    if changed:
        trial.setdefault("mutated_inputs", sorted(set(trial.get("mutated_inputs", [])) | set(changed)))
    return check


def time_model(model, inputs, warmup: int, trials: int, device) -> list[float]:
    import torch

    times = []
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
            for _ in range(trials):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(trials):
                start = time.perf_counter()
                model(*inputs)
                times.append((time.perf_counter() - start) * 1000.0)
    return times


def summary(times: list[float]) -> dict:
    return {"mean_ms": statistics.fmean(times), "median_ms": statistics.median(times), "n": len(times)}


def trials_passed(trials: list[dict], n_expected: int, hardened: bool) -> bool:
    if len(trials) < n_expected or any("reference_error" in t for t in trials):
        return False
    if hardened and any(t.get("mutated_inputs") for t in trials):
        return False
    checks = [c for t in trials for c in t["checks"]]
    keys = ("ok_shape", "ok_dtype", "ok_finite", "allclose")
    return all(not c.get("error") and all(c.get(k, False) for k in keys) for c in checks)


def evaluate_phase(spec: dict, reference: dict, solution: dict, report: Reporter) -> None:
    device, label = pick_device(spec["device"])
    report.update(device=label)
    start = time.perf_counter()
    facts: dict = {"error": None}
    try:
        init, model = build_reference_model(reference, device)
    except BaseException as err:
        report.update(reference_error=f"Model(*init): {describe(err)}")
        return
    try:
        model_new = build_candidate_model(solution, init, device)
    except BaseException as err:
        facts["error"] = f"ModelNew(*init): {describe(err)}"
        report.update(evaluate=facts, eval_s=time.perf_counter() - start)
        return
    trials = correctness_trials(spec, reference, model, model_new, device, report)
    facts["trials"] = trials
    if trials_passed(trials, spec["correctness_trials"], spec["mode"] == "hardened"):
        try:
            inputs = seeded_inputs(reference, SEED, device)
            facts["ref_timing"] = summary(time_model(model, inputs, spec["warmup"], spec["timing_trials"], device))
            inputs = seeded_inputs(reference, SEED, device)
            facts["new_timing"] = summary(time_model(model_new, inputs, spec["warmup"], spec["timing_trials"], device))
        except BaseException as err:
            facts["error"] = f"timing: {describe(err)}"
    report.update(evaluate=facts, eval_s=time.perf_counter() - start)


# ---------------------------------------------------------------- entry point


def load_reference(job_dir: Path, report: Reporter) -> dict | None:
    try:
        namespace = exec_program((job_dir / "reference.py").read_text(), str(job_dir / "reference.py"), "concur_ref")
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in namespace]
        if missing:
            raise NameError(f"reference does not define {', '.join(missing)}")
        return namespace
    except BaseException as err:
        report.update(reference_error=describe(err))
        return None


def main(argv: list[str]) -> int:
    job_dir, phase = Path(argv[1]), argv[2]
    nonce = os.environ.pop(NONCE_ENV, "")
    spec = json.loads((job_dir / "job.json").read_text())
    apply_limits(spec)
    report = Reporter(job_dir, nonce)
    import torch

    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    if phase == "pch":
        build_pch(spec, report)
        return 0
    reference = load_reference(job_dir, report) if phase == "all" else None
    if phase == "all" and reference is None:
        report.update(complete=True)
        return 0
    solution = compile_phase(spec, job_dir, report)
    if phase == "all" and solution is not None and "ModelNew" in solution:
        evaluate_phase(spec, reference, solution, report)
    report.update(complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit/destructors must not change the outcome


if __name__ == "__main__":
    sys.exit(main(sys.argv))

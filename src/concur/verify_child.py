"""What runs inside the isolated verifier process: build the candidate, then check and time it against the reference.

Forked by the fork server `python verify_child.py serve` (torch imported once, CUDA never) at `concur.verify`'s
request, with the run's nonce in the environment; `python verify_child.py <job_dir> <phase>` runs one job directly.
It reads `job.json`, `reference.py` and `solution.py` from `job_dir` and writes `result.json` (after each phase, so
a crash later still leaves the earlier facts). It reports raw facts only; the parent decides the verdict.
Phases: `pch` (build the shared precompiled header), `compile` (exec the solution module, which runs load_inline),
`all` (compile, then evaluate: correctness trials, timing, profiler pass), `probe` (do trivial outputs pass the
task's check?). Self-contained: stdlib and torch only.
"""

from __future__ import annotations

import contextlib
import functools
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
GPU_LOCK_ENV = "CONCUR_GPU_LOCK"
WARMUP_MIN_S = 0.2  # hardened: warm up at least this long, so the GPU's clocks have settled before timing
SEED = 42
PAD_MS = (0.02, 1.0)  # hardened CUDA timing: bounds of the GPU spin queued before each timed call (see launch_pad)
MAX_TRIALS_FACTOR = 100  # hardened: at most this many times timing_trials while filling timing_min_s
PCH_CFLAGS = ["-O3"]  # flags of the shared precompiled header; gcc ignores it for builds with incompatible flags
LOCK_NAME = "extension.h.concur-lock"
PCH_DIR_ENV = "CONCUR_PCH_DIR"  # set when builds go through concur.pch_cxx (clang and its shared PCH)

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
        # a backstop only: the parent's watchdog enforces the limit on resident memory of the whole process group;
        # address space runs ahead of it (torch alone maps ~0.6 GB), hence twice the limit
        as_bytes = 2 * int(limit_mb) * 1024 * 1024
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
        self.built = 0  # builds this process ran (0 when every module came from the cache)
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
            if inline and self.device == "cpu" and not kwargs.get("cuda_sources") and not os.environ.get(PCH_DIR_ENV):
                kwargs.setdefault("use_pch", True)  # torch's gcc PCH; with clang, concur.pch_cxx brings its own
            try:
                module = load_cached(args, kwargs) if inline else None
                if module is None:
                    module = original(*args, **kwargs)
                    self.built += 1
                    mark_built(args, kwargs)
                return counting(module)
            except BaseException as err:
                if self.error is None:
                    self.error = first_error_line(str(err))
                raise

        return recorded


KERNEL_CALLS = [0]  # calls into functions of the candidate's extensions (hardened check: its kernel did run)
COUNTED_MODULES = [0]  # extension modules whose calls are counted


def counting(module):
    """The extension module with each exported function counting its calls into KERNEL_CALLS.

    Modules that register torch ops instead of exporting functions are returned as they are (their calls go
    through torch.ops and cannot be counted here; the profiler pass still sees their kernels on CUDA).
    """
    import types

    functions = {n: f for n, f in vars(module).items() if isinstance(f, types.BuiltinFunctionType) and n[:2] != "__"}
    if not isinstance(module, types.ModuleType) or not functions:
        return module
    proxy = types.ModuleType(module.__name__)
    proxy.__dict__.update(vars(module))
    for name, function in functions.items():
        setattr(proxy, name, _counted(function))
    COUNTED_MODULES[0] += 1
    return proxy


def _counted(function):
    def call(*args, **kwargs):
        KERNEL_CALLS[0] += 1
        return function(*args, **kwargs)

    call.__name__ = call.__qualname__ = function.__name__
    call.__doc__ = function.__doc__
    return call


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


def compile_phase(spec: dict, source: str, job_dir: Path, report: Reporter) -> dict | None:
    recorder = BuildRecorder(spec["device"])
    recorder.install()
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
    facts["built"] = recorder.built
    facts["counted_modules"] = COUNTED_MODULES[0]
    facts["build_error"] = recorder.error
    facts["has_model_new"] = bool(namespace) and "ModelNew" in namespace
    report.update(compile=facts)
    return namespace if facts["ok"] else None


# ---------------------------------------------------------------- integrity: what the candidate must leave alone


def guarded_functions() -> dict:
    """The functions the checks and the timer rely on, captured before the candidate's code runs."""
    import torch

    guarded = {
        "time.perf_counter": (time, "perf_counter"),
        "torch.allclose": (torch, "allclose"),
        "torch.equal": (torch, "equal"),
        "torch.isfinite": (torch, "isfinite"),
        "torch.randint": (torch, "randint"),
        "torch.randn": (torch, "randn"),
        "torch.rand": (torch, "rand"),
        "torch.Tensor.clone": (torch.Tensor, "clone"),
        "torch.Tensor.to": (torch.Tensor, "to"),
        "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
    }
    this = sys.modules[__name__]
    for name, value in vars(this).items():
        if callable(value) and getattr(value, "__module__", None) == __name__:
            guarded[f"verify_child.{name}"] = (this, name)
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in guarded.items()}


def tampered(guarded: dict) -> list[str]:
    return sorted(name for name, (owner, attr, original) in guarded.items() if getattr(owner, attr, None) is not original)


# ---------------------------------------------------------------- phase 2: evaluate (correctness, then timing)


def pick_device(name: str):
    import torch

    if name == "cuda":
        return torch.device("cuda"), f"cuda:{torch.cuda.get_device_name(0)}"
    return torch.device("cpu"), "cpu"


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def to_device(values, device):
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def leaves(output) -> list:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in leaves(item)]
    return [output]


def output_leaves(output) -> list:
    """The output's leaves, detached (they stay where they are: comparisons run on the device)."""
    import torch

    return [leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves(output)]


def compare(new, ref_leaves: list, atol: float, rtol: float, strict_finite: bool) -> dict:
    """Raw facts about one candidate output against the reference output's leaves.

    KernelBench semantics: same number of outputs, same shapes, `allclose` (NaN never equals NaN). The dtype must
    match too. `strict_finite` (hardened): any NaN or inf in the candidate's output fails.
    """
    import torch

    new_leaves = leaves(new)
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
        a, b = a.detach().to(b.device, torch.float64), b.detach().to(torch.float64)
        if strict_finite and not bool(torch.isfinite(a).all()):
            facts.update(ok_finite=False, detail=f"output {i}: NaN or inf in the output")
        facts["max_abs_err"] = max(facts["max_abs_err"], max_abs_error(a, b))
        if not torch.allclose(a, b, atol=atol, rtol=rtol):
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


def fresh_copy(values) -> list:
    """A copy of the inputs for one call: the originals stay untouched to detect mutation."""
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


class RngState:
    """The RNG state right after a trial's inputs were drawn, restored before every call on them.

    Each call then sees what KernelBench gives it (seed, draw the inputs, call): a model that draws random numbers
    (dropout in training mode) gets the same numbers in the reference and in the candidate."""

    def __init__(self, device):
        import torch

        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    def restore(self) -> None:
        import torch

        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def mutated_inputs(before: list, after: list) -> list[int]:
    import torch

    return [
        i
        for i, (b, a) in enumerate(zip(before, after))
        if isinstance(b, torch.Tensor) and not torch.equal(torch.nan_to_num(b), torch.nan_to_num(a.detach()))
    ]


def signed(value):
    """A floating input moved to both signs (centred, then negated): tasks that feed only [0, 1) hide sign bugs."""
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1:
        return -(value - value.mean())
    return value


def seeded_inputs(reference: dict, seed: int, device, transform=None) -> list:
    seed_everything(seed)
    values = list(reference["get_inputs"]())
    if transform is not None:
        values = [transform(v) for v in values]
    return to_device(values, device)


def draw_trial_inputs(spec: dict, reference: dict, device) -> list[tuple]:
    """(seed, kind, inputs on the CPU, RNG state after drawing them) per correctness trial: drawing is CPU work,
    done before the child takes its GPU turn."""
    drawn = []
    for seed, kind in trial_plan(spec):
        values = seeded_inputs(reference, seed, "cpu", signed if kind == "signed" else None)
        drawn.append((seed, kind, values, RngState(device)))
    return drawn


def poison_freed_memory(shapes_like: list, device) -> None:
    """Fill the allocator's free blocks of the output's sizes with NaN (or -1), then free them again.

    The caching allocators hand a freed block of the right size to the next allocation of that size, so a candidate
    that returns `torch.empty(...)` without writing it would otherwise read the reference's leftover result.
    """
    import torch

    blocks = []
    for leaf in shapes_like:
        if isinstance(leaf, torch.Tensor):
            for _ in range(2):
                block = torch.empty(leaf.shape, dtype=leaf.dtype, device=device)
                block.fill_(math.nan if block.is_floating_point() or block.is_complex() else -1)
                blocks.append(block)
    synchronize(device)
    del blocks


def build_reference_model(reference: dict, device):
    """Init inputs and Model, each drawn right after seeding (KernelBench order); made on the CPU, then moved."""
    seed_everything(SEED)
    init = list(reference["get_init_inputs"]())
    seed_everything(SEED)
    return init, reference["Model"](*init).to(device)


def build_candidate_model(solution: dict, init: list, device):
    seed_everything(SEED)
    return solution["ModelNew"](*init).to(device)


def trial_plan(spec: dict) -> list[tuple[int, str]]:
    """(seed, kind) per correctness trial: KernelBench's seeded trials, then hardened signed-input trials."""
    import torch

    seed_everything(SEED)
    seeds = torch.randint(0, 2**32 - 1, (spec["correctness_trials"],)).tolist()
    plan = [(s, "random") for s in seeds]
    if spec["mode"] == "hardened":
        plan += [(s, "signed") for s in seeds[: int(spec.get("signed_trials", 0))]]
    return plan


def correctness_trials(spec: dict, drawn: list[tuple], model, model_new, device, report: Reporter) -> list[dict]:
    import torch

    hardened = spec["mode"] == "hardened"
    trials, last_ref = [], []
    for trial_seed, kind, cpu_inputs, rng in drawn:
        inputs = to_device(cpu_inputs, device)
        trial: dict = {"seed": trial_seed, "kind": kind, "checks": []}
        if hardened:
            poison_freed_memory(last_ref, device)
            trial["checks"].append(run_candidate(model_new, inputs, rng, device, "candidate_first", trial))
            if trial["checks"][-1].get("error"):  # a CUDA fault poisons the context: nothing after it is meaningful
                trials.append(trial)
                break
        try:
            rng.restore()
            with torch.no_grad():
                ref = output_leaves(model(*fresh_copy(inputs)))
            synchronize(device)
        except BaseException as err:
            trial["reference_error"] = describe(err)
            trials.append(trial)
            break
        if kind == "signed" and not all(torch.isfinite(r).all() for r in ref if isinstance(r, torch.Tensor)):
            trial.update(skipped="reference output not finite on signed inputs", checks=[])
            trials.append(trial)
            continue
        if hardened:
            poison_freed_memory(ref, device)
        trial["checks"].append(run_candidate(model_new, inputs, rng, device, "candidate", trial))
        for check in trial["checks"]:
            if "output" in check:
                check.update(compare(check.pop("output"), ref, spec["atol"], spec["rtol"], hardened))
        trials.append(trial)
        last_ref = ref
        report.update(trials=trials)
        if any(c.get("error") for c in trial["checks"]):
            break
    return trials


def run_candidate(model_new, inputs: list, rng: RngState, device, name: str, trial: dict) -> dict:
    import torch

    call_inputs = fresh_copy(inputs)
    check: dict = {"name": name}
    calls_before = KERNEL_CALLS[0]
    try:
        rng.restore()
        with torch.no_grad():
            output = model_new(*call_inputs)
        synchronize(device)  # device-wide, before reading: work the candidate left on side streams must finish
        check["output"] = output_leaves(output)
    except BaseException as err:
        check["error"] = describe(err)
        return check
    check["kernel_calls"] = KERNEL_CALLS[0] - calls_before
    changed = mutated_inputs(inputs, call_inputs)
    if changed:
        trial["mutated_inputs"] = sorted(set(trial.get("mutated_inputs", [])) | set(changed))
    return check


def l2_flush_buffer(device):
    """A buffer twice the size of the GPU's L2 cache: writing it evicts whatever the previous trial left there."""
    import torch

    if device.type != "cuda":
        return None
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
    return torch.empty(2 * l2_bytes, dtype=torch.uint8, device=device)


def timed_call(model, inputs, device, flush, pad_cycles: int = 0) -> tuple[float, float | None]:
    """One call's runtime in ms as (stream_ms, device_ms); device_ms is None except in hardened CUDA timing.
    CUDA: events and a sync after the call (KernelBench).

    With `flush` (hardened): the L2 flush and a GPU spin of `pad_cycles` are queued just before the start event and
    not waited for, so the GPU is still busy while the CPU queues the call: the host's launch latency stays out of
    stream_ms, which is the call's own GPU time on the current stream. device_ms ends at an event recorded after a
    device-wide synchronisation, so it also counts work the call left on side streams, plus a host round trip that
    is the same for both models; the parent compares the two (see verify.timing_fields)."""
    import torch

    if device.type != "cuda":
        start_s = time.perf_counter()
        model(*inputs)
        return (time.perf_counter() - start_s) * 1000.0, None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if flush is None:
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), None
    after_sync = torch.cuda.Event(enable_timing=True)
    flush.zero_()
    if pad_cycles:
        torch.cuda._sleep(pad_cycles)
    start.record()
    model(*inputs)
    end.record()
    torch.cuda.synchronize()
    after_sync.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), start.elapsed_time(after_sync)


def time_models(model, model_new, inputs, spec: dict, device) -> tuple[dict, dict]:
    """Per-trial runtimes (ms) of the reference and the candidate, each called on its own copy of the inputs, as
    {"stream": [...], "device": [...]} per model ("device" only for hardened CUDA timing, see `timed_call`).

    kernelbench: warm-ups, then the reference's trials, then the candidate's. hardened: warm-ups until the GPU has
    run for a while (clocks settle), then the trials interleaved (reference and candidate alternate, order flipped
    each trial), so a clock change or a neighbour's load lands on both sides of the ratio, and more trials until each
    side has run `timing_min_s` (short kernels: a 50 us kernel's 100 trials are 5 ms, too few for a stable median)."""
    import torch

    hardened = spec["mode"] == "hardened"
    flush = l2_flush_buffer(device) if hardened else None
    models = [(model, fresh_copy(inputs)), (model_new, fresh_copy(inputs))]
    times: list[dict] = [{"stream": [], "device": []}, {"stream": [], "device": []}]
    with torch.no_grad():
        if not hardened:
            for side, (fn, args) in enumerate(models):
                for _ in range(spec["warmup"]):
                    fn(*args)
                synchronize(device)
                times[side]["stream"] = [timed_call(fn, args, device, None)[0] for _ in range(spec["timing_trials"])]
            return times[0], times[1]
        warm_until = time.perf_counter() + WARMUP_MIN_S
        enqueue_s: list[float] = []
        for done in range(10**6):
            for fn, args in models:
                queued = time.perf_counter()
                fn(*args)
                enqueue_s.append(time.perf_counter() - queued)
            synchronize(device)
            if done + 1 >= spec["warmup"] and time.perf_counter() >= warm_until:
                break
        pad_cycles = launch_pad(device, enqueue_s[len(enqueue_s) // 2 :]) if flush is not None else 0
        budget_ms = 1000.0 * float(spec.get("timing_min_s", 0.0))
        most = spec["timing_trials"] * MAX_TRIALS_FACTOR
        trial = 0
        while trial < spec["timing_trials"] or (min(sum(t["stream"]) for t in times) < budget_ms and trial < most):
            for side in ((0, 1) if trial % 2 == 0 else (1, 0)):
                fn, args = models[side]
                stream_ms, device_ms = timed_call(fn, args, device, flush, pad_cycles)
                times[side]["stream"].append(stream_ms)
                if device_ms is not None:
                    times[side]["device"].append(device_ms)
            trial += 1
    return times[0], times[1]


def launch_pad(device, enqueue_s: list[float]) -> int:
    """GPU clock cycles to spin before each timed call: twice the longest time the host took to queue a call (the
    later warm-ups), within PAD_MS, so the GPU never waits on the CPU inside the timed region. 0 without the spin."""
    import torch

    if not hasattr(torch.cuda, "_sleep") or not enqueue_s:
        return 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_cycles = 1_000_000
    start.record()
    torch.cuda._sleep(probe_cycles)
    end.record()
    torch.cuda.synchronize()
    cycles_per_ms = probe_cycles / max(start.elapsed_time(end), 1e-3)
    pad_ms = min(max(2000.0 * max(enqueue_s), PAD_MS[0]), PAD_MS[1])
    return int(pad_ms * cycles_per_ms)


def summary(times: dict) -> dict:
    stream = times["stream"]
    mean = statistics.fmean(stream)
    spread = statistics.pstdev(stream) / mean if len(stream) > 1 and mean > 0 else 0.0
    facts = {"mean_ms": mean, "median_ms": statistics.median(stream), "cv": spread, "n": len(stream)}
    if device := times.get("device"):
        facts.update(device_mean_ms=statistics.fmean(device), device_median_ms=statistics.median(device))
    return facts


def own_kernel_names(source: str) -> list[str]:
    """Names of the `__global__` functions the solution's own CUDA source defines."""
    source = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
    return sorted(set(re.findall(r"__global__\s+(?:static\s+|inline\s+|__noinline__\s+)*void\s+(\w+)", source)))


def cuda_kernels(fn) -> dict[str, float]:
    """Kernel name -> device time (µs) of the CUDA kernels one call of `fn` launched, from torch's profiler.

    Costs seconds on its first use in a process (CUPTI starts), so it is the fallback of `graph_kernels`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            duration = getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0
            kernels[event.name] = kernels.get(event.name, 0.0) + float(duration)
    return kernels


def graph_kernels(fn, scratch: Path) -> str | None:
    """The kernel nodes of one call of `fn` captured in a CUDA graph, as the graph's debug dump (None when the call
    cannot be captured: host syncs, unsupported calls). Costs milliseconds."""
    import torch

    graph = torch.cuda.CUDAGraph()
    graph.enable_debug_mode()
    try:
        with torch.cuda.graph(graph):
            fn()
        dump = scratch / "forward_graph.dot"
        graph.debug_dump(str(dump))
        return dump.read_text(errors="replace")
    except BaseException:
        return None
    finally:
        torch.cuda.synchronize()


def profile_pass(reference: dict, model_new, device, source: str, scratch: Path) -> dict:
    """Did kernels the solution defines run in its forward? A CUDA graph capture answers in milliseconds; when it
    cannot be captured or shows none of them, torch's profiler (CUPTI) decides."""
    import torch

    own_names = own_kernel_names(source)
    inputs = seeded_inputs(reference, SEED, device)
    with torch.no_grad():
        dump = graph_kernels(lambda: model_new(*fresh_copy(inputs)), scratch)
        if dump is not None and any(name in dump for name in own_names):
            launched = dump.count("KERNEL")
            return {"method": "cuda_graph", "kernels": launched, "own_kernels": [n for n in own_names if n in dump]}
        kernels = cuda_kernels(lambda: model_new(*fresh_copy(inputs)))
    own = {name: t for name, t in kernels.items() if any(n in name for n in own_names)}
    total = sum(kernels.values())
    return {"method": "profiler", "kernels": len(kernels), "own_kernels": sorted(own)[:20],
            "own_time_share": sum(own.values()) / total if total else 0.0}  # fmt: skip


def trials_passed(trials: list[dict], n_expected: int, hardened: bool) -> bool:
    if len([t for t in trials if t.get("kind", "random") == "random"]) < n_expected:
        return False
    if any("reference_error" in t for t in trials) or (hardened and any(t.get("mutated_inputs") for t in trials)):
        return False
    checks = [c for t in trials for c in t["checks"]]
    keys = ("ok_shape", "ok_dtype", "ok_finite", "allclose")
    return all(not c.get("error") and all(c.get(k, False) for k in keys) for c in checks)


class GpuTurn:
    """Exclusive use of this child's GPU for everything that runs on it (a file lock shared by the children of one
    GPU), so no other candidate's work lands in a timed region. Work that only needs the CPU (imports, loading the
    module, starting the profiler) happens outside a turn. Counts the seconds held: the candidate's GPU time."""

    def __init__(self, path: str | None):
        self.path, self.held_s = path, 0.0

    @contextlib.contextmanager
    def __call__(self):
        import fcntl

        with open(self.path or os.devnull, "a") as lock:
            if self.path:
                fcntl.flock(lock, fcntl.LOCK_EX)
            start = time.perf_counter()
            try:
                yield
            finally:
                self.held_s += time.perf_counter() - start


def evaluate_phase(spec: dict, reference: dict, solution: dict, source: str, scratch: Path, find_tampered,
                   report: Reporter) -> None:  # fmt: skip
    device, label = pick_device(spec["device"])
    report.update(device=label)
    start = time.perf_counter()
    facts: dict = {"error": None}
    turn = GpuTurn(os.environ.get(GPU_LOCK_ENV) if device.type == "cuda" else None)
    hardened = spec["mode"] == "hardened"
    drawn = draw_trial_inputs(spec, reference, device)
    timing_inputs = seeded_inputs(reference, SEED, "cpu")
    with turn():
        passed = check_and_time(spec, reference, solution, device, facts, report, drawn, timing_inputs)
    if passed and hardened and device.type == "cuda":
        try:
            cuda_kernels(lambda: None)  # CUPTI starts here: seconds of CPU work, outside the GPU turn
            with turn():
                facts["profile"] = profile_pass(reference, facts.pop("model_new"), device, source, scratch)
        except BaseException as err:
            facts["error"] = f"profiler: {describe(err)}"
    facts.pop("model_new", None)
    facts["tampered"] = find_tampered()
    facts["gpu_s"] = turn.held_s
    report.update(evaluate=facts, eval_s=time.perf_counter() - start)


def check_and_time(spec: dict, reference: dict, solution: dict, device, facts: dict, report: Reporter,
                   drawn: list[tuple], timing_inputs: list) -> bool:  # fmt: skip
    """Correctness trials, then timing of both models; True when the candidate passed and was timed."""
    start = time.perf_counter()
    try:
        init, model = build_reference_model(reference, device)
    except BaseException as err:
        report.update(reference_error=f"Model(*init): {describe(err)}")
        return False
    try:
        model_new = build_candidate_model(solution, init, device)
    except BaseException as err:
        facts["error"] = f"ModelNew(*init): {describe(err)}"
        return False
    stages = facts["stage_s"] = {"setup": time.perf_counter() - start}
    facts["trials"] = correctness_trials(spec, drawn, model, model_new, device, report)
    stages["correctness"] = time.perf_counter() - start - sum(stages.values())
    if not trials_passed(facts["trials"], spec["correctness_trials"], spec["mode"] == "hardened"):
        return False
    try:
        ref_times, new_times = time_models(model, model_new, to_device(timing_inputs, device), spec, device)
        facts["ref_timing"], facts["new_timing"] = summary(ref_times), summary(new_times)
    except BaseException as err:
        facts["error"] = f"timing: {describe(err)}"
        return False
    stages["timing"] = time.perf_counter() - start - sum(stages.values())
    facts["model_new"] = model_new  # for the profiler pass; removed before the facts are written
    return True


# ---------------------------------------------------------------- phase probe: is the task's check degenerate?


def degenerate_outputs(ref_leaves: list, inputs: list) -> dict:
    """Trivial answers a cheat could return without computing anything: zeros, an input, a constant."""
    import torch

    tensors = [r for r in ref_leaves if isinstance(r, torch.Tensor)]
    if len(tensors) != len(ref_leaves) or not tensors:
        return {}
    guesses = {"zeros": [torch.zeros_like(r) for r in tensors]}
    guesses["constant"] = [torch.full_like(r, r.double().mean().item() if r.numel() else 0.0) for r in tensors]
    first = next((i for i in inputs if isinstance(i, torch.Tensor)), None)
    if len(tensors) == 1 and first is not None and first.shape == tensors[0].shape:
        guesses["identity"] = [first.detach().to(tensors[0].device, tensors[0].dtype)]
    return guesses


def probe_phase(spec: dict, reference: dict, report: Reporter) -> None:
    """Would an all-zeros, identity or constant output pass this task's check on every trial?"""
    import torch

    device, label = pick_device(spec["device"])
    _, model = build_reference_model(reference, device)
    passing: dict[str, bool] = {}
    for trial_seed, _ in trial_plan({**spec, "mode": "kernelbench"}):
        inputs = seeded_inputs(reference, trial_seed, device)
        with torch.no_grad():
            ref = output_leaves(model(*fresh_copy(inputs)))
        for kind, guess in degenerate_outputs(ref, inputs).items():
            facts = compare(guess, ref, spec["atol"], spec["rtol"], strict_finite=False)
            ok = all(facts.get(k, False) for k in ("ok_shape", "ok_dtype", "allclose"))
            passing[kind] = passing.get(kind, True) and ok
    report.update(device=label, degenerate=sorted(k for k, ok in passing.items() if ok))


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


def serve() -> int:
    """Fork server: import torch once, then fork one child per request read from stdin (a JSON line each).

    Replies on stdout: {"id", "pid"} when a child starts, {"pid", "exit"} when it ends (exit: the code, or minus the
    signal). CUDA is never touched here, so each child initialises it for itself, on the GPU its request names.
    """
    import select

    import torch  # noqa: F401  (preloaded for the children; nothing that could touch CUDA or CUPTI)
    import torch.utils.cpp_extension  # noqa: F401

    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        if ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the parent is gone
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    run_forked(request)
                _reply({"id": request["id"], "pid": pid})
        _reap_children()


def _allow_cuda_after_fork() -> None:
    """torch marks every fork child of a process that asked about CUDA as unable to use it; this server never
    initialised CUDA (its device queries go through NVML), so its children may."""
    import torch

    if not torch.cuda.is_initialized():
        torch.cuda._is_in_bad_fork = lambda: False


def _reply(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())  # unbuffered: a forked child must not inherit pending output


def _reap_children() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _reply({"pid": pid, "exit": code})


def run_forked(request: dict) -> None:
    """In the forked child: a session of its own, the request's environment and log, then the job."""
    code = 1
    try:
        os.setsid()
        _allow_cuda_after_fork()
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["job_dir"])
        code = main(["verify_child", request["job_dir"], request["phase"]]) or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    job_dir, phase = Path(argv[1]), argv[2]
    nonce = os.environ.pop(NONCE_ENV, "")
    spec = json.loads((job_dir / "job.json").read_text())
    apply_limits(spec)
    report = Reporter(job_dir, nonce)
    before_torch = time.perf_counter()
    import torch

    report.update(torch_import_s=time.perf_counter() - before_torch)
    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    if phase == "pch":
        build_pch(spec, report)
        return 0
    reference = load_reference(job_dir, report) if phase in ("all", "probe") else None
    if phase == "probe" and reference is not None:
        try:
            probe_phase(spec, reference, report)
        except BaseException as err:
            report.update(reference_error=describe(err))
    if phase == "probe" or (phase == "all" and reference is None):
        report.update(complete=True)
        return 0
    # bound before the candidate runs, so replacing the module-level names cannot disable the check
    find_tampered = functools.partial(tampered, guarded_functions())
    source = (job_dir / "solution.py").read_text()  # read before it runs: the solution could rewrite the file
    solution = compile_phase(spec, source, job_dir, report)
    if phase == "all" and solution is not None and "ModelNew" in solution:
        evaluate_phase(spec, reference, solution, source, job_dir, find_tampered, report)
    report.update(complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit/destructors must not change the outcome


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["serve"] else main(sys.argv))

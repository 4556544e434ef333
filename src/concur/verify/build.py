"""Building and loading a candidate's extensions, inside the untrusted child that runs its module.

`ExtensionLoader` wraps torch's `load_inline`/`load` for the candidate's module: every extension goes to the
build-cache entry of this candidate (`TORCH_EXTENSIONS_DIR`, whatever `build_directory` the code asks for); a
module already built there is imported without asking ninja; in a contestant nothing is ever built (builds belong to
the compile step, on CPU nodes). Each exported function counts its calls, so the referee can ask whether forward
called into the extension at all. `build_child` is the compile step's child: it runs the module once, then makes
`ModelNew` on the task's init inputs as a contestant will (on meta tensors), so that what its `__init__` loads is
built too, and reports what the builds did. Facts from here are the candidate's own process speaking: they only
ever cost it a verdict.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import sys
import time
import traceback
import types
from pathlib import Path

from concur.text import describe, one_line, source_lines

BUILT_MARKER = ".concur-built"
MODEL_SEED = 42  # the seed contestants make both models under (concur.verify.reference.SEED)
LIGHT_ENV = "CONCUR_LIGHT_CUDA_HEADERS"  # verify.light_cuda_headers, for the builder child
FULL_HEADER = re.compile(r"^([ \t]*#[ \t]*include[ \t]*)<torch/extension\.h>", re.MULTILINE)


def lighter(sources):
    """CUDA sources with `#include <torch/extension.h>` read as `<torch/types.h>`, line for line; None when they
    do not include it. Kernels and their launchers need ATen, not the C++ frontend and pybind11 that extension.h
    adds: those headers are half of nvcc's work (cicc, cudafe++ and the host compiler each parse them)."""
    items = [sources] if isinstance(sources, str) else list(sources or [])
    light = [FULL_HEADER.sub(r"\1<torch/types.h>", s) if isinstance(s, str) else s for s in items]
    if light == items:
        return None
    return light[0] if isinstance(sources, str) else light


def first_error_line(message: str) -> str:
    """The first compiler `error:` line of a build log (file path shortened), else its first non-empty line."""
    # gcc quotes names with typographic quotes under a UTF-8 locale: report the same line whatever the locale
    message = str(message).translate({0x2018: "'", 0x2019: "'"})
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for line in lines:
        if "error:" in line:
            return one_line(re.sub(r"^\S*/(?=[^/\s]+(:\d+|\(\d+\)))", "", line))  # gcc file:line, nvcc file(line)
    return one_line(lines[0]) if lines else "build failed"


def exec_program(source: str, filename: str, module_name: str) -> dict:
    """Run a program as a fresh module and return its namespace (registered in sys.modules for pickling). Its lines
    are in linecache under `filename`, so code that reads its own source finds it (TorchScript's @torch.jit.script,
    inspect.getsource) whether or not a file of that name holds it."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    linecache.cache[filename] = (len(source), None, source_lines(source, keepends=True), filename)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module.__dict__


class ExtensionCallBlocked(RuntimeError):
    """An extension's function called while the compile step makes ModelNew: nothing native runs there."""


class ExtensionLoader:
    """Replaces cpp_extension.load_inline/load for one candidate's module (see the module docstring).

    `on_build(building)`: told before (True) and after (False) each build. `blockable` (the compile step's): calls
    go through a Python wrapper, and while `blocked` is set, calling an exported function raises ExtensionCallBlocked
    instead (the compile step's ModelNew holds meta tensors, whose data pointers are null). Otherwise (contestants)
    calls are counted natively (`_counted`), at no cost a timed call could show."""

    def __init__(self, root: str, allow_build: bool, blockable: bool = False):
        self.root, self.allow_build, self.blockable = Path(root), allow_build, blockable
        self.calls = self.built = self.counted_modules = self.wrapped_calls = 0
        self.counters: list = []  # each natively counted function's cache_info, bound when it was made
        self.error: str | None = None
        self.loaded: dict[str, object] = {}
        self.on_build = None
        self.blocked: str | None = None

    @property
    def kernel_calls(self) -> int:
        """Calls into the loaded extensions' exported functions so far."""
        return self.wrapped_calls + sum(info().misses for info in self.counters)

    def install(self) -> None:
        from torch.utils import cpp_extension

        # the shared PCHs are concur.verify.pch_cxx's, made beforehand by trusted builds: a candidate's `use_pch`
        # must neither write torch's own beside torch's headers nor delete one found there
        cpp_extension._check_and_build_extension_h_precompiler_headers = lambda *a, **k: None
        cpp_extension.remove_extension_h_precompiler_headers = lambda: None
        cpp_extension.load_inline = self._wrap(cpp_extension.load_inline, inline=True)
        cpp_extension.load = self._wrap(cpp_extension.load, inline=False)

    def _wrap(self, original, inline: bool):
        def loader(*args, **kwargs):
            self.calls += 1
            name = kwargs.get("name", args[0] if args else None)
            try:
                if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise ValueError(f"extension name {name!r} is not an identifier")
                if name in self.loaded:
                    return self.loaded[name]
                folder = self.root / name
                kwargs["build_directory"] = str(folder)
                module = _import_built(folder, name, kwargs.get("is_python_module", True))
                if module is None:
                    if not self.allow_build:
                        raise RuntimeError(f"extension {name} was not built in the compile step")
                    folder.mkdir(parents=True, exist_ok=True)
                    call = inspect.signature(original).bind(*args, **kwargs).arguments
                    if self.on_build is not None:
                        self.on_build(True)
                    try:
                        module = self._build(original, dict(call), name, inline)
                        self.built += 1
                        (folder / BUILT_MARKER).write_text("ok\n")
                    except BaseException as err:
                        self.error = self.error or first_error_line(str(err))
                        raise
                    finally:  # the notice after a build carries its outcome
                        if self.on_build is not None:
                            self.on_build(False)
                self.loaded[name] = module = self._counting(module)
                return module
            except BaseException as err:
                if self.error is None:
                    self.error = first_error_line(str(err))
                raise

        return loader

    @staticmethod
    def _build(original, call: dict, name: str, inline: bool):
        """Build with light CUDA headers first (verify.light_cuda_headers); what does not build or load that way
        is built again exactly as written, so the fallback only costs time and the source's own errors are what
        a failed build reports."""
        light = lighter(call.get("cuda_sources")) if inline and os.environ.get(LIGHT_ENV) else None
        if light is not None:
            try:
                return original(**{**call, "cuda_sources": light})
            except Exception as err:
                from torch.utils import cpp_extension

                print(f"concur: light-header build failed, building as written: {first_error_line(str(err))}")
                cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)  # else torch renames it name_v1
        return original(**call)

    def _counting(self, module):
        """The module with each exported function counting its calls (ops registered with torch are left alone)."""
        functions = {
            n: f for n, f in vars(module).items() if isinstance(f, types.BuiltinFunctionType) and n[:2] != "__"
        }
        if not isinstance(module, types.ModuleType) or not functions:
            return module
        proxy = types.ModuleType(module.__name__)
        proxy.__dict__.update(vars(module))
        for name, function in functions.items():
            setattr(proxy, name, self._counted(function))
        self.counted_modules += 1
        return proxy

    def _counted(self, function):
        """`function` counting its calls. In a contestant, natively: functools' uncached LRU wrapper (maxsize 0) calls
        it from C and counts each call as a miss, where a Python wrapper would add a frame (most of a microsecond on
        the machines measured) to every call of the candidate and none of the reference's. Either is made a
        staticmethod, which calls as the function does and, like the extension's own functions, is not bound to an
        instance when a class holds it."""
        if not self.blockable:
            native = functools.lru_cache(maxsize=0)(function)
            self.counters.append(native.cache_info)  # bound now: an attribute set on the wrapper later changes nothing
            return staticmethod(native)

        def call(*args, **kwargs):
            if self.blocked is not None:
                raise ExtensionCallBlocked(f"{function.__name__}: {self.blocked}")
            self.wrapped_calls += 1
            return function(*args, **kwargs)

        call.__name__ = call.__qualname__ = function.__name__
        call.__doc__ = function.__doc__
        return staticmethod(call)


def _import_built(folder: Path, name: str, is_python_module: bool):
    """The module this cache entry already holds, imported without asking ninja (the entry's key covers the code
    and the build environment; ninja could still decide to rebuild when a shared PCH changed)."""
    from torch.utils import cpp_extension

    if not (folder / BUILT_MARKER).exists() or not (folder / f"{name}.so").exists():
        return None
    return cpp_extension._import_module_from_library(name, str(folder), is_python_module)


def build_child(channel, spec: dict, sandbox: str) -> int:
    """The compile step's child: run the candidate's module once (load_inline builds its extension into the cache
    entry), then make ModelNew on the task's init inputs (`make_model`), so that what its __init__ (or a helper it
    calls) loads is built too; report what happened.

    The task's reference runs first, before any candidate code, for its init inputs (seed 42, as the referee draws
    them). While ModelNew is made, the facts so far go to the parent as a notice before each build and after it
    (`notice: init`, `building`): if __init__ then crashes, hangs or runs out of memory outside a build, the
    parent keeps what was built (an __init__ that fails is the verify step's to report)."""
    import torch

    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    start = time.perf_counter()
    facts: dict = {"ok": False, "error": None, "syntax_error": False, "sandbox": sandbox, "made": False}
    init, init_error = None, None
    if spec.get("reference"):
        try:
            reference = exec_program(Path(spec["reference"]).read_text(), "reference.py", "concur_build_reference")
            torch.manual_seed(MODEL_SEED)
            init = list(reference["get_init_inputs"]())
        except BaseException as err:
            init_error = f"reference: {describe(err)}"
    loader = ExtensionLoader(os.environ["TORCH_EXTENSIONS_DIR"], allow_build=True, blockable=True)
    loader.install()
    namespace: dict = {}

    def so_far() -> dict:
        return {
            **facts,
            "seconds": time.perf_counter() - start,
            "load_calls": loader.calls,
            "built": loader.built,
            "build_error": loader.error,
        }

    try:
        namespace = exec_program(Path(spec["program"]).read_text(), spec["program"], "concur_solution")
        facts.update(ok=True, has_model_new="ModelNew" in namespace)
    except SyntaxError as err:
        facts.update(syntax_error=True, error=one_line(f"SyntaxError: {err.msg} (line {err.lineno})"))
    except BaseException as err:  # SystemExit included: the candidate must not end the run
        facts["error"] = describe(err)
        traceback.print_exc()
    model_new = namespace.get("ModelNew") if facts["ok"] and loader.error is None else None
    if model_new is not None and init is None and not spec.get("reference") and "get_init_inputs" in namespace:
        try:  # no task given (a frame compiled without its tasks): the candidate's own init inputs, if it has them
            torch.manual_seed(MODEL_SEED)
            init = list(namespace["get_init_inputs"]())
        except BaseException as err:
            init_error = f"get_init_inputs: {describe(err)}"
    if model_new is not None and init is not None:
        facts["made"] = True
        channel.send({**so_far(), "notice": "init", "building": False})
        loader.on_build = lambda building: channel.send({**so_far(), "notice": "init", "building": building})
        init_error = make_model(model_new, init, loader)
        loader.on_build = None
    facts["init_error"] = init_error
    channel.send(so_far())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a candidate's atexit hooks and destructors must not run


def make_model(cls, init: list, loader: ExtensionLoader) -> str | None:
    """`cls(*init)` as a contestant makes it (seeded, without autograd), for the extensions its __init__ loads; its
    error, or None. Made on meta tensors: no memory for weights, whatever the model's size; a device named anywhere
    (`device="cuda"`, `.cuda()`, `.to(...)`) is read as meta, since this child has no GPU. An __init__ that fails
    there for another reason than a failed build or an extension call (it reads a tensor's values, say) is made
    once more on the CPU, under the child's memory limit. The extension's own functions are never run here."""
    import torch

    if not loader.blockable:
        raise ValueError("make_model needs a blockable ExtensionLoader: its extensions must not run on meta tensors")
    loader.blocked = "extensions are not run in the compile step"
    error = None
    try:
        for device in ("meta", "cpu"):
            try:
                with torch.no_grad(), torch.device(device), on_device(device):
                    torch.manual_seed(MODEL_SEED)
                    cls(*init)
                return None
            except BaseException as err:  # SystemExit included
                traceback.print_exc()
                error = f"ModelNew(*init): {describe(err)}"
                if isinstance(err, ExtensionCallBlocked) or loader.error is not None:
                    return error
    finally:
        loader.blocked = None
    return error


def on_device(device: str):
    """A torch function mode that puts every tensor made or moved on `device`: a `device=` argument, `.cuda()`,
    `.cpu()` and `.to(...)` alike (factory calls without a device get it from torch.device(device))."""
    import torch
    from torch.overrides import TorchFunctionMode

    target = torch.device(device)
    moves = (torch.Tensor.cuda, torch.Tensor.cpu)

    class OnDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in moves and args:
                return args[0].to(target)
            if func is torch.Tensor.to and args:
                dtype = kwargs.get("dtype")
                for arg in args[1:]:
                    if isinstance(arg, torch.dtype):
                        dtype = arg
                    elif isinstance(arg, torch.Tensor):
                        dtype = arg.dtype
                return torch.Tensor.to(args[0], device=target, dtype=dtype)
            if kwargs.get("device") is not None:
                kwargs["device"] = target
            return func(*args, **kwargs)

    return OnDevice()

"""The compile step's side of builds: the content-addressed cache, sandboxed builder children, and what a build
left behind (status, seconds, the names of the CUDA kernels it compiled).

A builder runs the candidate's module (load_inline builds as it is called) and then makes its ModelNew on the task's
init inputs (what __init__ loads is built too), so it is a sandboxed child of the builders' zygote: it may write
only its own cache entry and scratch folder. Everything shared that builds read
(concur.verify.pch_cxx's precompiled headers, for clang and gcc alike) is made beforehand by trusted children, never
by a candidate's build.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from concur.verify import procs
from concur.verify.build import LIGHT_ENV

BUILD_ENV_KEYS = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME")
PCH_TIMEOUT_S = 900.0
REAL_CXX_ENV, PCH_DIR_ENV = "CONCUR_REAL_CXX", "CONCUR_PCH_DIR"


def build_env(settings: dict) -> dict[str, str]:
    """The environment variables that change a build, as the builders will see them."""
    env = {k: os.environ.get(k, "") for k in BUILD_ENV_KEYS}
    env["CXX"] = f"concur.pch_cxx:{real_compiler(settings)}"  # the key names the front and the compiler
    if settings["device"] == "cuda":
        env["TORCH_CUDA_ARCH_LIST"] = str(settings["cuda_arch"])
        env[LIGHT_ENV] = "1" if settings.get("light_cuda_headers") else ""
    else:  # nothing of CUDA reaches a CPU build: a stray value must not make every CPU build miss the cache
        env = {k: v for k, v in env.items() if k not in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME")}
    return env


def real_compiler(settings: dict) -> str:
    """The C++ compiler behind concur.verify.pch_cxx: clang++, or for gcc the user's CXX, else c++."""
    name = "clang++" if settings.get("host_compiler") == "clang" else os.environ.get("CXX") or "c++"
    return shutil.which(name) or name


def cache_key(solution: str, settings: dict, reference: str = "") -> str:
    """sha256 of everything that changes the built extension: code, torch/python versions, build env, device kind,
    and the task's reference program where one is given (ModelNew's __init__ is run on its init inputs, and may
    build other sources for other inputs)."""
    import torch

    parts = [
        solution,
        torch.__version__,
        sys.version,
        json.dumps(build_env(settings), sort_keys=True),
        settings["device"],
    ]
    if reference:
        parts.append(reference)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def builder_env(settings: dict, entry: Path, scratch: Path, threads: int) -> dict[str, str]:
    from concur.verify.runner import PASSED_ENV

    env = {k: os.environ[k] for k in PASSED_ENV + BUILD_ENV_KEYS if os.environ.get(k)}
    env.update({k: v for k, v in build_env(settings).items() if v and k != "CXX"})
    tmp = scratch / "tmp"
    env.update(
        TORCH_EXTENSIONS_DIR=str(entry),
        MAX_JOBS=str(threads),
        OMP_NUM_THREADS=str(threads),
        HOME=str(tmp),
        TMPDIR=str(tmp),
        PYTHONDONTWRITEBYTECODE="1",
        CUDA_VISIBLE_DEVICES="",
    )
    pch_dir = entry.parent / "pch"
    env.update({"CXX": str(pch_front(pch_dir)), PCH_DIR_ENV: str(pch_dir), REAL_CXX_ENV: real_compiler(settings)})
    return env


def pch_front(pch_dir: Path) -> Path:
    """An executable that runs concur.verify.pch_cxx with this interpreter: torch's builds take CXX as one command."""
    shim = pch_dir / "concur-c++"
    text = f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).with_name("pch_cxx.py")}" "$@"\n'
    if not shim.is_file() or shim.read_text() != text:
        pch_dir.mkdir(parents=True, exist_ok=True)
        partial = pch_dir / f".concur-c++.{os.getpid()}.{threading.get_ident()}"
        partial.write_text(text)
        partial.chmod(0o755)
        os.replace(partial, shim)
    return shim


def build(
    zygote: procs.Zygote,
    solution: str,
    settings: dict,
    cache_root: Path,
    scratch: Path,
    threads: int,
    trusted: bool = False,
    reference: str = "",
) -> dict:
    """Run one program in a builder child; returns its build row (docs/data.md §4a) and the kernels it compiled.
    `reference`: the task's program, whose init inputs ModelNew is made on (build.build_child)."""
    key = cache_key(solution, settings, reference)
    entry = cache_root / key
    entry.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir(exist_ok=True)
    (scratch / "solution.py").write_text(solution)
    if reference:
        (scratch / "reference.py").write_text(reference)
    box = (
        None
        if trusted
        else {
            "write": [str(entry), str(scratch)],
            "read": [str(cache_root / "pch")],  # its own entry and the shared PCHs: never another candidate's
            "hidden": [str(cache_root), str(scratch.parent)],
            "devices": [],
        }
    )
    spec = {
        "role": "trusted" if trusted else "builder",
        "cwd": str(scratch),
        "program": str(scratch / "solution.py"),
        "reference": str(scratch / "reference.py") if reference else None,
        "env": builder_env(settings, entry, scratch, threads),
        "log": str(scratch / "build.log"),
        "threads": threads,
        "sandbox": box,
    }
    with open(cache_root / f"{key}.lock", "a") as lock:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per entry at a time, across threads and jobs
        for baton in entry.glob("*/lock"):  # torch's FileBaton of a killed build would make the next wait forever
            baton.unlink(missing_ok=True)
        pid, channel = zygote.spawn(spec)
        try:
            facts = await_facts(channel, zygote, pid, settings)
        except procs.Stopped as err:
            return stopped_row(err, settings, key)
        finally:
            zygote.end(pid)
            channel.close()
    row = classify(facts, key)
    row["kernels"] = (
        json.dumps(kernel_names(entry)) if settings["device"] == "cuda" and row["status"] in ("built", "cached") else ""
    )
    return row


def await_facts(channel, zygote: procs.Zygote, pid: int, settings: dict) -> dict:
    """The builder's facts, within the candidate's `timeout_s` and limits. While it makes ModelNew it sends what it
    has built so far (notices, build.build_child): stopped then outside a build (a crash, a hang or memory in
    __init__), the row is decided on the last notice, with what stopped it; stopped in a build, or before any
    notice, it raises procs.Stopped as before."""
    deadline = time.monotonic() + float(settings["timeout_s"])
    told: dict | None = None
    while True:
        try:
            reply = procs.await_reply(
                channel,
                zygote,
                pid,
                max(0.0, deadline - time.monotonic()),
                int(settings["memory_limit_mb"]) * 1024,
                int(settings["max_processes"]),
            )
        except procs.Stopped as err:
            if told is None or told.get("building"):
                raise
            what = f"timeout after {settings['timeout_s']:g} s" if err.kind == "timeout" else err.detail
            return {**told, "init_error": f"ModelNew(*init): {what}"}
        if not isinstance(reply, dict):
            reply = {"error": "the builder sent something other than its facts"}
        if reply.get("notice") != "init":
            return reply
        told = reply


def row(status: str, reason: str, key: str, seconds: float) -> dict:
    return {"status": status, "reason": reason, "cache_key": key, "compile_s": seconds, "kernels": ""}


def stopped_row(err: procs.Stopped, settings: dict, key: str) -> dict:
    if err.kind == "timeout":
        return row("timeout", f"timeout after {settings['timeout_s']:g} s during compile", key, 0.0)
    if err.kind == "crash":
        return row("runtime_error", f"crashed during compile: {err.detail}", key, 0.0)
    return row("runtime_error", f"killed during compile: {err.detail}", key, 0.0)


def classify(facts: dict, key: str) -> dict:
    from concur.text import one_line

    seconds = float(facts.get("seconds") or 0.0)
    if facts.get("build_error") or facts.get("syntax_error"):
        return row("compile_error", one_line(facts.get("build_error") or facts["error"]), key, seconds)
    init_error = facts.get("init_error")
    if not facts.get("load_calls"):
        if facts.get("made"):
            reason = f" ({one_line(init_error)})" if init_error else ""
        else:
            reason = f" at import (ModelNew not made{': ' + one_line(init_error) if init_error else ''})"
        return row("no_build", f"no load_inline/load call{reason}", key, seconds)
    if facts.get("error"):
        reason = f"import: {one_line(facts['error'])}"
    else:
        reason = f"init: {one_line(init_error)}" if init_error else ""
    return row("built" if facts.get("built") else "cached", reason, key, seconds)


# ---------------------------------------------------------------- kernel names


def _cuda_tool(name: str) -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found = shutil.which(name) or str(Path(home) / "bin" / name)
    return found if Path(found).is_file() else None


def kernel_names(entry: Path) -> list[str] | None:
    """Demangled names of the `__global__` kernels compiled into the entry's extensions (cuobjdump), as the
    profiler reports them; None without cuobjdump."""
    tool = _cuda_tool("cuobjdump")
    if tool is None:
        return None
    mangled: set[str] = set()
    for library in sorted(entry.glob("*/*.so")):
        proc = subprocess.run([tool, "-symbols", str(library)], capture_output=True, text=True)
        mangled |= {line.split()[-1] for line in proc.stdout.splitlines() if "STO_ENTRY" in line}
    return demangle(sorted(mangled))


def demangle(names: list[str]) -> list[str]:
    if not names or not shutil.which("c++filt"):
        return names
    proc = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    return sorted(set(lines)) if proc.returncode == 0 and len(lines) == len(names) else names


def library_kernels(cache_root: Path) -> set[str]:
    """Names of the kernels torch's own CUDA library defines: a candidate's kernel of the same name is not its own.
    Read once per torch version (cuobjdump, a few seconds) and kept in the cache."""
    import torch

    path = cache_root / f"library-kernels-{torch.__version__}.json"
    if path.exists():
        return set(json.loads(path.read_text()))
    library = Path(torch.__file__).resolve().parent / "lib" / "libtorch_cuda.so"
    tool = _cuda_tool("cuobjdump")
    if tool is None or not library.exists():
        return set()
    proc = subprocess.run([tool, "-symbols", str(library)], capture_output=True, text=True)
    names = demangle(sorted({line.split()[-1] for line in proc.stdout.splitlines() if "STO_ENTRY" in line}))
    partial = path.with_suffix(f".{os.getpid()}")
    partial.write_text(json.dumps(names))
    os.replace(partial, path)
    return set(names)


# ---------------------------------------------------------------- shared precompiled headers (trusted)


def flag_sets(solutions: list[str]) -> set[tuple[tuple[str, ...], bool]]:
    """(extra_cflags, with CUDA) of every load_inline call whose flags are literals, read without running code:
    the flag sets for which a shared PCH is worth making beforehand."""
    found = set()
    for source in solutions:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and re.search(r"load_inline$", ast.unparse(node.func)):
                words = {k.arg: k.value for k in node.keywords}
                try:
                    flags = tuple(ast.literal_eval(words["extra_cflags"])) if "extra_cflags" in words else ()
                except ValueError:
                    continue
                found.add((tuple(str(f) for f in flags), "cuda_sources" in words))
    return found


WARM_PROGRAM = """from torch.utils.cpp_extension import load_inline
load_inline(name={name!r}, cpp_sources="int concur_warm() {{ return 0; }}"{cuda}, functions=["concur_warm"],
            extra_cflags={flags!r})
"""


# flags a candidate may pass to the trusted PCH build: optimisation, language, defines, warnings, code generation.
# Anything else (-wrapper, -fplugin, -B, -specs, -Xclang, -Wp,..., @file, include paths) could run or read what the
# candidate chose with the trusted child's rights, and write every flag set's shared PCH: those units go without one.
SAFE_FLAG = re.compile(
    r"-(O[0-3sgz]?|g[0-3]?|w|W[A-Za-z0-9=-]*|std=[\w+]+|[DU][A-Za-z_]\w*(=[\w.+-]*)?|m[\w=.-]+|pthread)"
)
SAFE_F_FLAG = re.compile(r"-f(no-)?[a-z0-9][a-z0-9-]*(=[\w.-]+)?")


def safe_flag(flag: str) -> bool:
    if flag.startswith(("-fplugin", "-fdump", "-fprofile", "-fauto-profile", "-fcallgraph-info")):
        return False
    return bool(SAFE_FLAG.fullmatch(flag) or SAFE_F_FLAG.fullmatch(flag))


def warm_programs(solutions: list[str], settings: dict) -> list[str]:
    """Tiny programs whose builds (by a trusted child) make the shared PCH of each literal flag set of safe flags."""
    programs = []
    for flags, cuda in sorted(flag_sets(solutions)):
        if (cuda and settings["device"] != "cuda") or not all(safe_flag(f) for f in flags):
            continue
        cuda_arg = ', cuda_sources="__global__ void concur_warm_k() {}"' if cuda else ""
        programs.append(
            WARM_PROGRAM.format(
                name=f"concur_warm_{hashlib.sha256(repr((flags, cuda)).encode()).hexdigest()[:12]}",
                cuda=cuda_arg,
                flags=list(flags),
            )
        )
    return programs

"""A C++ compiler front for extension builds: a shared precompiled header of torch/extension.h, for clang or gcc.

Every load_inline translation unit starts with `#include <torch/extension.h>`, and parsing those headers is most of
its cost (~20 CPU-seconds with gcc). concur.verify points CXX at this front (through a small shell shim) for its
build children. Ninja calls it for every compile and link of an extension: a compile of one C++ source that starts
by including the header gets a PCH built from the same flags (the compiler accepts a PCH only when optimisation
level, defines and language options match), once per flag set and compiler, under a lock, in CONCUR_PCH_DIR;
everything else is passed to the real compiler (CONCUR_REAL_CXX) untouched.

- clang: the header is precompiled with `-fpch-instantiate-templates` (the templates the headers use are
  instantiated once, inside the PCH) and the unit gets `-include-pch <pch>`.
- gcc finds a PCH only through an include: a stub `extension.h` that includes the header is precompiled into
  `extension.h.gch` beside it, and the unit gets `-include <stub>`. gcc reads the stub itself when it rejects the PCH,
  and torch/extension.h's `#pragma once` makes the unit's own include of it a no-op either way.

When a PCH cannot be built or loaded, the unit is compiled as it is: the front only changes speed, never a verdict.

Stdlib only: it runs in a fresh interpreter for every compiler call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REAL_CXX_ENV = "CONCUR_REAL_CXX"
PCH_DIR_ENV = "CONCUR_PCH_DIR"
HEADER = Path("torch", "extension.h")
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++")
DROPPED = {"-c", "-MMD", "-MD"}  # compile-only switches: not part of what the PCH must agree with
DROPPED_WITH_VALUE = {"-o", "-MF", "-MT", "-MQ"}
# what a compiler says of a PCH it cannot read (an internal error too: the unit is then compiled again without one)
UNUSABLE_PCH = re.compile(
    r"\bPCH\b|precompiled (header|file)|AST file|-include-pch|internal compiler error", re.IGNORECASE
)
# comments and blank space, then the include: forcing the header in first changes nothing only for such a unit
STARTS_WITH_HEADER = re.compile(r'(?:\s|//[^\n]*|/\*.*?\*/)*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"]', re.DOTALL)


def compile_parts(args: list[str]) -> tuple[list[str], str] | None:
    """(flags, source) of a command that compiles one C++ source into an object; None for anything else."""
    if "-c" not in args or "-x" in args:
        return None
    sources = [a for a in args if not a.startswith("-") and a.endswith(SOURCE_SUFFIXES)]
    if len(sources) != 1:
        return None
    flags, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in DROPPED_WITH_VALUE:
            skip = True
        elif arg not in DROPPED and arg != sources[0]:
            flags.append(arg)
    return flags, sources[0]


def include_dirs(flags: list[str]) -> list[Path]:
    """Directories searched for headers, from -I/-isystem in both spellings (`-Idir`, `-I dir`)."""
    dirs, pending = [], False
    for arg in flags:
        if pending:
            dirs.append(Path(arg))
            pending = False
        elif arg in ("-I", "-isystem"):
            pending = True
        elif arg.startswith("-isystem"):
            dirs.append(Path(arg[len("-isystem") :]))
        elif arg.startswith("-I"):
            dirs.append(Path(arg[2:]))
    return dirs


def starts_with_header(source: str) -> bool:
    try:
        with open(source, errors="replace") as file:
            return STARTS_WITH_HEADER.match(file.read(1 << 16)) is not None
    except OSError:
        return False


def is_clang(compiler: str) -> bool:
    """Asked of the compiler itself: `c++` or a user's CXX may be either."""
    try:
        return "clang" in subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return False


def torch_header(flags: list[str]) -> Path | None:
    for folder in include_dirs(flags):
        if (folder / HEADER).is_file():
            return folder / HEADER
    return None


def pch_key(compiler: str, flags: list[str], header: Path) -> str:
    """Changes with the compiler binary, the flags (minus the extension's name) and the header."""
    binary = Path(shutil.which(compiler) or compiler).resolve()
    stamp = [str(binary), binary.stat().st_mtime_ns if binary.exists() else 0, str(header), header.stat().st_mtime_ns]
    kept = [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return hashlib.sha256(json.dumps([stamp, kept]).encode()).hexdigest()[:24]


def shared_pch(compiler: str, flags: list[str], pch_dir: Path, clang: bool) -> Path | None:
    """The PCH for these flags, built on first use (other builds wait on its lock); None when it cannot be built."""
    header = torch_header(flags)
    if header is None:
        return None
    folder = pch_dir / pch_key(compiler, flags, header)
    pch, failed = folder / ("extension.pch" if clang else "extension.h.gch"), folder / "FAILED"
    if pch.is_file():
        return pch
    try:  # a sandboxed candidate build may only read the shared PCHs: without one of its flags, it goes without
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not pch.is_file() and not failed.is_file():
                build_pch(compiler, flags, header, pch, failed, clang)
    except OSError:
        return None
    return pch if pch.is_file() else None


def build_pch(compiler: str, flags: list[str], header: Path, pch: Path, failed: Path, clang: bool) -> None:
    kept = [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    partial = pch.with_name(f".{pch.name}.{os.getpid()}")
    if clang:
        cmd = [compiler, *kept, "-fpch-instantiate-templates", "-x", "c++-header", str(header), "-o", str(partial)]
    else:  # the stub is found through the unit's own include paths, as the header is
        stub = pch.with_suffix("")
        stub.write_text(f"#include <{HEADER.as_posix()}>\n")
        cmd = [compiler, *kept, "-x", "c++-header", str(stub), "-o", str(partial)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        os.replace(partial, pch)
    else:  # remembered, so the other units do not each try again; they compile without a PCH
        partial.unlink(missing_ok=True)
        failed.write_text(" ".join(cmd) + "\n\n" + proc.stderr[-4000:])


def main(argv: list[str]) -> int:
    compiler = os.environ.get(REAL_CXX_ENV) or "c++"
    parts = compile_parts(argv)
    pch_dir = os.environ.get(PCH_DIR_ENV)
    if not (parts and pch_dir and starts_with_header(parts[1])):
        os.execvp(compiler, [compiler, *argv])
    clang = is_clang(compiler)
    pch = shared_pch(compiler, parts[0], Path(pch_dir), clang)
    if pch is None:
        os.execvp(compiler, [compiler, *argv])
    use = ["-include-pch", str(pch)] if clang else ["-include", str(pch.with_suffix(""))]
    proc = subprocess.run([compiler, *argv, *use], capture_output=True, text=True)
    if proc.returncode != 0 and UNUSABLE_PCH.search(proc.stderr):
        os.execvp(compiler, [compiler, *argv])  # a PCH the compiler cannot read: compile the unit as it is
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

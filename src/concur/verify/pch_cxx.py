"""A C++ compiler front for extension builds: clang++ with a shared precompiled header of torch/extension.h.

Every load_inline translation unit starts with `#include <torch/extension.h>`. With gcc, even through torch's own
precompiled header, that costs ~15 CPU-seconds per extension, because gcc instantiates the templates the headers use
again at the end of every unit. clang's `-fpch-instantiate-templates` does that work once, inside the header, and a
unit that includes it compiles in a few seconds.

concur.verify points CXX at this front (through a small shell shim) for its build children. Ninja calls it for every
compile and link of an extension: a compile of one C++ source gets `-include-pch <pch>`, where the PCH was built from
the same flags (so clang accepts it: optimisation level, defines and language options must match), once per flag set,
under a lock, in CONCUR_PCH_DIR; everything else is passed to the real compiler untouched. When a PCH cannot be built
or loaded, the unit is compiled without one: the front only changes speed, never a verdict.

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
UNUSABLE_PCH = re.compile(r"PCH file|precompiled (header|file)|AST file|-include-pch", re.IGNORECASE)


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


def shared_pch(compiler: str, flags: list[str], pch_dir: Path) -> Path | None:
    """The PCH for these flags, built on first use (other builds wait on its lock); None when it cannot be built."""
    header = torch_header(flags)
    if header is None:
        return None
    folder = pch_dir / pch_key(compiler, flags, header)
    pch, failed = folder / "extension.pch", folder / "FAILED"
    if pch.is_file():
        return pch
    try:  # a sandboxed candidate build may only read the shared PCHs: without one of its flags, it goes without
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not pch.is_file() and not failed.is_file():
                build_pch(compiler, flags, header, pch, failed)
    except OSError:
        return None
    return pch if pch.is_file() else None


def build_pch(compiler: str, flags: list[str], header: Path, pch: Path, failed: Path) -> None:
    kept = [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    partial = pch.with_name(f".{pch.name}.{os.getpid()}")
    cmd = [compiler, *kept, "-fpch-instantiate-templates", "-x", "c++-header", str(header), "-o", str(partial)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        os.replace(partial, pch)
    else:  # remembered, so the other units do not each try again; they compile without a PCH
        partial.unlink(missing_ok=True)
        failed.write_text(" ".join(cmd) + "\n\n" + proc.stderr[-4000:])


def main(argv: list[str]) -> int:
    compiler = os.environ.get(REAL_CXX_ENV) or "clang++"
    parts = compile_parts(argv)
    pch_dir = os.environ.get(PCH_DIR_ENV)
    pch = shared_pch(compiler, parts[0], Path(pch_dir)) if parts and pch_dir else None
    if pch is None:
        os.execvp(compiler, [compiler, *argv])
    proc = subprocess.run([compiler, *argv, "-include-pch", str(pch)], capture_output=True, text=True)
    if proc.returncode != 0 and UNUSABLE_PCH.search(proc.stderr):
        os.execvp(compiler, [compiler, *argv])  # a PCH clang refuses: compile the unit as it is
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

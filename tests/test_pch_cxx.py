"""concur.verify.pch_cxx: which commands get the shared PCH, one PCH per flag set, a plain compile when unusable.

The real torch header takes ~25 s to precompile, so the compile tests use a small stand-in `torch/extension.h`
(templates included); a clang build through the verifier is covered by tests/test_verify.py.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from concur.verify import normalize_settings, pch_cxx
from concur.verify.compiling import cache_key as build_cache_key
from concur.verify.settings import resolve_host_compiler

NINJA_COMPILE = ["-MMD", "-MF", "main.o.d", "-DTORCH_EXTENSION_NAME=ext_7", "-DTORCH_API_INCLUDE_EXTENSION_H",
                 "-isystem", "/opt/torch/include", "-I/opt/extra", "-fPIC", "-std=c++20", "-O3",
                 "-c", "/b/main.cpp", "-o", "main.o"]  # fmt: skip
HEADER = """#pragma once
#include <vector>
template <typename T> T total(const std::vector<T>& v) { T s{}; for (auto x : v) s += x; return s; }
inline int shared_total() { return total(std::vector<int>{1, 2, 3}); }
"""
SOURCE = """#include <torch/extension.h>
int ext_entry() { return shared_total() + total(std::vector<int>{4}); }
"""
needs_clang = pytest.mark.skipif(shutil.which("clang++") is None, reason="clang++ is not installed")


def test_compile_parts_keeps_the_flags_that_must_match_the_pch():
    flags, source = pch_cxx.compile_parts(NINJA_COMPILE)
    assert source == "/b/main.cpp"
    assert flags == ["-DTORCH_EXTENSION_NAME=ext_7", "-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem",
                     "/opt/torch/include", "-I/opt/extra", "-fPIC", "-std=c++20", "-O3"]  # fmt: skip


@pytest.mark.parametrize("argv", [
    ["main.o", "-shared", "-ltorch", "-o", "ext.so"],  # link
    ["-v"],  # torch asks the compiler who it is
    ["-x", "c++-header", "h.h", "-c", "-o", "h.pch"],
    ["-c", "a.cpp", "b.cpp"],
])  # fmt: skip
def test_other_commands_pass_through(argv):
    assert pch_cxx.compile_parts(argv) is None


def test_include_dirs_in_both_spellings():
    flags = ["-isystem", "/a", "-isystem/b", "-I", "/c", "-I/d", "-O3"]
    assert pch_cxx.include_dirs(flags) == [Path("/a"), Path("/b"), Path("/c"), Path("/d")]


def fake_torch(tmp_path: Path) -> Path:
    include = tmp_path / "include"
    (include / "torch").mkdir(parents=True)
    (include / "torch" / "extension.h").write_text(HEADER)
    return include


def compile_with_front(tmp_path: Path, include: Path, name: str, extra: list[str], env_pch: Path, preexec=None):
    source = tmp_path / f"{name}.cpp"
    source.write_text(SOURCE)
    argv = [f"-DTORCH_EXTENSION_NAME={name}", "-isystem", str(include), "-fPIC", "-std=c++17", *extra,
            "-c", str(source), "-o", str(tmp_path / f"{name}.o")]  # fmt: skip
    env = {**os.environ, pch_cxx.PCH_DIR_ENV: str(env_pch), pch_cxx.REAL_CXX_ENV: "clang++"}
    return subprocess.run(
        [sys.executable, pch_cxx.__file__, *argv], env=env, capture_output=True, text=True, preexec_fn=preexec
    )


@needs_clang
def test_one_pch_per_flag_set_shared_by_units(tmp_path):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    for name in ("ext_a", "ext_b"):  # differ only in the extension name: one PCH
        proc = compile_with_front(tmp_path, include, name, ["-O2"], pch_dir)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / f"{name}.o").stat().st_size > 0
    assert len(list(pch_dir.glob("*/extension.pch"))) == 1
    proc = compile_with_front(tmp_path, include, "ext_c", ["-O0"], pch_dir)  # other flags: a PCH of their own
    assert proc.returncode == 0, proc.stderr
    assert len(list(pch_dir.glob("*/extension.pch"))) == 2


@needs_clang
def test_unusable_pch_falls_back_to_a_plain_compile(tmp_path):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    assert compile_with_front(tmp_path, include, "ext_a", ["-O2"], pch_dir).returncode == 0
    (pch := next(pch_dir.glob("*/extension.pch"))).write_bytes(b"not a precompiled header")
    proc = compile_with_front(tmp_path, include, "ext_b", ["-O2"], pch_dir)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ext_b.o").stat().st_size > 0 and pch.read_bytes() == b"not a precompiled header"


@needs_clang
def test_a_build_that_may_not_write_the_shared_folder_compiles_without_a_pch(tmp_path):
    """A sandboxed candidate build reads the shared PCHs but cannot add one: it compiles the unit as it is."""
    from concur.verify import sandbox

    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    pch_dir.mkdir()
    if sandbox.landlock_abi() < 1:
        pytest.skip("needs Landlock (the sandbox of a candidate's build)")
    confine = lambda: sandbox.confine([str(tmp_path / "out")], [], [], devices=False)  # noqa: E731
    (tmp_path / "out").mkdir()
    proc = compile_with_front(tmp_path / "out", include, "ext_a", ["-O2"], pch_dir, preexec=confine)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "ext_a.o").stat().st_size > 0 and not list(pch_dir.iterdir())


@needs_clang
def test_a_header_that_cannot_be_precompiled_is_tried_once(tmp_path):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    (include / "torch" / "extension.h").write_text(HEADER + "#error no PCH for you\n")
    for name in ("ext_a", "ext_b"):
        proc = compile_with_front(tmp_path, include, name, ["-O2"], pch_dir)
        assert proc.returncode != 0 and "no PCH for you" in proc.stderr  # the unit's own error, as without a PCH
    assert [p.name for p in pch_dir.glob("*/*") if p.name != "lock"] == ["FAILED"]


def test_host_compiler_choice_and_cache_key(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/clang++" if name == "clang++" else None)
    assert resolve_host_compiler("auto") == "clang"
    monkeypatch.setenv("CXX", "g++-12")  # a compiler the user chose wins over auto
    assert resolve_host_compiler("auto") == "gcc"
    with pytest.raises(ValueError, match="host_compiler must be auto, clang or gcc"):
        resolve_host_compiler("icc")
    monkeypatch.delenv("CXX")
    clang = normalize_settings({"device": "cpu", "host_compiler": "clang"})
    gcc = normalize_settings({"device": "cpu", "host_compiler": "gcc"})
    assert build_cache_key("code", clang) != build_cache_key("code", gcc)  # builds of one compiler never reused

"""concur.verify.pch_cxx: which commands get the shared PCH, one PCH per flag set, a plain compile when unusable,
with clang and with gcc.

The real torch header takes ~30 s to precompile, so most compile tests use a small stand-in `torch/extension.h`
(templates included); one real gcc build of a load_inline extension checks the PCH with torch's own header, and the
verifier's builds go through the front in tests/test_verify.py.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from concur.verify import compiling, normalize_settings, pch_cxx
from concur.verify.build import first_error_line
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
needs_gcc = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
COMPILERS = [pytest.param("clang++", marks=needs_clang), pytest.param("g++", marks=needs_gcc)]


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


def compile_with_front(
    tmp_path: Path, include: Path, name: str, extra: list[str], env_pch: Path, cxx: str, preexec=None, source=SOURCE
):
    (unit := tmp_path / f"{name}.cpp").write_text(source)
    argv = [f"-DTORCH_EXTENSION_NAME={name}", "-isystem", str(include), "-fPIC", "-std=c++17", *extra,
            "-c", str(unit), "-o", str(tmp_path / f"{name}.o")]  # fmt: skip
    env = {**os.environ, pch_cxx.PCH_DIR_ENV: str(env_pch), pch_cxx.REAL_CXX_ENV: cxx}
    return subprocess.run(
        [sys.executable, pch_cxx.__file__, *argv], env=env, capture_output=True, text=True, preexec_fn=preexec
    )


def pchs(pch_dir: Path) -> list[Path]:
    return sorted([*pch_dir.glob("*/extension.pch"), *pch_dir.glob("*/extension.h.gch")])


@pytest.mark.parametrize("cxx", COMPILERS)
def test_one_pch_per_flag_set_shared_by_units(tmp_path, cxx):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    for name in ("ext_a", "ext_b"):  # differ only in the extension name: one PCH
        proc = compile_with_front(tmp_path, include, name, ["-O2"], pch_dir, cxx)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / f"{name}.o").stat().st_size > 0
    assert len(pchs(pch_dir)) == 1
    proc = compile_with_front(tmp_path, include, "ext_c", ["-O0"], pch_dir, cxx)  # other flags: a PCH of their own
    assert proc.returncode == 0, proc.stderr
    assert len(pchs(pch_dir)) == 2


@needs_gcc
def test_gcc_uses_the_pch_and_the_units_own_include_costs_nothing(tmp_path):
    """gcc's -H: `! <pch>` for a PCH it loads; a header it enters, the unit's own include of torch/extension.h among
    them, would be listed with dots (the stand-in, like torch's header, has `#pragma once`)."""
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    proc = compile_with_front(tmp_path, include, "ext_a", ["-O2", "-H"], pch_dir, "g++")
    assert proc.returncode == 0, proc.stderr
    assert f"! {pchs(pch_dir)[0]}" in proc.stderr.splitlines()
    assert not [line for line in proc.stderr.splitlines() if line.startswith(".")]


@pytest.mark.parametrize("cxx", COMPILERS)
def test_unusable_pch_falls_back_to_a_plain_compile(tmp_path, cxx):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    assert compile_with_front(tmp_path, include, "ext_a", ["-O2"], pch_dir, cxx).returncode == 0
    pch = pchs(pch_dir)[0]
    valid = pch.read_bytes()
    for broken in (b"not a precompiled header", valid[: len(valid) // 2]):  # gcc skips the first, fails on the other
        pch.write_bytes(broken)
        proc = compile_with_front(tmp_path, include, "ext_b", ["-O2"], pch_dir, cxx)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "ext_b.o").stat().st_size > 0 and pch.read_bytes() == broken


@needs_gcc
def test_gcc_rejects_a_pch_of_other_flags_and_compiles_the_unit_as_it_is(tmp_path):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    assert compile_with_front(tmp_path, include, "ext_a", ["-O2", "-H"], pch_dir, "g++").returncode == 0
    [optimised] = pchs(pch_dir)
    assert compile_with_front(tmp_path, include, "ext_b", ["-O0", "-H"], pch_dir, "g++").returncode == 0
    [plain] = set(pchs(pch_dir)) - {optimised}
    plain.write_bytes(optimised.read_bytes())  # the -O0 flag set now holds the -O2 PCH: __OPTIMIZE__ differs
    proc = compile_with_front(tmp_path, include, "ext_c", ["-O0", "-H"], pch_dir, "g++")
    assert proc.returncode == 0, proc.stderr
    assert f"x {plain}" in proc.stderr.splitlines()  # gcc saw it, refused it and read the stub instead


@needs_gcc
def test_a_compile_error_reads_the_same_through_the_front(tmp_path):
    """Reasons take the first `error:` line: the front must not change it, nor the unit's line numbers."""
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    broken = SOURCE + "\nint broken() { return undeclared_name; }\n"
    with_front = compile_with_front(tmp_path, include, "ext_a", ["-O2"], pch_dir, "g++", source=broken)
    assert pchs(pch_dir), with_front.stderr  # compiled against the PCH
    unit = tmp_path / "ext_b.cpp"
    unit.write_text(broken)
    plain = subprocess.run(
        ["g++", "-isystem", str(include), "-fPIC", "-std=c++17", "-O2", "-c", str(unit), "-o", str(tmp_path / "b.o")],
        capture_output=True,
        text=True,
    )
    assert with_front.returncode != 0 and plain.returncode != 0
    assert first_error_line(with_front.stderr).replace("ext_a", "ext_b") == first_error_line(plain.stderr)
    assert first_error_line(plain.stderr).startswith("ext_b.cpp:4:")


@needs_gcc
def test_a_unit_that_does_not_start_with_the_header_is_compiled_as_it_is(tmp_path):
    """Forcing the header in first would change what the unit's own lines before it mean."""
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    source = "#define TOTAL_PLUS_ONE 1\n" + SOURCE
    assert compile_with_front(tmp_path, include, "ext_a", ["-O2"], pch_dir, "g++", source=source).returncode == 0
    assert not pch_dir.exists()
    commented = "// a comment\n/* and\n another */\n  #  include <torch/extension.h>\n"
    assert pch_cxx.STARTS_WITH_HEADER.match(commented) and not pch_cxx.STARTS_WITH_HEADER.match(source)


@pytest.mark.parametrize("cxx", COMPILERS)
def test_a_build_that_may_not_write_the_shared_folder_compiles_without_a_pch(tmp_path, cxx, monkeypatch):
    """A sandboxed candidate build reads the shared PCHs but cannot add one: it compiles the unit as it is."""
    from concur.verify import sandbox

    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    pch_dir.mkdir()
    if sandbox.landlock_abi() < 1:
        pytest.skip("needs Landlock (the sandbox of a candidate's build)")
    confine = lambda: sandbox.confine([str(tmp_path / "out")], [], [], devices=[])  # noqa: E731
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "out"))  # as a build's scratch folder: the compiler writes there
    proc = compile_with_front(tmp_path / "out", include, "ext_a", ["-O2"], pch_dir, cxx, preexec=confine)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "ext_a.o").stat().st_size > 0 and not list(pch_dir.iterdir())


@pytest.mark.parametrize("cxx", COMPILERS)
def test_a_header_that_cannot_be_precompiled_is_tried_once(tmp_path, cxx):
    include, pch_dir = fake_torch(tmp_path), tmp_path / "pch"
    (include / "torch" / "extension.h").write_text(HEADER + "#error no PCH for you\n")
    for name in ("ext_a", "ext_b"):
        proc = compile_with_front(tmp_path, include, name, ["-O2"], pch_dir, cxx)
        assert proc.returncode != 0 and "no PCH for you" in proc.stderr  # the unit's own error, as without a PCH
    assert [p.name for p in pch_dir.glob("*/*") if p.name not in ("lock", "extension.h")] == ["FAILED"]


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
    assert compiling.build_env(gcc)["CXX"] == "concur.pch_cxx:c++"  # the key names the front, with gcc too
    # CUDA settings reach CUDA builds' keys only: a stray TORCH_CUDA_ARCH_LIST does not make CPU builds miss
    before = build_cache_key("code", gcc)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")
    assert build_cache_key("code", gcc) == before
    cuda = {**gcc, "device": "cuda", "cuda_arch": "9.0"}
    assert build_cache_key("code", cuda) != build_cache_key("code", {**cuda, "cuda_arch": "8.0"})
    assert build_cache_key("code", cuda) != build_cache_key("code", {**cuda, "light_cuda_headers": False})
    program = 'load_inline(name="e", cpp_sources="", functions=[], extra_cflags=["-O3"])'
    assert compiling.warm_programs([program], gcc) == compiling.warm_programs([program], clang) != []


REAL_BUILD = """
import sys
from torch.utils.cpp_extension import load_inline
from concur.verify.build import first_error_line
ok = load_inline(name="front_ok", cpp_sources="int twice(int x) { return 2 * x; }", functions=["twice"],
                 extra_cflags=["-H"], build_directory=sys.argv[1], verbose=True)
print("twice:", ok.twice(21))
try:
    load_inline(name="front_broken", cpp_sources="int twice(int x) {\\n  return undeclared_name;\\n}",
                functions=["twice"], extra_cflags=["-H"], build_directory=sys.argv[2])
except RuntimeError as err:
    print("reason:", first_error_line(str(err)))
"""


@needs_gcc
def test_a_real_gcc_build_uses_the_pch_of_torchs_header(tmp_path):
    """torch/extension.h itself, through load_inline: gcc loads the PCH (`!` in -H's list) and enters no header, the
    extension works, and a compile error names the line of main.cpp it names without the front."""
    pch_dir, ok, broken = tmp_path / "pch", tmp_path / "ok", tmp_path / "broken"
    ok.mkdir()
    broken.mkdir()
    env = {**os.environ, "MAX_JOBS": "2", "CXX": str(compiling.pch_front(pch_dir)),
           pch_cxx.PCH_DIR_ENV: str(pch_dir), pch_cxx.REAL_CXX_ENV: "g++"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", REAL_BUILD, str(ok), str(broken)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [pch] = pchs(pch_dir)
    lines = proc.stdout.splitlines()
    assert f"! {pch}" in lines and "twice: 42" in lines
    assert not [line for line in lines if re.match(r"\.+ .*torch/extension\.h$", line)]
    # main.cpp is `#include <torch/extension.h>`, the cpp_sources, then the bindings: line 3 is their second line
    reason = r"reason: main\.cpp:3:\d+: error: 'undeclared_name' was not declared in this scope"
    assert [line for line in lines if re.fullmatch(reason, line)], proc.stdout[-3000:]


def test_only_safe_literal_flags_reach_the_trusted_pch_build():
    """The shared PCH is built by a trusted child from a candidate's literal flags: flags that make the compiler
    run or load something of the candidate's choosing never get there (that unit just compiles without a PCH)."""
    settings = normalize_settings({"device": "cpu", "host_compiler": "gcc"})

    def warm(flags: list[str]) -> list[str]:
        return compiling.warm_programs([f"load_inline(name='e', cpp_sources='', extra_cflags={flags!r})"], settings)

    assert warm(["-O3", "-std=c++17", "-DNDEBUG", "-ffast-math", "-march=native", "-Wall", "-fopenmp", "-g"])
    for attack in (
        ["-wrapper", "sh,-c,touch /tmp/pwned"],
        ["-fplugin=/tmp/evil.so"],
        ["-B/tmp/evil"],
        ["-specs=/tmp/evil.specs"],
        ["-Xclang", "-load", "-Xclang", "/tmp/evil.so"],
        ["-Wp,-fplugin=/tmp/evil.so"],
        ["@/tmp/evil.rsp"],
        ["-I/tmp/evil"],
        ["-O3", "-fdump-tree-all"],
    ):
        assert warm(attack) == [], attack

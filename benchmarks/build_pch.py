"""CPU-seconds of one small load_inline build (CPU, the host compiler behind c++), three ways: no precompiled header,
torch's own `use_pch`, and concur.verify.pch_cxx's shared PCH; plus what each PCH costs once.

    .venv/bin/python benchmarks/build_pch.py [--flags=-O3] [--repeats 3] [--out DIR]

Every build runs in a fresh interpreter, into a fresh folder; CPU-seconds are those of its children (ninja and the
compiler), the median of --repeats builds (a PCH is built once). torch's PCH is written beside torch's headers, so
that variant works on a copy of them (the installed torch is not touched).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from torch.utils import cpp_extension
name, folder, flags, torch_copy, mode = sys.argv[1:]
if torch_copy:
    cpp_extension._TORCH_PATH = torch_copy  # its include/ is a copy; libraries stay where they are
start = time.perf_counter()
if mode == "torch_pch":
    cpp_extension._check_and_build_extension_h_precompiler_headers(json.loads(flags), None)
else:
    module = cpp_extension.load_inline(
        name=name, cpp_sources="at::Tensor add_one(at::Tensor x) { return x + 1; }", functions=["add_one"],
        extra_cflags=json.loads(flags), build_directory=folder, use_pch=mode == "use_pch")
    import torch
    assert module.add_one(torch.zeros(2)).tolist() == [1.0, 1.0]
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - start}))
"""


def run(name: str, out: Path, flags: list[str], mode: str, env: dict, torch_copy: str = "") -> dict:
    folder = out / name
    folder.mkdir(parents=True)
    args = [sys.executable, "-c", CHILD, name, str(folder), json.dumps(flags), torch_copy, mode]
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def median(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    import torch

    from concur.verify import compiling

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flags", default="-O3", help="extra_cflags, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="builds per variant (medians)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    args = parser.parse_args()
    flags = [f for f in args.flags.split(",") if f]
    out = Path(args.out or tempfile.mkdtemp(prefix="concur-build-pch-")).resolve()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "MAX_JOBS")} | {"MAX_JOBS": "1"}
    compiler = shutil.which("c++")
    torch_copy, pch_dir = out / "torch", out / "pch"
    shutil.copytree(Path(torch.__file__).parent / "include", torch_copy / "include", symlinks=True)
    front = env | {
        "CXX": str(compiling.pch_front(pch_dir)),
        "CONCUR_PCH_DIR": str(pch_dir),
        "CONCUR_REAL_CXX": compiler,
    }
    torch_once = run("torch_pch", out, flags, "torch_pch", env, str(torch_copy))
    front_first = run("ext_front_first", out, flags, "plain", front)  # builds the front's PCH
    runs: dict[str, list[dict]] = {"no PCH": [], "torch use_pch": [], "pch_cxx front": []}
    for i in range(max(1, args.repeats)):  # interleaved, so that a change in the machine's load hits all three
        runs["no PCH"].append(run(f"ext_plain_{i}", out, flags, "plain", env))
        runs["torch use_pch"].append(run(f"ext_torch_{i}", out, flags, "use_pch", env, str(torch_copy)))
        runs["pch_cxx front"].append(run(f"ext_front_{i}", out, flags, "plain", front))
    rows = {label: median(values) for label, values in runs.items()}
    rows["torch use_pch: its PCH, once"] = torch_once
    rows["pch_cxx front: its PCH, once"] = {k: front_first[k] - rows["pch_cxx front"][k] for k in front_first}
    sizes = {p.parent.name: p.stat().st_size for p in pch_dir.glob("*/extension.h.gch")}
    sizes["torch"] = (torch_copy / "include" / "torch" / "extension.h.gch").stat().st_size

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{version}; extra_cflags {flags}; {os.cpu_count()} cores; MAX_JOBS=1; medians of {args.repeats}")
    print(f"{'build':<30} {'CPU-s':>7} {'wall s':>7}")
    for label, row in rows.items():
        print(f"{label:<30} {row['cpu_s']:7.1f} {row['wall_s']:7.1f}")
    print("PCH sizes (MB): " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sizes.items()))
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Where a CUDA extension build's CPU time goes: every compile step of the builds in a build cache, run again.

For each extension in the cache (a folder with torch's build.ninja), the binding unit (main.cpp, the host
compiler) and the .cu file (nvcc, with `--time` for its phases: host and device preprocessing, cudafe++, cicc,
ptxas, fatbinary, the host compiler on cudafe's output) are compiled again in a scratch copy, `--jobs` at a time;
CPU seconds come from each process tree's rusage. `--variant light-header` also compiles each .cu with the other
torch header (`<torch/types.h>` for `<torch/extension.h>`, or back, for a cache of light builds: see
verify.light_cuda_headers) and compares the two objects' device code (cuobjdump -sass).

    python benchmarks/build_phases.py results/bench/kb_side/ours-work/cache --jobs 8
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

INCLUDE = re.compile(r"#\s*include\s*<torch/extension\.h>")


def extensions(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.glob("*/*/build.ninja"))


def compile_commands(folder: Path) -> dict[str, str]:
    """{"main": ..., "cu": ...}: ninja's command lines of the two compile steps."""
    lines = subprocess.run(
        ["ninja", "-C", str(folder), "-t", "commands"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    found = {}
    for line in lines:
        if "nvcc" in line and ".cu" in line:
            found["cu"] = line
        elif " -c " in line and "main.cpp" in line:
            found["main"] = line
    return found


def cpu_run(command: str, cwd: Path) -> tuple[float, int]:
    """CPU seconds (user + system, children included) and exit status of a shell command."""
    proc = subprocess.Popen(command, shell=True, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def swapped(text: str) -> str | None:
    """The .cu with the other header: extension.h read as types.h, or (a build cache of light builds) the
    candidate's types.h include after torch's own first line read as extension.h again."""
    if INCLUDE.search(text):
        return INCLUDE.sub("#include <torch/types.h>", text)
    head, _, rest = text.partition("\n")
    restored = re.sub(r"#\s*include\s*<torch/types\.h>", "#include <torch/extension.h>", rest)
    return None if restored == rest else head + "\n" + restored


def sass(command: str, cwd: Path) -> str | None:
    """The device code of the object a compile command wrote (cuobjdump -sass), without lines naming files."""
    found = re.search(r"-o\s+(\S+)", command)
    if not found or not shutil.which("cuobjdump"):
        return None
    proc = subprocess.run(["cuobjdump", "-sass", found.group(1)], cwd=cwd, capture_output=True, text=True)
    name = Path(found.group(1)).name
    return "\n".join(ln for ln in proc.stdout.splitlines() if name not in ln and "identifier" not in ln)


def nvcc_phases(path: Path) -> dict[str, float]:
    """Seconds per phase from nvcc's --time CSV (one row per tool run; columns name the phase and its time)."""
    phases: dict[str, float] = {}
    if not path.exists():
        return phases
    for row in csv.reader(path.read_text().splitlines()):
        cells = [c.strip() for c in row]
        numbers = [c for c in cells if re.fullmatch(r"\d+(\.\d+)?", c)]
        names = [c for c in cells[1:] if c and not re.fullmatch(r"\d+(\.\d+)?", c) and not c.endswith(".cu")]
        if numbers and names and names[0].lower() not in ("phase name", "metric"):
            phases[names[0]] = phases.get(names[0], 0.0) + float(numbers[-1]) / 1000.0
    return phases


def measure(folder: Path, light: bool) -> dict:
    commands = compile_commands(folder)
    row: dict = {"extension": folder.name}
    with tempfile.TemporaryDirectory(prefix="phases-") as scratch:
        work = Path(scratch) / folder.name
        shutil.copytree(folder, work, ignore=shutil.ignore_patterns("*.o", "*.so", ".ninja*"))
        for step, command in commands.items():
            command = command.replace(str(folder), str(work))
            if step == "cu":
                command += f" --time {work / 'phases.csv'}"
            row[f"{step}_cpu_s"], row[f"{step}_rc"] = cpu_run(command, work)
            if step == "cu":
                row["cu_phases_s"] = nvcc_phases(work / "phases.csv")
                row["cu_time_csv"] = (work / "phases.csv").read_text()[:4000] if (work / "phases.csv").exists() else ""
                if light:
                    source = next(work.glob("*.cu"))
                    other = swapped(source.read_text())
                    if other is not None:
                        first = sass(command, work)
                        source.write_text(other)
                        row["cu_other_cpu_s"], row["cu_other_rc"] = cpu_run(command, work)
                        row["sass_equal"] = first is not None and first == sass(command, work)
                        row["cache_light"] = not INCLUDE.search(other)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cache", type=Path, help="a build cache (build_cache of verify settings)")
    parser.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--limit", type=int, default=16, help="extensions measured, at most")
    parser.add_argument("--variant", choices=["none", "light-header"], default="none")
    parser.add_argument("--out", type=Path, help="write every row as JSON lines here")
    args = parser.parse_args()

    folders = extensions(args.cache)[: args.limit]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda f: measure(f, args.variant == "light-header"), folders))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok = [r for r in rows if r.get("cu_rc") == 0 and r.get("main_rc") == 0]
    print(f"{len(rows)} extensions, {len(ok)} compiled, {args.jobs} at a time; median CPU-seconds:")
    table = [("binding unit (main.cpp)", [r["main_cpu_s"] for r in ok]), (".cu via nvcc", [r["cu_cpu_s"] for r in ok])]
    phase_names = sorted({p for r in ok for p in r.get("cu_phases_s", {})})
    table += [(f"  nvcc: {p}", [r["cu_phases_s"].get(p, 0.0) for r in ok]) for p in phase_names]
    other = [r for r in ok if r.get("cu_other_rc") == 0]
    if other:
        same = sum(bool(r.get("sass_equal")) for r in other)
        label = "extension.h" if other[0]["cache_light"] else "types.h"
        table.append(
            (f".cu with torch/{label} ({len(other)} compiled, {same} same SASS)", [r["cu_other_cpu_s"] for r in other])
        )
    for name, values in table:
        if values:
            print(f"{name:<48}{statistics.median(values):>10.1f}")


if __name__ == "__main__":
    main()

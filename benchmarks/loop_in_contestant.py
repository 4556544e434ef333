"""The plain loop of `small_speedups.py`, timed inside the verifier's own contestant process.

A probe candidate (an honest relu_add variant with the task's own Model beside it, which passes the static screen)
times, on its third call (after the profiled first call, with CUPTI detached), the reference and its kernel called
in turn in a plain loop, CUDA events around each loop, the quickest of LOOPS loops of CALLS calls each, on three
kinds of inputs: a pool of its own inputs larger than twice the L2 (as the plain reading's); the call's own inputs,
views of the arena the referee wrote them into; and copies of those made by the candidate. It reports them on its
fourth call, by raising (the verdict's reason is the one channel out of the sandbox), so its verdict is always
`runtime_error`. A reading within the contestant that agrees with the plain process's rules out the contestant's
process (its sandbox, seccomp filters, cores, CUDA context made after the fork, the profiler before it); the arena
against its copies tells whether inputs living in the arena slow a call.

    python benchmarks/loop_in_contestant.py --variants fast --sizes 256x1024,1024x1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]
READINGS = ("own pool", "arena inputs", "copies of them")
MARK = "INSIDE"

PROBE = r"""

import os


class _Probe(nn.Module):
    def __init__(self, *init):
        super().__init__()
        self.kernel = _Kernel(*init)
        self.eager = _Eager(*init)
        self.calls = 0
        self.found = []

    def _time(self, inputs):
        cuda = inputs[0][0].is_cuda
        for model in (self.eager, self.kernel):
            loop_ms(model, inputs, 64, cuda)
        eager, kernel = [], []
        for _ in range(LOOPS):
            eager.append(1000.0 * loop_ms(self.eager, inputs, CALLS, cuda))
            kernel.append(1000.0 * loop_ms(self.kernel, inputs, CALLS, cuda))
        return [min(eager), min(kernel)]

    def forward(self, *args):
        self.calls += 1
        if self.calls == 3:
            cache = torch.cuda.get_device_properties(0).L2_cache_size if args[0].is_cuda else 32 << 20
            size = sum(a.numel() * a.element_size() for a in args)
            pool = [[torch.randn_like(a) for a in args] for _ in range(max(4, 2 * cache // size + 1))]
            with torch.no_grad():
                self.found = self._time(pool) + self._time([list(args)]) + self._time([[a.clone() for a in args]])
        if self.calls == 4:
            raise RuntimeError("MARK " + " ".join("%.3f" % t for t in self.found))
        return self.kernel(*args)


ModelNew = _Probe
"""


def probe_program(variant: str, size: str, device: str = "cuda", loops: int = 5, calls: int = 1000) -> str:
    """The task's program with its Model renamed, the variant's with its ModelNew renamed, and the probe, which
    times with the plain reading's own loop (small_speedups.loop_ms, its source copied in)."""
    import inspect

    from small_speedups import loop_ms, solution_code, task_code

    task = task_code(size, device).replace("class Model(", "class _Eager(")
    kernel = solution_code(variant, device).replace("class ModelNew(", "class _Kernel(")
    probe = PROBE.replace("LOOPS", str(loops)).replace("CALLS", str(calls)).replace("MARK", MARK)
    return task + "\n" + kernel + probe.replace("class _Probe", inspect.getsource(loop_ms) + "\n\nclass _Probe", 1)


def parse(reason: str) -> dict[str, tuple[float, float]] | None:
    """The probe's readings (µs a call: eager, kernel) from its verdict's reason; None where it did not report."""
    words = reason.split(MARK, 1)[-1].split() if MARK in reason else []
    try:
        values = [float(w) for w in words[: 2 * len(READINGS)]]
    except ValueError:
        return None
    return dict(zip(READINGS, zip(values[::2], values[1::2]))) if len(values) == 2 * len(READINGS) else None


def readings(variants: list[str], sizes: list[str], work: Path, device: str = "cuda", **probe) -> dict:
    """Per candidate ("size:variant"): the probe's readings, or its verdict where it did not report."""
    from small_speedups import verdicts

    program = lambda variant, size: probe_program(variant, size, device, **probe)  # noqa: E731
    table = verdicts(program, variants, sizes, "hardened", work, work / "cache", device)
    return {cid: parse(str(row["reason"])) or f"{row['status']}: {row['reason']}" for cid, row in table.iterrows()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--variants", type=lambda t: t.split(","))
    parser.add_argument("--sizes", type=lambda t: t.split(","), default=["256x1024", "1024x1024"])
    args = parser.parse_args(argv)
    variants = args.variants or (["cpp"] if args.device == "cpu" else ["fast", "fast_vec"])
    found = readings(variants, args.sizes, Path(tempfile.mkdtemp(prefix="concur-inside-")), args.device)
    print("| task | variant | inputs | ref / kernel µs (quickest) | speedup |")
    print("|---|---|---|---:|---:|")
    for cid, reading in found.items():
        size, variant = cid.split(":")
        if isinstance(reading, str):
            print(f"| {size} | {variant} | no reading | {reading} | |")
            continue
        for label, (eager, kernel) in reading.items():
            print(f"| {size} | {variant} | {label} | {eager:.2f} / {kernel:.2f} | {eager / kernel:.2f} |")


if __name__ == "__main__":
    main()

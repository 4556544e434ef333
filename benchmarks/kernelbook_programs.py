"""The tasks stage on KernelBook's own source programs: pytorch-jit-paritybench's modules, as KernelBook rows.

KernelBook's PyTorch programs were cut out of pytorch-jit-paritybench's generated test files (one `nn.Module` and
what it uses, with the file's test case as `get_inputs()` and `get_init_inputs()`). The hub's export cannot be
downloaded where this runs; the paritybench checkout can (`fetch`, never committed). This script rebuilds rows in
KernelBook's format from it, the same way in outline (the module and the top-level definitions it reaches, the
imports it names, its test case's inputs), then runs the tasks stage on them as a `kernelbook` source and prints
what came through and why the rest did not:

    python benchmarks/kernelbook_programs.py --paritybench <checkout>/generated --files 200 --out results/bench/kb_like

`--verify N` then verifies N of the tasks that came through (in task order), each with its own program as the
candidate, on `--device` in `--mode`, and prints the verdicts. In `kernelbench` mode the candidate is `ModelNew =
Model`, the honest solution KernelBench's harness accepts: every one should be correct. In `hardened` mode `ModelNew`
holds the program's module and passes its result through a one-line C++ extension that returns it as it came
(`OWN_KERNEL`), so that it passes the static screen and runs the whole hardened path (signed draws, batched timing on
the arena, every call checked); each should then be rejected only for replacing nothing of the reference, or be
correct where the reference computes nothing the profile counts. Any other verdict is the hardened path failing an
honest program. Its timing, the program against itself, is printed too: it should read about 1.
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import hashlib
import json
import operator
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from concur.text import source_lines  # noqa: E402

HEADER = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
# names paritybench's files import at the top, as KernelBook's programs import them
IMPORTS = {
    "np": "import numpy as np",
    "Tensor": "from torch import Tensor",
    "Module": "from torch.nn import Module",
    "Function": "from torch.autograd import Function",
    "Variable": "from torch.autograd import Variable",
    "Parameter": "from torch.nn import Parameter",
    "init": "from torch.nn import init",
    **{m: f"import {m}" for m in "math numbers itertools functools collections copy random typing string re".split()},
    **{m: f"import {m}" for m in "warnings time abc enum inspect types queue uuid numpy logging".split()},
}
SKIP = {"torch", "nn", "F", "TESTCASES"}
# what the test cases' `_mock_config(key=value, ...)` stands for: a dict whose keys read as attributes too
MOCK_CONFIG = (
    "class _mock_config(dict):\n"
    "    def __getattr__(self, name):\n"
    "        if name in self:\n"
    "            return self[name]\n"
    "        raise AttributeError(name)"
)
# a layer the test cases pass in: paritybench's stand-in is a Linear where both sizes are given, else a ReLU
MOCK_LAYER = (
    "def _mock_layer(in_features=None, out_features=None, *args, **kwargs):\n"
    "    if in_features and out_features:\n"
    "        return nn.Linear(in_features, out_features, **kwargs)\n"
    "    return nn.ReLU()"
)


def definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The file's top-level classes, functions and simple assignments, by name (the last one wins)."""
    found: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if not isinstance(node.value, ast.Name):  # `QANet = _module`: paritybench's module aliases
                found[node.targets[0].id] = node
    return found


def imports_of(tree: ast.Module) -> dict[str, str]:
    """The file's own top-level imports, one statement per name they bind (paritybench's mocks left out)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[(alias.asname or alias.name).split(".")[0]] = ast.unparse(ast.Import(names=[alias]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ("_paritybench_helpers", "unittest"):
                continue
            for alias in node.names:
                if alias.name != "*":
                    statement = ast.ImportFrom(module=node.module, names=[alias], level=0)
                    found[alias.asname or alias.name] = ast.unparse(statement)
    return found


@dataclass
class ParityFile:
    """One generated file, parsed once: its lines (as the parser numbers them), its top-level definitions and its
    imports."""

    lines: list[str]
    defs: dict[str, ast.stmt]
    imports: dict[str, str]

    @classmethod
    def of(cls, source: str, tree: ast.Module) -> ParityFile:
        return cls(source_lines(source), definitions(tree), imports_of(tree))

    def source_of(self, node: ast.stmt) -> str:
        """A definition as the file writes it, its decorators included."""
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(self.lines[start - 1 : node.end_lineno])


def reached(entry: str, defs: dict[str, ast.stmt]) -> tuple[list[str], set[str]]:
    """The definitions `entry` needs (itself included), in the file's order, and the other names it uses."""
    needed, todo, free = set(), [entry], set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for node in ast.walk(defs[name]):
            if isinstance(node, ast.Name) and node.id not in SKIP:
                if node.id in defs:
                    todo.append(node.id)
                else:
                    free.add(node.id)
    order = [name for name in defs if name in needed]
    return order, free


def test_cases(tree: ast.Module) -> list[tuple[str, ast.expr, ast.expr]]:
    """(module name, init lambda body, forward lambda body) of each TESTCASES entry."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "TESTCASES":
            cases = []
            for item in getattr(node.value, "elts", []):
                if isinstance(item, ast.Tuple) and len(item.elts) >= 3 and isinstance(item.elts[0], ast.Name):
                    init, call = item.elts[1], item.elts[2]
                    if isinstance(init, ast.Lambda) and isinstance(call, ast.Lambda):
                        cases.append((item.elts[0].id, init.body, call.body))
            return cases
    return []


def program(file: ParityFile, entry: str, init: ast.expr, call: ast.expr) -> str | None:
    """KernelBook's shape of one test case: imports, the definitions it reaches, get_inputs, get_init_inputs.
    None where the test case passes keyword inputs to forward (KernelBook's get_inputs is positional)."""
    if not (isinstance(call, ast.Tuple) and len(call.elts) == 2 and isinstance(call.elts[1], ast.Dict)):
        return None
    if call.elts[1].keys or not isinstance(init, ast.Tuple) or len(init.elts) != 2:
        return None
    if entry not in file.defs:
        return None
    order, free = reached(entry, file.defs)
    free |= {n.id for n in ast.walk(ast.Tuple(elts=[init, call])) if isinstance(n, ast.Name)} - SKIP - set(order)
    named = {file.imports.get(n) or IMPORTS.get(n) for n in free} - {None} - set(HEADER)
    imports = HEADER + sorted(named)
    stand_ins = [code for name, code in (("_mock_config", MOCK_CONFIG), ("_mock_layer", MOCK_LAYER)) if name in free]
    body = stand_ins + [file.source_of(file.defs[name]) for name in order]
    inputs = ast.unparse(call.elts[0])
    return "\n".join(
        imports
        + ["", ""]
        + [b + "\n\n" for b in body]
        + ["def get_inputs():", f"    return {inputs}", "", "", "def get_init_inputs():"]
        + [f"    return [{ast.unparse(init.elts[0])}, {ast.unparse(init.elts[1])}]", ""]
    )


def rows_of(paritybench: Path, files: int, skip: int = 0) -> tuple[list[dict], collections.Counter]:
    rows, skipped = [], collections.Counter()
    for path in sorted(paritybench.glob("test_*.py"))[skip : skip + files]:
        source = path.read_text(errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            skipped["file does not parse"] += 1
            continue
        repo, parsed = path.stem.removeprefix("test_"), ParityFile.of(source, tree)
        for entry, init, call in test_cases(tree):
            code = program(parsed, entry, init, call)
            if code is None:
                skipped["keyword forward inputs or no definition"] += 1
                continue
            uuid = hashlib.sha256(f"{repo}.{entry}".encode()).hexdigest()[:16]
            rows.append(
                {"uuid": uuid, "entry_point": entry, "python_code": code, "repo_name": repo, "module_name": entry}
            )
    return rows, skipped


def reason_kind(reason: str) -> str:
    """A rejection reason without its particulars: `duplicate`, or the reason and the exception's type."""
    if reason.startswith("duplicate of"):
        return "duplicate of another row"
    return ": ".join(reason.split(": ")[:2])[:90]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--paritybench", required=True, help="the generated/ folder of a pytorch-jit-paritybench checkout"
    )
    parser.add_argument("--files", type=int, default=200, help="N generated files, in order of name")
    parser.add_argument("--skip", type=int, default=0, help="after the first K files")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="results/bench/kernelbook_like")
    parser.add_argument("--verify", type=int, default=0, help="then verify N tasks, each its own candidate")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where --verify runs")
    parser.add_argument("--mode", default="kernelbench", choices=["kernelbench", "hardened"], help="--verify's mode")
    args = parser.parse_args(argv)
    from concur.tasks.stage import build_tasks

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, skipped = rows_of(Path(args.paritybench), args.files, args.skip)
    export = out / "kernelbook_rows.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in rows))
    started = time.perf_counter()
    tables = build_tasks([{"kind": "kernelbook", "path": str(export)}], {"drop_contaminated": False}, args.workers)
    seconds = time.perf_counter() - started
    for name, frame in tables.items():
        frame.to_parquet(out / f"{name}.parquet")
    train, rejected = tables["train"], tables["rejected"]
    files = f"{args.skip + 1}-{args.skip + args.files}"
    print(f"| rows built from files {files} | {len(rows)} (not built: {dict(skipped) or 'none'}) |")
    print("|---|---|")
    print(f"| tasks (train) | {len(train)} |")
    print(f"| degenerate (probed on the CPU) | {int(train['degenerate'].fillna(False).sum())} |")
    print(f"| not run (over the stage's limits) | {len(tables['unchecked'])} |")
    print(f"| rejected | {len(rejected)} |")
    print(f"| stage wall time | {seconds:.0f} s on {args.workers} workers |")
    reasons = collections.Counter(reason_kind(str(r)) for r in rejected["reason"])
    print("\n| rejected because | rows |\n|---|---:|")
    for reason, n in reasons.most_common(12):
        print(f"| {reason} | {n} |")
    if args.verify:
        verify_own(train.head(args.verify), out, args.device, args.mode)


# what each mode should say of a task's own program: (status, the reason's start) pairs
EXPECTED = {
    "kernelbench": [("correct", "")],
    "hardened": [("rejected", "check:replaced_nothing"), ("correct", "")],
}
OWN_KERNEL = """

from torch.utils.cpp_extension import load_inline as _load_inline

_own = _load_inline(name="own_program_passthrough", cpp_sources=[r\"\"\"
py::object passthrough(py::object x) { return x; }
\"\"\"], functions=["passthrough"])


class ModelNew(nn.Module):
    def __init__(self, *init):
        super().__init__()
        self.inner = Model(*init)

    def forward(self, *args):
        return _own.passthrough(self.inner(*args))
"""


def own_candidate(code: str, mode: str) -> str:
    """A task's program as its own candidate in `mode` (see the module's docstring)."""
    return code + ("\n\nModelNew = Model\n" if mode == "kernelbench" else OWN_KERNEL)


def five_numbers(values) -> list[float]:
    """Min, quartiles and max of a pandas Series, to 3 decimals."""
    return values.quantile([0.0, 0.25, 0.5, 0.75, 1.0]).round(3).tolist()


def verify_own(tasks, out: Path, device: str, mode: str = "kernelbench") -> None:
    """Verify each task with its own program as the candidate in `mode`; the verdicts go to out/verdicts.parquet,
    each timing's quickest per-call times and their ratio (whatever the verdict) to out/timed_against_itself.json.
    Each should come back as `EXPECTED[mode]` says (status, reason's start)."""
    import pandas as pd

    sys.path.insert(0, str(ROOT / "tests"))
    from verify_frames import candidates_frame

    from concur.verify import api, compile_frame, timing, verify_frame

    rows = [(f"{t.task_id}:own", t.task_id, own_candidate(t.code, mode)) for t in tasks.itertuples()]
    candidates = candidates_frame(rows)
    settings = {"device": device, "mode": mode, "workers": 1 if device == "cpu" else 4}
    settings["build_cache"] = str(out / "cache")
    started = time.perf_counter()
    builds = compile_frame(candidates, settings, out / "compile", False, tasks=tasks)
    timings: dict = {}  # the times of every candidate timed, whatever its verdict (a rejected row has none)
    api.TRACE_SINK = lambda cid, report: timings.__setitem__(cid, report.timing)
    try:
        verdicts = verify_frame(candidates, tasks, settings, out / "verify", False, builds=builds)
    finally:
        api.TRACE_SINK = None
    seconds = time.perf_counter() - started
    verdicts.to_parquet(out / "verdicts.parquet")
    reasons = verdicts["reason"].fillna("")
    expected = functools.reduce(
        operator.or_, [(verdicts["status"] == st) & reasons.str.startswith(r) for st, r in EXPECTED[mode]]
    )
    correct = expected & verdicts["correct"]
    timed = verdicts.loc[correct, "speedup"].astype(float).dropna()
    flags = collections.Counter(f for row in verdicts["flags"].fillna("") for f in str(row).split(",") if f)
    print(f"\n| own programs verified ({device}, {mode} mode) | {len(verdicts)} in {seconds:.0f} s |\n|---|---|")
    for found, n in verdicts["status"].value_counts().items():
        print(f"| {found} | {n} |")
    named = " or ".join(f"{st}{': ' + r if r else ''}" for st, r in EXPECTED[mode])
    print(f"| as expected ({named}) | {int(expected.sum())} |")
    if len(timed):
        unresolved = int(correct.sum()) - len(timed)
        print(f"| their speedups, min / quartiles / max | {five_numbers(timed)} ({unresolved} unresolved) |")
    own = {cid: (t.ref.best_ms, t.new.best_ms, timing.speedup(t.ref, t.new)) for cid, t in timings.items() if t}
    (out / "timed_against_itself.json").write_text(json.dumps(own, indent=1))
    resolved = pd.Series([x for _, _, x in own.values()], dtype=float).dropna()
    if mode == "hardened" and len(resolved):  # the program against itself: what the clock reads where nothing changed
        spread = five_numbers(resolved)
        print(f"| timed against itself, min / quartiles / max | {spread} ({len(own) - len(resolved)} unresolved) |")
    print(f"| flags | {dict(flags.most_common()) or 'none'} |")
    for row in verdicts[~expected].itertuples():
        print(f"not as expected: {row.task_id}: {row.status}: {str(row.reason)[:160]}")


if __name__ == "__main__":
    main()

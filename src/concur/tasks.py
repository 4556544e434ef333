"""Task sources -> the tasks contract, and the stable shard assignment.

A source turns some collection of PyTorch programs into rows of contracts.TASKS. Only the built-in suite exists so far;
KernelBook, KernelBench and user folders plug into `SOURCES`.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pandas as pd
import yaml

from . import contracts

SPLITS = ("train", "eval")
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskError(ValueError):
    """A task program or manifest is malformed; the message names the file."""


def shard_of(task_id: str, n_shards: int) -> int:
    """Stable shard of a task: depends only on its id, so adding tasks never moves another."""
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % n_shards


def select_shard(tasks: pd.DataFrame, shard: int, n_shards: int) -> pd.DataFrame:
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} is outside 0..{n_shards - 1}")
    keep = tasks["task_id"].map(lambda t: shard_of(t, n_shards) == shard)
    return tasks[keep].reset_index(drop=True)


def count_ops(code: str) -> int:
    """Operator calls and arithmetic in `Model.forward`: calls, binary and unary operators (not `super()` etc.)."""
    forward = _forward_of(ast.parse(code))
    if forward is None:
        return 0
    count = 0
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and not _is_plumbing(node):
            count += 1
        elif isinstance(node, (ast.BinOp, ast.UnaryOp)) and not _is_constant(node):
            count += 1
    return count


def check_program(code: str, where: str) -> None:
    """A task must parse and define Model, get_inputs and get_init_inputs at module level."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise TaskError(f"{where}: not valid Python (line {err.lineno}: {err.msg})") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskError(f"{where}: missing {', '.join(missing)}")


def load_builtin(root: str | Path) -> pd.DataFrame:
    """Our suite: resources/suite/{train,eval}/*.py labelled by resources/suite/suite.yaml."""
    root = Path(root)
    manifest_path = root / "suite.yaml"
    try:
        manifest = yaml.safe_load(manifest_path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise TaskError(f"{manifest_path}: cannot read the suite manifest: {err}") from None
    rows = []
    for split in SPLITS:
        for name, label in (manifest.get(split) or {}).items():
            path = root / split / f"{name}.py"
            if not path.is_file():
                raise TaskError(f"{manifest_path}: task {split}/{name} has no program {path}")
            rows.append(_builtin_row(path, split, name, label, manifest_path))
    unlisted = sorted({p.relative_to(root).as_posix() for s in SPLITS for p in (root / s).glob("*.py")}
                      - {f"{r['split']}/{r['name']}.py" for r in rows})
    if unlisted:
        raise TaskError(f"{manifest_path}: programs not in the manifest: {', '.join(unlisted)}")
    return pd.DataFrame(rows)


def _builtin_row(path: Path, split: str, name: str, label: dict, manifest_path: Path) -> dict:
    code = path.read_text()
    check_program(code, str(path))
    category = (label or {}).get("category")
    if category not in contracts.CATEGORIES:
        raise TaskError(f"{manifest_path}: {split}/{name}: category must be one of {contracts.CATEGORIES}")
    return {
        "task_id": f"builtin/{name}",
        "split": split,
        "suite": "builtin",
        "level": int(label.get("level", 1)),
        "name": name,
        "code": code,
        "category": category,
        "n_ops": count_ops(code),
        "origin": path.as_posix(),
    }


SOURCES = {"builtin": load_builtin}


def build_tasks(sources: list[dict]) -> dict[str, pd.DataFrame]:
    """All configured sources, concatenated, checked for duplicate ids, split into train/eval frames."""
    unknown = [src["kind"] for src in sources if src["kind"] not in SOURCES]
    if unknown:
        raise TaskError(f"task source kind {unknown[0]!r} has no loader in this version (available: {', '.join(SOURCES)})")
    frames = [SOURCES[src["kind"]](src["path"]) for src in sources]
    tasks = pd.concat(frames, ignore_index=True)
    dupes = tasks.loc[tasks["task_id"].duplicated(), "task_id"].tolist()
    if dupes:
        raise TaskError(f"duplicate task ids across sources: {', '.join(dupes[:5])}")
    tasks = tasks.sort_values("task_id", kind="stable")
    return {split: contracts.conform(tasks[tasks["split"] == split], contracts.TASKS, f"tasks/{split}")
            for split in SPLITS}


def run(sources: list[dict], out_paths: dict[str, str]) -> None:
    """The `tasks` stage: write results/tasks/{split}.parquet."""
    from .io import write_parquet

    for split, frame in build_tasks(sources).items():
        write_parquet(frame, out_paths[split])


def _forward_of(tree: ast.Module) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return item
    return None


def _is_plumbing(call: ast.Call) -> bool:
    """Calls that move no data: super(), len(), shape/size queries."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in {"super", "len", "range", "int", "float", "size", "dim", "isinstance"}


def _is_constant(node: ast.AST) -> bool:
    return all(isinstance(n, (ast.Constant, ast.operator, ast.unaryop, ast.BinOp, ast.UnaryOp)) for n in ast.walk(node))

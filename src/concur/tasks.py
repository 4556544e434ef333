"""Task sources -> the tasks contract, and the stable shard assignment.

A source turns a collection of PyTorch programs into rows of contracts.TASKS: the built-in suite, a KernelBook export
(or hub id), a KernelBench checkout or dataset export, or a user's folder. Every program is then checked once: it
must parse, define Model, get_inputs and get_init_inputs, and (with `validate_run`) its reference must run on the CPU
in a forked child with a time and memory limit. Programs that fail go to rejected.csv, never stop the run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import yaml

from . import contracts
from .contamination import code_hash, contamination_report

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
REPORT_COLUMNS = ["task_id", "source", "origin", "reason"]
DEFAULT_SPLIT = {"builtin": None, "kernelbook": "train", "kernelbench": "eval", "folder": "train"}
SUITE_OF_KIND = {"builtin": "builtin", "kernelbook": "kernelbook", "kernelbench": "kernelbench", "folder": "user"}
LEVEL_OF_CATEGORY = {"single_op": 1, "fused": 2, "model": 3}
DEFAULT_SETTINGS = {
    "validate_run": True,
    "validate_timeout_s": 60,
    "max_input_mb": 1024,
    "drop_contaminated": True,
    "similarity_threshold": 0.8,
    "ngram": 8,
}
# The categorisation rule (docs/data.md): more operator calls than this, a loop in forward, a container or
# program-defined submodule, or this many submodule calls make a `model`; one call is `single_op`; else `fused`.
MAX_FUSED_OPS = 24
MIN_MODEL_LAYER_CALLS = 3
CONTAINER_MODULES = {"Sequential", "ModuleList", "ModuleDict"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TABLE_SUFFIXES = (".parquet", ".jsonl", ".json")


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


# ---------------------------------------------------------------- program analysis


def count_ops(code: str) -> int:
    """Operator calls and arithmetic in `Model.forward`: calls, binary and unary operators (not `super()` etc.)."""
    return _count_ops_in(_forward_of(ast.parse(code)))


def categorise(code: str) -> tuple[str, int]:
    """(category, n_ops) of a program, by the rule next to MAX_FUSED_OPS."""
    tree = ast.parse(code)
    model = model_class(tree)
    forward = _method(tree, model, "forward")
    n_ops = _count_ops_in(forward)
    composite = (
        n_ops > MAX_FUSED_OPS
        or _has_loop(forward)
        or _layer_calls(forward) >= MIN_MODEL_LAYER_CALLS
        or _builds_composite_submodule(tree, model)
    )
    if composite:
        return "model", n_ops
    return ("single_op" if n_ops <= 1 else "fused"), n_ops


def model_class(tree: ast.Module) -> ast.ClassDef | None:
    """The class `Model` names: `class Model`, or the class of a top-level `Model = SomeClass`."""
    target = "Model"
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                and any(isinstance(t, ast.Name) and t.id == "Model" for t in node.targets)):
            target = node.value.id
    return _classes(tree).get(target)


def check_program(code: str, where: str) -> None:
    """A task must parse and define Model, get_inputs and get_init_inputs at module level."""
    tree = _parse(code, where)
    missing = [name for name in REQUIRED_NAMES if name not in _top_level_names(tree)]
    if missing:
        raise TaskError(f"{where}: missing {', '.join(missing)}")


def _parse(code: str, where: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as err:
        raise TaskError(f"{where}: not valid Python (line {err.lineno}: {err.msg})") from None


def _top_level_names(tree: ast.Module) -> set[str]:
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _method(tree: ast.Module, cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    """`cls.name`, looked up through base classes defined in the same program."""
    classes, seen = _classes(tree), set()
    todo = [cls] if cls is not None else []
    while todo:
        current = todo.pop(0)
        if current.name in seen:
            continue
        seen.add(current.name)
        for item in current.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
        todo += [classes[b.id] for b in current.bases if isinstance(b, ast.Name) and b.id in classes]
    return None


def _count_ops_in(forward: ast.FunctionDef | None) -> int:
    if forward is None:
        return 0
    count = 0
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and not _is_plumbing(node):
            count += 1
        elif isinstance(node, (ast.BinOp, ast.UnaryOp)) and not _is_constant(node):
            count += 1
    return count


def _has_loop(forward: ast.FunctionDef | None) -> bool:
    return forward is not None and any(isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(forward))


def _layer_calls(forward: ast.FunctionDef | None) -> int:
    """Calls of submodules held on self (`self.conv(x)`)."""
    if forward is None:
        return 0
    return sum(1 for n in ast.walk(forward) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "self")


def _builds_composite_submodule(tree: ast.Module, model: ast.ClassDef | None) -> bool:
    """__init__ builds a container (Sequential, ModuleList, ModuleDict) or an instance of a class of the program."""
    init = _method(tree, model, "__init__")
    if init is None:
        return False
    own = set(_classes(tree)) - {model.name}
    for node in ast.walk(init):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in CONTAINER_MODULES or name in own:
                return True
    return False


# ---------------------------------------------------------------- KernelBook programs -> our Model contract


def adapt_kernelbook(code: str, entry_point: str) -> str:
    """KernelBook's program with `Model` naming its entry-point class and a positional get_init_inputs().

    KernelBook's get_init_inputs() returns [args, kwargs]. Keyword arguments are moved to their positional slots of
    the entry point's __init__ when the signature allows it; otherwise an adapter subclass `Model` binds them.
    """
    tree = _parse(code, "program")
    classes = _classes(tree)
    if entry_point not in classes:
        raise TaskError(f"entry point class {entry_point!r} is not defined")
    if entry_point != "Model" and "Model" in _top_level_names(tree):
        raise TaskError(f"defines its own Model besides the entry point {entry_point!r}")
    init_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_init_inputs"), None)
    if init_fn is None:
        raise TaskError("missing get_init_inputs")
    args, kwargs = _kernelbook_init_return(init_fn)
    positional = _kwargs_as_positional(tree, classes[entry_point], len(args), kwargs)
    if positional is not None:
        new_fn = _init_inputs_source(init_fn, args + positional)
        adapter = "" if entry_point == "Model" else f"\n\nModel = {entry_point}\n"
    elif entry_point == "Model":
        raise TaskError("keyword init arguments of Model have no positional slot and cannot be bound")
    else:
        new_fn = _init_inputs_source(init_fn, args)
        adapter = _binding_adapter(entry_point, kwargs)
    lines = code.splitlines()
    start = min([init_fn.lineno] + [d.lineno for d in init_fn.decorator_list]) - 1
    body = "\n".join(lines[:start] + new_fn.splitlines() + lines[init_fn.end_lineno:]).rstrip("\n")
    return body + "\n" + adapter


def _kernelbook_init_return(init_fn: ast.FunctionDef) -> tuple[list[str], dict[str, str]]:
    """Source of each positional argument and keyword value in `return [[args...], {kwargs...}]`."""
    last = init_fn.body[-1]
    value = last.value if isinstance(last, ast.Return) else None
    shaped = (
        isinstance(value, (ast.List, ast.Tuple)) and len(value.elts) == 2
        and isinstance(value.elts[0], (ast.List, ast.Tuple))
        and not any(isinstance(e, ast.Starred) for e in value.elts[0].elts)
        and isinstance(value.elts[1], ast.Dict)
        and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.elts[1].keys)
    )
    if not shaped:
        raise TaskError("get_init_inputs does not end in `return [[args], {kwargs}]` (the KernelBook format)")
    args = [ast.unparse(e) for e in value.elts[0].elts]
    kwargs = {k.value: ast.unparse(v) for k, v in zip(value.elts[1].keys, value.elts[1].values)}
    return args, kwargs


def _kwargs_as_positional(tree: ast.Module, entry: ast.ClassDef, n_args: int, kwargs: dict[str, str]) -> list[str] | None:
    """Keyword values in positional order after the n_args positional ones, or None when the signature forbids it."""
    if not kwargs:
        return []
    init = _method(tree, entry, "__init__")
    if init is None:
        return None
    spec = init.args
    params = [p.arg for p in spec.posonlyargs + spec.args][1:]
    first_keyword = max(len(spec.posonlyargs) - 1, 0)
    defaults = dict(zip(params[len(params) - len(spec.defaults):], spec.defaults)) if spec.defaults else {}
    slot = {name: i for i, name in enumerate(params) if i >= first_keyword}
    if any(name not in slot or slot[name] < n_args for name in kwargs):
        return None
    values = []
    for name in params[n_args:max(slot[k] for k in kwargs) + 1]:
        if name in kwargs:
            values.append(kwargs[name])
        elif name in defaults and _is_literal(defaults[name]):
            values.append(ast.unparse(defaults[name]))
        else:
            return None
    return values


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _init_inputs_source(init_fn: ast.FunctionDef, values: list[str]) -> str:
    """get_init_inputs() with its original statements and a flat positional return list."""
    lines = ["def get_init_inputs():"]
    lines += ["    " + line for stmt in init_fn.body[:-1] for line in ast.unparse(stmt).splitlines()]
    lines.append(f"    return [{', '.join(values)}]")
    return "\n".join(lines)


def _binding_adapter(entry_point: str, kwargs: dict[str, str]) -> str:
    bound = ", ".join(f"{name!r}: {value}" for name, value in kwargs.items())
    return (
        f"\n\nclass Model({entry_point}):\n"
        f'    """{entry_point} with KernelBook\'s keyword init arguments bound (they have no positional slot)."""\n\n'
        "    def __init__(self, *args, **kwargs):\n"
        f"        super().__init__(*args, **{{**{{{bound}}}, **kwargs}})\n"
    )


# ---------------------------------------------------------------- sources


def _load_builtin_source(source: dict) -> tuple[list[dict], list[dict]]:
    return load_builtin(source["path"]).to_dict("records"), []


def load_kernelbook(source: dict) -> tuple[list[dict], list[dict]]:
    """A KernelBook export (parquet/JSONL file or folder) or hub id; ids are `kernelbook/{uuid}`."""
    path = source["path"]
    table = read_table(path, source.get("revision"))
    _require_columns(table, ["python_code", "entry_point"], path, "a KernelBook export")
    split = source.get("split") or DEFAULT_SPLIT["kernelbook"]
    rows, rejected = [], []
    for record in table.to_dict("records"):
        code, entry_point = str(record["python_code"]), str(record["entry_point"])
        uuid = record.get("uuid")
        uuid = str(uuid) if pd.notna(uuid) and str(uuid) else hashlib.sha256(code.encode()).hexdigest()[:16]
        task_id = f"kernelbook/{uuid}"
        origin = f"{path}#uuid={uuid}" + (f" repo={record['repo_name']}" if record.get("repo_name") else "")
        _add_program(rows, rejected, lambda code=code, entry_point=entry_point: adapt_kernelbook(code, entry_point),
                     task_id=task_id, split=split, suite="kernelbook", name=entry_point, origin=origin, level=None)
    return rows, rejected


def load_kernelbench(source: dict) -> tuple[list[dict], list[dict]]:
    """A KernelBench checkout (`[KernelBench/]level{N}/{id}_{Name}.py`) or its dataset export; ids `kernelbench/L{N}/{id}_{Name}`."""
    path, levels = source["path"], source.get("levels")
    split = source.get("split") or DEFAULT_SPLIT["kernelbench"]
    root = _kernelbench_root(Path(path))
    programs = _kernelbench_files(root, levels) if root else _kernelbench_table(path, source.get("revision"), levels)
    rows, rejected = [], []
    for level, stem, read_code, origin in programs:
        name = stem.split("_", 1)[1] if re.match(r"\d+_.", stem) else stem
        _add_program(rows, rejected, read_code, task_id=f"kernelbench/L{level}/{stem}", split=split,
                     suite="kernelbench", name=name, origin=origin, level=level)
    return rows, rejected


def load_folder(source: dict) -> tuple[list[dict], list[dict]]:
    """A user's folder of .py programs (searched recursively); ids are `user/{relative path without .py}`."""
    root = Path(source["path"])
    if not root.is_dir():
        raise TaskError(f"{root}: the folder task source does not exist or is not a folder")
    split = source.get("split") or DEFAULT_SPLIT["folder"]
    rows, rejected = [], []
    for path in sorted(p for p in root.rglob("*.py") if not _hidden(p.relative_to(root))):
        rel = path.relative_to(root).with_suffix("").as_posix()
        _add_program(rows, rejected, lambda path=path: path.read_text(encoding="utf-8"), task_id=f"user/{rel}",
                     split=split, suite="user", name=path.stem, origin=path.as_posix(), level=None)
    return rows, rejected


SOURCES = {"builtin": _load_builtin_source, "kernelbook": load_kernelbook, "kernelbench": load_kernelbench,
           "folder": load_folder}


def _add_program(rows: list, rejected: list, read_code, *, task_id, split, suite, name, origin, level) -> None:
    """Append the task made from `read_code()` to rows, or its reason to rejected; untrusted input never raises."""
    try:
        code = read_code()
        check_program(code, "program")
        category, n_ops = categorise(code)
    except Exception as err:  # any malformed program is a rejection, never a crash
        rejected.append({"task_id": task_id, "source": suite, "origin": origin, "reason": _one_line(err)})
        return
    rows.append({"task_id": task_id, "split": split, "suite": suite, "level": level or LEVEL_OF_CATEGORY[category],
                 "name": name, "code": code, "category": category, "n_ops": n_ops, "origin": origin})


def _kernelbench_root(path: Path) -> Path | None:
    """The folder holding level1/, level2/ … (a checkout's KernelBench/ subfolder or the path itself)."""
    for candidate in (path / "KernelBench", path):
        if candidate.is_dir() and any(candidate.glob("level[0-9]*")):
            return candidate
    return None


def _kernelbench_files(root: Path, levels: list[int] | None):
    found = sorted(int(d.name[5:]) for d in root.glob("level[0-9]*") if d.is_dir() and d.name[5:].isdigit())
    for level in levels or found:
        folder = root / f"level{level}"
        if not folder.is_dir():
            raise TaskError(f"{root}: KernelBench level {level} has no folder {folder.name}/")
        for path in sorted(folder.glob("*.py"), key=lambda p: (_leading_int(p.stem), p.stem)):
            yield level, path.stem, lambda path=path: path.read_text(encoding="utf-8"), path.as_posix()


def _kernelbench_table(path: str, revision: str | None, levels: list[int] | None):
    table = read_table(path, revision)
    _require_columns(table, ["code", "level", "name", "problem_id"], path, "a KernelBench dataset export")
    for record in table.to_dict("records"):
        level, problem_id = int(record["level"]), int(record["problem_id"])
        if levels and level not in levels:
            continue
        stem = str(record["name"]).removesuffix(".py")
        stem = stem if stem.startswith(f"{problem_id}_") else f"{problem_id}_{stem}"
        yield level, stem, lambda code=str(record["code"]): code, f"{path}#level{level}/{stem}"


def read_table(path: str, revision: str | None = None) -> pd.DataFrame:
    """A parquet/JSONL/JSON file, a folder of them, or (when no such local path exists) a Hugging Face hub dataset."""
    local = Path(path)
    if local.is_dir():
        files = sorted(p for p in local.iterdir() if p.suffix in TABLE_SUFFIXES)
        if not files:
            raise TaskError(f"{path}: no .parquet, .jsonl or .json files in this folder")
        return pd.concat([_read_table_file(f) for f in files], ignore_index=True)
    if local.is_file():
        return _read_table_file(local)
    if HUB_ID.fullmatch(path):
        return _load_from_hub(path, revision)
    raise TaskError(f"{path}: no such file or folder (nor a Hugging Face hub id)")


def _read_table_file(path: Path) -> pd.DataFrame:
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".jsonl":
            return pd.read_json(path, lines=True, dtype=False)
        try:
            return pd.read_json(path, dtype=False)
        except ValueError:
            return pd.read_json(path, lines=True, dtype=False)
    except (OSError, ValueError) as err:
        raise TaskError(f"{path}: cannot read this table: {_one_line(err)}") from None


def _load_from_hub(hub_id: str, revision: str | None) -> pd.DataFrame:
    """Every split of a hub dataset, concatenated (KernelBook has one; KernelBench has one per level)."""
    try:
        import datasets
    except ImportError:
        raise TaskError(f"{hub_id}: no such local path; loading it from the Hugging Face hub needs the "
                        "`datasets` package (pip install datasets)") from None
    try:
        loaded = datasets.load_dataset(hub_id, revision=revision)
    except Exception as err:  # offline, unknown id, gated: all end the same way for us
        raise TaskError(f"{hub_id}: no such local path, and the Hugging Face hub could not provide it: "
                        f"{_one_line(err)}") from None
    return pd.concat([split.to_pandas() for split in loaded.values()], ignore_index=True)


def _require_columns(table: pd.DataFrame, columns: list[str], path: str, what: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise TaskError(f"{path}: not {what}: missing column(s) {', '.join(missing)}")


def _hidden(rel: Path) -> bool:
    return any(part.startswith((".", "__")) for part in rel.parts)


def _leading_int(stem: str) -> int:
    match = re.match(r"\d+", stem)
    return int(match.group()) if match else sys.maxsize


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    if isinstance(err, TaskError):
        return text[0] if text else "invalid task"
    return (f"{type(err).__name__}: {text[0]}" if text else type(err).__name__)[:300]


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




# ---------------------------------------------------------------- running each reference once on the CPU

_SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
_MB = 2**20


def validate_programs(codes: list[str], timeout_s: float, max_input_mb: float, workers: int,
                      started: list | None = None) -> list[dict]:
    """One verdict per program, in order: {"status": ok | rejected | too_large | timeout, "reason", "seconds"}.

    Each checker process imports torch once and forks a fresh child per program, so a program costs a fork rather
    than a new interpreter. `started`: checkers started earlier (their torch import overlaps the caller's work).
    """
    checkers = list(started or [])
    # a checker costs a torch import (seconds): small suites share one
    wanted = max(1, min(workers, len(codes) // 64))
    checkers += [_Checker() for _ in range(wanted - len(checkers))]
    idle = queue.SimpleQueue()
    for checker in checkers:
        idle.put(checker)

    def check(code: str) -> dict:
        checker = idle.get()
        try:
            return checker.check({"code": code, "timeout_s": timeout_s, "max_input_mb": max_input_mb})
        finally:
            idle.put(checker)

    try:
        with ThreadPoolExecutor(max_workers=len(checkers)) as pool:
            return list(pool.map(check, codes))
    finally:
        for checker in checkers:
            checker.close()


class _Checker:
    """A long-lived `serve_checks` process; restarted if it dies."""

    def __init__(self, start: bool = False):
        self.proc: subprocess.Popen | None = self._start() if start else None

    def check(self, job: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self.close()
            return {"status": "rejected", "reason": "the checker process died", "seconds": 0.0}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:  # the checker already died
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    @staticmethod
    def _start() -> subprocess.Popen:
        src = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, **_SINGLE_THREAD_ENV,
               "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
        return subprocess.Popen([sys.executable, "-c", "from concur.tasks import serve_checks; serve_checks()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def serve_checks() -> None:
    """Checker process: one JSON job per stdin line, one JSON verdict per stdout line."""
    import torch

    # Lazy initialisation (dispatch tables, the meta device) happens once here rather than in every child:
    # ~0.5 s per program otherwise.
    with torch.device("meta"):
        torch.nn.Linear(2, 2)(torch.rand(1, 2))
    torch.nn.Linear(2, 2)(torch.rand(1, 2)).relu().sum()
    for line in sys.stdin:
        print(json.dumps(_check_in_fork(json.loads(line))), flush=True)


def _check_in_fork(job: dict) -> dict:
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(job, write_fd)
    os.close(write_fd)
    payload, finished = _read_until(read_fd, started + job["timeout_s"])
    os.close(read_fd)
    try:
        os.killpg(pid, signal.SIGKILL)  # the child and anything it started; it is not reaped yet, so pid is ours
    except (ProcessLookupError, PermissionError):
        pass
    _, status = os.waitpid(pid, 0)
    seconds = round(time.monotonic() - started, 3)
    if not finished:
        return {"status": "timeout", "reason": f"ran longer than {job['timeout_s']} s on the CPU", "seconds": seconds}
    if payload:
        return {**json.loads(payload), "seconds": seconds}
    how = f"signal {-os.waitstatus_to_exitcode(status)}" if os.WIFSIGNALED(status) else \
        f"exit code {os.waitstatus_to_exitcode(status)}"
    return {"status": "rejected", "reason": f"the reference process ended without a verdict ({how})",
            "seconds": seconds}


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to fd until EOF, and whether EOF came before the deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), False
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _child(job: dict, write_fd: int) -> None:
    """Forked child: run the reference, write the verdict, exit without returning to the checker's loop."""
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        verdict = _run_reference(job["code"], job["max_input_mb"])
    except BaseException as err:  # the program may raise anything, SystemExit included
        verdict = {"status": "rejected", "reason": _one_line(err)}
    try:
        os.write(write_fd, json.dumps(verdict).encode())
    finally:
        os._exit(0)


def _run_reference(code: str, max_input_mb: float) -> dict:
    import torch

    torch.set_num_threads(1)
    _limit_memory((4 * max_input_mb + 2048) * _MB)
    namespace = {"__name__": "concur_task"}
    exec(compile(code, "<task>", "exec"), namespace)
    missing = [name for name in REQUIRED_NAMES if name not in namespace]
    if missing:
        return {"status": "rejected", "reason": f"does not define {', '.join(missing)}"}
    size_mb = _meta_size_mb(namespace)
    if size_mb is not None and size_mb > max_input_mb:
        return {"status": "too_large", "reason": f"parameters and inputs take {size_mb:.0f} MB, over max_input_mb"}
    torch.manual_seed(0)
    try:
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        with torch.no_grad():
            model(*inputs)
    except MemoryError:
        return {"status": "too_large", "reason": "ran out of memory on the CPU"}
    except RuntimeError as err:
        if "alloc" in str(err) and "memory" in str(err):
            return {"status": "too_large", "reason": f"ran out of memory on the CPU: {_one_line(err)}"}
        raise
    return {"status": "ok", "reason": ""}


def _meta_size_mb(namespace: dict) -> float | None:
    """Bytes of parameters, buffers and inputs built on the meta device (no memory used); None if that fails."""
    import torch

    try:
        with torch.device("meta"):
            model = namespace["Model"](*namespace["get_init_inputs"]())
            inputs = namespace["get_inputs"]()
    except Exception:  # data-dependent code cannot run on meta tensors; the real run is still limited
        return None
    tensors = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
    tensors += [t for t in _flatten(inputs) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) / _MB


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)
    else:
        yield value


def _limit_memory(limit_bytes: float) -> None:
    """Address space: what the checker already maps (torch) plus `limit_bytes`."""
    import resource

    status = Path("/proc/self/status").read_text()
    mapped_kb = int(re.search(r"VmSize:\s+(\d+)", status).group(1))
    soft = int(mapped_kb * 1024 + limit_bytes)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ---------------------------------------------------------------- the stage


def build_tasks(sources: list[dict], settings: dict | None = None, workers: int = 1) -> dict[str, pd.DataFrame]:
    """Train and eval tables plus the rejected, unchecked and contamination reports (keys of the result)."""
    settings = {**DEFAULT_SETTINGS, **(settings or {})}
    unknown = [src["kind"] for src in sources if src["kind"] not in SOURCES]
    if unknown:
        raise TaskError(f"task source kind {unknown[0]!r} is unknown (available: {', '.join(SOURCES)})")
    early = [_Checker(start=True)] if settings["validate_run"] else []
    try:
        tasks, rejected = _load_sources(sources)
        tasks, duplicates = drop_duplicate_code(tasks)
    except BaseException:
        for checker in early:
            checker.close()
        raise
    tasks, failed, unchecked = _validate(tasks, settings, workers, early)
    train, eval_ = (tasks[tasks["split"] == split] for split in SPLITS)
    report = contamination_report(train, eval_, settings["similarity_threshold"], settings["ngram"])
    if settings["drop_contaminated"]:
        train = train[~train["task_id"].isin(report["train_task_id"])]
    log.info("tasks: %d train, %d eval; %d rejected, %d duplicates, %d not run, %d contaminated train tasks%s",
             len(train), len(eval_), len(rejected) + len(failed), len(duplicates), len(unchecked),
             report["train_task_id"].nunique(), " (dropped)" if settings["drop_contaminated"] else "")
    train, eval_ = contracts.conform(train, contracts.TASKS, "tasks/train"), contracts.conform(eval_, contracts.TASKS,
                                                                                              "tasks/eval")
    if settings["validate_run"]:
        skip = {row["task_id"] for row in unchecked}
        train, eval_ = flag_degenerate([train, eval_], skip, settings, workers)
    return {
        "train": train,
        "eval": eval_,
        "rejected": pd.DataFrame(rejected + duplicates + failed, columns=REPORT_COLUMNS),
        "unchecked": pd.DataFrame(unchecked, columns=REPORT_COLUMNS),
        "contamination": report,
    }


def flag_degenerate(frames: list[pd.DataFrame], skip: set[str], settings: dict, workers: int) -> list[pd.DataFrame]:
    """Add `degenerate` (a trivial output — zeros, an input, a constant — passes the task's check, so its verdicts
    prove little) and `degenerate_outputs` (which ones), probed once per task on the CPU with the verifier's check."""
    import tempfile

    from .verify import normalize_settings, probe_tasks

    probe_settings = normalize_settings({"device": "cpu", "workers": max(1, workers),
                                         "timeout_s": settings["validate_timeout_s"]})  # fmt: skip
    references = {t: c for f in frames for t, c in zip(f["task_id"], f["code"]) if t not in skip}
    with tempfile.TemporaryDirectory(prefix="concur-probe-") as workdir:
        kinds = probe_tasks(references, probe_settings, Path(workdir))
    flagged = []
    for frame in frames:
        found = [kinds.get(t, []) for t in frame["task_id"]]
        flagged.append(frame.assign(degenerate=[bool(k) for k in found], degenerate_outputs=["+".join(k) for k in found]))
    log.info("degenerate tasks: %s", sorted(t for t, k in kinds.items() if k) or "none")
    return flagged


def _load_sources(sources: list[dict]) -> tuple[pd.DataFrame, list[dict]]:
    rows, rejected = [], []
    for source in sources:
        loaded, refused = SOURCES[source["kind"]](source)
        log.info("source %s %s: %d programs, %d rejected", source["kind"], source["path"], len(loaded), len(refused))
        rows += loaded
        rejected += refused
    tasks = pd.DataFrame(rows, columns=list(contracts.TASKS))
    dupes = tasks.loc[tasks["task_id"].duplicated(), "task_id"].tolist()
    if dupes:
        raise TaskError(f"duplicate task ids across sources: {', '.join(dupes[:5])}")
    return tasks.sort_values("task_id", kind="stable", ignore_index=True), rejected


def drop_duplicate_code(tasks: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Keep the first task (by id) of each split with a given normalised code; the others are reported."""
    hashes = tasks["code"].map(code_hash)
    first = {}
    keep, duplicates = [], []
    for task, key in zip(tasks.itertuples(index=False), hashes):
        kept = first.setdefault((task.split, key), task.task_id)
        keep.append(kept == task.task_id)
        if kept != task.task_id:
            duplicates.append({"task_id": task.task_id, "source": task.suite, "origin": task.origin,
                               "reason": f"duplicate of {kept} (same normalised code)"})
    return tasks[keep].reset_index(drop=True), duplicates


def _validate(tasks: pd.DataFrame, settings: dict, workers: int,
              started: list) -> tuple[pd.DataFrame, list[dict], list[dict]]:
    """Run every reference once; failures are rejected, programs too big or slow for the CPU kept but listed."""
    if not settings["validate_run"]:
        unchecked = [_report_row(t, "not run: validate_run is false") for t in tasks.itertuples(index=False)]
        return tasks, [], unchecked
    verdicts = validate_programs(tasks["code"].tolist(), settings["validate_timeout_s"], settings["max_input_mb"],
                                 workers, started)
    keep, failed, unchecked = [], [], []
    for task, verdict in zip(tasks.itertuples(index=False), verdicts):
        keep.append(verdict["status"] != "rejected")
        if verdict["status"] == "rejected":
            failed.append(_report_row(task, f"reference does not run: {verdict['reason']}"))
        elif verdict["status"] != "ok":
            unchecked.append(_report_row(task, f"not run to the end: {verdict['reason']}"))
    return tasks[keep].reset_index(drop=True), failed, unchecked


def _report_row(task, reason: str) -> dict:
    return {"task_id": task.task_id, "source": task.suite, "origin": task.origin, "reason": reason}


def run(sources: list[dict], out_paths: dict[str, str], settings: dict | None = None, workers: int = 1) -> None:
    """The `tasks` stage: results/tasks/{train,eval}.parquet and the rejected/unchecked/contamination CSVs."""
    from .io import write_parquet, write_text

    tables = build_tasks(sources, settings, workers)
    for name, frame in tables.items():
        if name in SPLITS:
            write_parquet(frame, out_paths[name])
        elif name in out_paths:
            write_text(frame.to_csv(index=False), out_paths[name])


def _forward_of(tree: ast.Module) -> ast.FunctionDef | None:
    return _method(tree, model_class(tree), "forward")


def _is_plumbing(call: ast.Call) -> bool:
    """Calls that move no data: super(), len(), shape/size queries."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in {"super", "len", "range", "int", "float", "size", "dim", "isinstance"}


def _is_constant(node: ast.AST) -> bool:
    return all(isinstance(n, (ast.Constant, ast.operator, ast.unaryop, ast.BinOp, ast.UnaryOp)) for n in ast.walk(node))

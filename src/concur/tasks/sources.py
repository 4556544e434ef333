"""Task sources: each turns a collection of PyTorch programs into rows of contracts.TASKS (plus the rejected ones),
and names the local files it reads, so that the workflow reruns the tasks stage when one changes."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import pandas as pd
import yaml

from .. import contracts
from ..contracts import SPLITS, require_columns
from .kernelbook import adapt_kernelbook
from .programs import TaskError, categorise, check_program, count_ops, error_line

DEFAULT_SPLIT = {"builtin": None, "kernelbook": "train", "kernelbench": "eval", "folder": "train"}
LEVEL_OF_CATEGORY = {"single_op": 1, "fused": 2, "model": 3}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TABLE_SUFFIXES = (".parquet", ".jsonl", ".json")


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
    unlisted = sorted(
        {p.relative_to(root).as_posix() for p in _builtin_programs(root)}
        - {f"{r['split']}/{r['name']}.py" for r in rows}
    )
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


def _builtin_programs(root: Path) -> list[Path]:
    return sorted(p for split in SPLITS for p in (root / split).glob("*.py"))


def load_builtin_source(source: dict) -> tuple[list[dict], list[dict]]:
    return load_builtin(source["path"]).to_dict("records"), []


def load_kernelbook(source: dict) -> tuple[list[dict], list[dict]]:
    """A KernelBook export (parquet/JSONL file or folder) or hub id; ids are `kernelbook/{uuid}`."""
    path = source["path"]
    table = read_table(path, source.get("revision"))
    require_columns(table, ["python_code", "entry_point"], f"{path}: not a KernelBook export", TaskError)
    split = source.get("split") or DEFAULT_SPLIT["kernelbook"]
    rows, rejected = [], []
    for record in table.to_dict("records"):
        code, entry_point = str(record["python_code"]), str(record["entry_point"])
        uuid = record.get("uuid")
        uuid = str(uuid) if pd.notna(uuid) and str(uuid) else hashlib.sha256(code.encode()).hexdigest()[:16]
        task_id = f"kernelbook/{uuid}"
        origin = f"{path}#uuid={uuid}" + (f" repo={record['repo_name']}" if record.get("repo_name") else "")
        _add_program(
            rows,
            rejected,
            lambda code=code, entry_point=entry_point: adapt_kernelbook(code, entry_point),
            task_id=task_id,
            split=split,
            suite="kernelbook",
            name=entry_point,
            origin=origin,
            level=None,
        )
    return rows, rejected


def load_kernelbench(source: dict) -> tuple[list[dict], list[dict]]:
    """A KernelBench checkout (`[KernelBench/]level{N}/{id}_{Name}.py`) or its dataset export; ids
    `kernelbench/L{N}/{id}_{Name}`."""
    path, levels = source["path"], source.get("levels")
    split = source.get("split") or DEFAULT_SPLIT["kernelbench"]
    root = _kernelbench_root(Path(path))
    programs = _kernelbench_files(root, levels) if root else _kernelbench_table(path, source.get("revision"), levels)
    rows, rejected = [], []
    for level, stem, read_code, origin in programs:
        name = stem.split("_", 1)[1] if re.match(r"\d+_.", stem) else stem
        _add_program(
            rows,
            rejected,
            read_code,
            task_id=f"kernelbench/L{level}/{stem}",
            split=split,
            suite="kernelbench",
            name=name,
            origin=origin,
            level=level,
        )
    return rows, rejected


def load_folder(source: dict) -> tuple[list[dict], list[dict]]:
    """A user's folder of .py programs (searched recursively); ids are `user/{relative path without .py}`."""
    root = Path(source["path"])
    if not root.is_dir():
        raise TaskError(f"{root}: the folder task source does not exist or is not a folder")
    split = source.get("split") or DEFAULT_SPLIT["folder"]
    rows, rejected = [], []
    for path in _folder_programs(root):
        rel = path.relative_to(root).with_suffix("").as_posix()
        _add_program(
            rows,
            rejected,
            lambda path=path: path.read_text(encoding="utf-8"),
            task_id=f"user/{rel}",
            split=split,
            suite="user",
            name=path.stem,
            origin=path.as_posix(),
            level=None,
        )
    return rows, rejected


def _folder_programs(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not _hidden(p.relative_to(root)))


SOURCES = {
    "builtin": load_builtin_source,
    "kernelbook": load_kernelbook,
    "kernelbench": load_kernelbench,
    "folder": load_folder,
}


def input_files(sources: list[dict]) -> list[str]:
    """The local files the sources read, in the order they are read: the built-in suite's manifest and programs, a
    table file or a folder's tables, a KernelBench checkout's programs of the chosen levels, a folder's programs.

    Only what exists locally and is cheap to list: a hub id, a missing path or a missing level adds nothing (the
    tasks job names the problem), so planning a run never reads a large source.
    """
    files: list[Path] = []
    for source in sources:
        path, kind = Path(source["path"]), source["kind"]
        if kind == "builtin":
            files += [path / "suite.yaml", *_builtin_programs(path)] if path.is_dir() else []
        elif kind == "folder":
            files += _folder_programs(path) if path.is_dir() else []
        elif kind == "kernelbench" and (root := _kernelbench_root(path)):
            files += [
                p for level in source.get("levels") or _kernelbench_levels(root) for p in _level_files(root, level)
            ]
        else:
            files += _table_files(path)
    return [p.as_posix() for p in files if p.is_file()]


def _add_program(rows: list, rejected: list, read_code, *, task_id, split, suite, name, origin, level) -> None:
    """Append the task made from `read_code()` to rows, or its reason to rejected; untrusted input never raises."""
    try:
        code = read_code()
        check_program(code, "program")
        category, n_ops = categorise(code)
    except Exception as err:  # any malformed program is a rejection, never a crash
        rejected.append({"task_id": task_id, "source": suite, "origin": origin, "reason": error_line(err)})
        return
    rows.append(
        {
            "task_id": task_id,
            "split": split,
            "suite": suite,
            "level": level or LEVEL_OF_CATEGORY[category],
            "name": name,
            "code": code,
            "category": category,
            "n_ops": n_ops,
            "origin": origin,
        }
    )


def _kernelbench_root(path: Path) -> Path | None:
    """The folder holding level1/, level2/ … (a checkout's KernelBench/ subfolder or the path itself)."""
    for candidate in (path / "KernelBench", path):
        if candidate.is_dir() and any(candidate.glob("level[0-9]*")):
            return candidate
    return None


def _kernelbench_levels(root: Path) -> list[int]:
    return sorted(int(d.name[5:]) for d in root.glob("level[0-9]*") if d.is_dir() and d.name[5:].isdigit())


def _level_files(root: Path, level: int) -> list[Path]:
    folder = root / f"level{level}"
    return sorted(folder.glob("*.py"), key=lambda p: (_leading_int(p.stem), p.stem)) if folder.is_dir() else []


def _kernelbench_files(root: Path, levels: list[int] | None):
    for level in levels or _kernelbench_levels(root):
        if not (root / f"level{level}").is_dir():
            raise TaskError(f"{root}: KernelBench level {level} has no folder level{level}/")
        for path in _level_files(root, level):
            yield level, path.stem, lambda path=path: path.read_text(encoding="utf-8"), path.as_posix()


def _kernelbench_table(path: str, revision: str | None, levels: list[int] | None):
    table = read_table(path, revision)
    require_columns(
        table, ["code", "level", "name", "problem_id"], f"{path}: not a KernelBench dataset export", TaskError
    )
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
        files = _table_files(local)
        if not files:
            raise TaskError(f"{path}: no .parquet, .jsonl or .json files in this folder")
        return pd.concat([_read_table_file(f) for f in files], ignore_index=True)
    if local.is_file():
        return _read_table_file(local)
    if HUB_ID.fullmatch(path):
        return _load_from_hub(path, revision)
    raise TaskError(f"{path}: no such file or folder (nor a Hugging Face hub id)")


def _table_files(path: Path) -> list[Path]:
    """A table file itself, or the tables of a folder (not its subfolders); nothing for a path that is neither."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in TABLE_SUFFIXES)
    return [path] if path.is_file() else []


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
        raise TaskError(f"{path}: cannot read this table: {error_line(err)}") from None


def _load_from_hub(hub_id: str, revision: str | None) -> pd.DataFrame:
    """Every split of a hub dataset, concatenated (KernelBook has one; KernelBench has one per level)."""
    try:
        import datasets
    except ImportError:
        raise TaskError(
            f"{hub_id}: no such local path; loading it from the Hugging Face hub needs the "
            "`datasets` package (pip install datasets)"
        ) from None
    try:
        loaded = datasets.load_dataset(hub_id, revision=revision)
    except Exception as err:  # offline, unknown id, gated: all end the same way for us
        raise TaskError(
            f"{hub_id}: no such local path, and the Hugging Face hub could not provide it: {error_line(err)}"
        ) from None
    return pd.concat([split.to_pandas() for split in loaded.values()], ignore_index=True)


def _hidden(rel: Path) -> bool:
    return any(part.startswith((".", "__")) for part in rel.parts)


def _leading_int(stem: str) -> int:
    match = re.match(r"\d+", stem)
    return int(match.group()) if match else sys.maxsize

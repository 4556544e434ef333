"""Atomic writes: a killed job never leaves a half-written output that Snakemake would take as done."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def write_parquet(frame: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_csv(frame: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def write_json(obj, path: str | os.PathLike) -> None:
    write_text(json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n", path)


def write_jsonl(records, path: str | os.PathLike) -> None:
    write_text("".join(json.dumps(r, ensure_ascii=False, default=_jsonable) + "\n" for r in records), path)


def read_parquets(paths) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _jsonable(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, float) and value != value:
        return None
    raise TypeError(f"cannot serialise {type(value).__name__}")

"""replay: generations made elsewhere (the demo's file, an imported KernelBench run), read from JSONL or parquet."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path

import pandas as pd

from .base import NOTHING, Generation, Request, Skipped

log = logging.getLogger(__name__)

OPTIONAL_STR = ("reasoning", "finish_reason", "prompt")


class ReplayBackend:
    """Generations made elsewhere, from JSONL or parquet rows with `task_id`, `response` and optionally
    `sample_idx` (else the row's order within its task), `reasoning`, `finish_reason`, `prompt`, `seed`.

    Rows not yielded are listed in `skipped` once `generate` has run: rows for tasks this job was not asked for,
    rows past `samples`, and a second row for a (task_id, sample_idx) already read (the first one is kept)."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read_generations(self.path)
        self.skipped: list[Skipped] = []

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        wanted = {r.task_id for r in requests}
        self.skipped = []
        next_idx: dict[str, int] = {}
        seen: set[tuple[str, int]] = set()
        for number, row in enumerate(self.rows, 1):
            task_id = row["task_id"]
            idx = int(row["sample_idx"]) if row.get("sample_idx") is not None else next_idx.get(task_id, 0)
            next_idx[task_id] = max(next_idx.get(task_id, 0), idx + 1)
            if task_id not in wanted:
                self.skipped.append(Skipped("other_task", task_id, idx, f"{self.path.name} row {number}"))
                continue
            if idx >= samples:
                self.skipped.append(
                    Skipped("past_samples", task_id, idx, f"sample {idx} >= samples per task ({samples})")
                )
                continue
            if (task_id, idx) in seen:
                self.skipped.append(Skipped("duplicate", task_id, idx, f"{self.path.name} row {number}"))
                continue
            seen.add((task_id, idx))
            if (task_id, idx) in skip:
                continue
            yield Generation(
                task_id,
                idx,
                row["response"],
                row.get("finish_reason") or "replay",
                int(row.get("seed") or 0),
                row.get("reasoning") or None,
                prompt=row.get("prompt") or None,
            )
        absent = sorted(wanted - set(next_idx))
        if absent:
            log.warning("%s has no generations for %d task(s), e.g. %s", self.path, len(absent), absent[0])


def _read_generations(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: generations file not found")
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        where = lambda i: f"{path} row {i}"  # noqa: E731
    else:
        rows = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        where = lambda i: f"{path} record {i + 1}"  # noqa: E731
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{where(i)}: not an object")
        missing = [k for k in ("task_id", "response") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{where(i)}: missing or non-string {', '.join(missing)}")
        wrong = [k for k in OPTIONAL_STR if row.get(k) is not None and not isinstance(row[k], str)]
        if wrong:
            raise ValueError(f"{where(i)}: {', '.join(wrong)} must be a string")
        idx = row.get("sample_idx")
        if idx is not None and not (
            isinstance(idx, (int, float)) and not isinstance(idx, bool) and idx >= 0 and idx == int(idx)
        ):
            raise ValueError(f"{where(i)}: sample_idx {idx!r} is not a non-negative integer")
    return rows

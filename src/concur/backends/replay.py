"""replay: generations made elsewhere (the demo's file), read from JSONL or parquet."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path

import pandas as pd

from .base import NOTHING, Generation, Request

log = logging.getLogger(__name__)


class ReplayBackend:
    """Generations made elsewhere, from JSONL or parquet rows with `task_id`, `response` and optionally
    `sample_idx` (else the row's order within its task), `reasoning`, `finish_reason`, `seed`."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read_generations(self.path)

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        wanted = {r.task_id for r in requests}
        by_task: dict[str, int] = {}
        for row in self.rows:
            task_id = row["task_id"]
            if task_id not in wanted:
                continue
            idx = int(row.get("sample_idx", by_task.get(task_id, 0)))
            by_task[task_id] = idx + 1
            if idx >= samples or (task_id, idx) in skip:
                continue
            yield Generation(
                task_id,
                idx,
                row["response"],
                row.get("finish_reason") or "replay",
                int(row.get("seed") or 0),
                row.get("reasoning") or None,
            )
        absent = sorted(wanted - set(by_task))
        if absent:
            log.warning("%s has no generations for %d task(s), e.g. %s", self.path, len(absent), absent[0])


def _read_generations(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: generations file not found")
    if path.suffix == ".parquet":
        rows = pd.read_parquet(path).to_dict("records")
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
        missing = [k for k in ("task_id", "response") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{where(i)}: missing or non-string {', '.join(missing)}")
    return rows

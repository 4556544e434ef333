"""replay: generations made elsewhere (the demo's file, an imported KernelBench run), read from JSONL or parquet."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from pathlib import Path

import pandas as pd

from .base import NOTHING, Generation, Request, Skipped, wanted_samples

log = logging.getLogger(__name__)

OPTIONAL_STR = ("reasoning", "finish_reason", "prompt")


class ReplayBackend:
    """Generations made elsewhere, from JSONL or parquet rows with `task_id`, `response` and optionally
    `sample_idx` (else the row's order within its task and turn), `turn` (1 unless given: a row of turn k > 1 is
    the refined version of the same sample's turn k-1 row, its parent), `reasoning`, `finish_reason`, `prompt`,
    `seed`.

    A job reads the rows of the turn its requests name; rows of other turns are its jobs'. Rows not yielded are
    listed in `skipped` once `generate` has run: rows (of any turn) for tasks this job was not asked for, rows past
    `samples`, a second row for a (task_id, sample_idx, turn) already read (the first one is kept), and rows of a
    refinement turn whose trajectory was not asked for (its parent needed no refinement, or was not written)."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read_generations(self.path)
        self.skipped: list[Skipped] = []

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        wanted = {r.task_id for r in requests}
        turn = requests[0].turn if requests else 1
        asked = {(r.task_id, i) for r in requests for i in wanted_samples(r, samples)}
        self.skipped = []
        next_idx: dict[tuple[str, int], int] = {}
        seen: set[tuple[str, int]] = set()
        found: set[str] = set()
        for number, row in enumerate(self.rows, 1):
            task_id, row_turn = row["task_id"], int(row.get("turn") or 1)
            slot = (task_id, row_turn)
            idx = int(row["sample_idx"]) if row.get("sample_idx") is not None else next_idx.get(slot, 0)
            next_idx[slot] = max(next_idx.get(slot, 0), idx + 1)
            if task_id not in wanted:
                if row_turn == 1 or turn == 1:  # every turn's rows of a task in no split, once (by turn 1's job)
                    self.skipped.append(Skipped("other_task", task_id, idx, f"{self.path.name} row {number}"))
                continue
            if row_turn != turn:
                continue
            found.add(task_id)
            if idx >= samples:
                self.skipped.append(
                    Skipped("past_samples", task_id, idx, f"sample {idx} >= samples per task ({samples})")
                )
                continue
            if (task_id, idx) in seen:
                self.skipped.append(Skipped("duplicate", task_id, idx, f"{self.path.name} row {number}"))
                continue
            seen.add((task_id, idx))
            if (task_id, idx) not in asked:
                self.skipped.append(
                    Skipped("stopped", task_id, idx, f"turn {turn}: its turn {turn - 1} version is not refined")
                )
                continue
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
        absent = sorted(wanted - found)
        if absent:
            what = "generations" if turn == 1 else f"turn-{turn} generations"
            log.warning("%s has no %s for %d task(s), e.g. %s", self.path, what, len(absent), absent[0])


def _read_generations(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: generations file not found")
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        where = lambda i: f"{path} row {i}"  # noqa: E731
    else:
        rows = []
        # JSON lines end at "\n" only: a string may hold U+2028 or U+0085 unescaped, where str.splitlines breaks
        for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
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
        turn = row.get("turn")
        if turn is not None and not (
            isinstance(turn, (int, float)) and not isinstance(turn, bool) and turn >= 1 and turn == int(turn)
        ):
            raise ValueError(f"{where(i)}: turn {turn!r} is not a positive integer")
    return rows

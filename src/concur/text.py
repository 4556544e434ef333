"""One-line messages: the form every error takes in a table's `reason`, a report or a log line."""

from __future__ import annotations


def one_line(text, limit: int = 300) -> str:
    """`text` on one line (whitespace runs made one space; None as empty), cut to `limit` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(err: BaseException) -> str:
    """An exception as one line: its type, then its message."""
    return one_line(f"{type(err).__name__}: {err}")

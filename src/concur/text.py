"""Text helpers: one-line messages (the form every error takes in a table's `reason`, a report or a log line), and
a program's lines as Python numbers them."""

from __future__ import annotations

import re

# Python's parser breaks lines at these only; str.splitlines also breaks at \f, \v, \x1c-\x1e, \x85, U+2028, U+2029
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def one_line(text, limit: int = 300) -> str:
    """`text` on one line (whitespace runs made one space; None as empty), cut to `limit` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(err: BaseException) -> str:
    """An exception as one line: its type, then its message."""
    return one_line(f"{type(err).__name__}: {err}")


def source_lines(source: str, keepends: bool = False) -> list[str]:
    """`source`'s lines as Python's parser numbers them (ast's `lineno`, a code object's, linecache's for a file), so
    that line N of the list is the parser's line N."""
    lines = _LINE.findall(source)
    return lines if keepends else [line.rstrip("\r\n") for line in lines]

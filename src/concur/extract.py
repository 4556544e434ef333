"""Split a completion into reasoning, answer and the solution code."""

from __future__ import annotations

import re
from typing import NamedTuple

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# A fence opens with ``` plus an optional language tag and closes with ``` on a line of its own.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}


class Extracted(NamedTuple):
    reasoning: str
    answer: str
    code: str


def split_reasoning(response: str) -> tuple[str, str]:
    """(reasoning, answer) from `<think>…</think>`.

    Reasoning models whose chat template opens the think block themselves emit only the closing tag; a completion cut
    off inside its reasoning has only the opening tag and no answer at all.
    """
    close = response.find(THINK_CLOSE)
    if close >= 0:
        open_ = response.rfind(THINK_OPEN, 0, close)
        start = open_ + len(THINK_OPEN) if open_ >= 0 else 0
        return response[start:close].strip(), response[close + len(THINK_CLOSE) :].strip()
    open_ = response.find(THINK_OPEN)
    if open_ >= 0:
        return response[open_ + len(THINK_OPEN) :].strip(), response[:open_].strip()
    return "", response.strip()


def last_python_block(text: str) -> str:
    """The last fenced block tagged python (or untagged); empty when there is none."""
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1].strip() + "\n" if blocks else ""


def extract(response: str, reasoning: str | None = None) -> Extracted:
    """Reasoning from the backend's own field when it has one, else from think tags; code only from the answer."""
    if reasoning:
        _, answer = split_reasoning(response)
        return Extracted(reasoning.strip(), answer, last_python_block(answer))
    thought, answer = split_reasoning(response)
    return Extracted(thought, answer, last_python_block(answer))

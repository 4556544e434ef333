"""The verifier's verdict on a candidate, told back to the model: the follow-up user message of a refinement turn
(our own wording), and the chat it continues.

A trajectory is one sample's versions, turn after turn: turn k's candidate answers the chat of turns 1..k-1 (each
turn's user message and the model's answer, without its reasoning, as reasoning models' chat templates drop it)
followed by a message built from turn k-1's verdict (`Feedback`). A version that is correct and faster than
`stop_speedup` ends its trajectory (`needs_refinement`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

MAX_REASON_CHARS = 1500  # a compiler error or a failed check, trimmed to this many characters

_STATUS_TEXT = {
    "compile_error": "Your program did not build. The compiler said:",
    "runtime_error": "Your program built but failed when it ran:",
    "timeout": "Your program ran out of time:",
    "rejected": "The verifier rejected your program (its kernels must do the work of the forward pass, with no "
    "fallback to PyTorch operators and no changes to the harness):",
    "incorrect": "Your program ran but its outputs do not match the reference's:",
}


@dataclass(frozen=True)
class Feedback:
    """What the verifier found about one version: its verdict's `status`, `reason`, `max_abs_err`, speedup and the
    two runtimes (ms, NaN when not timed), the reference's slowest kernels or operators with their shares of its
    time (hardened mode's profile), whether the generation was cut at its token cap, and whether it had code at
    all."""

    status: str
    reason: str = ""
    max_abs_err: float = math.nan
    speedup: float = math.nan
    ref_ms: float = math.nan
    new_ms: float = math.nan
    truncated: bool = False
    hotspots: str = ""  # where the reference's time goes, from the verifier's profile (verdicts' `ref_hotspots`)

    @classmethod
    def from_row(cls, row) -> Feedback:
        """From a candidate joined with its verdict (a dict or a pandas row with the VERDICTS columns and the
        candidates' `truncated`)."""

        def number(key: str) -> float:
            value = row.get(key)
            return float(value) if value is not None and not pd.isna(value) else math.nan

        return cls(
            status=str(row.get("status") or ""),
            reason=str(row.get("reason") or ""),
            max_abs_err=number("max_abs_err"),
            speedup=number("speedup"),
            ref_ms=number("ref_ms"),
            new_ms=number("new_ms"),
            truncated=bool(row.get("truncated")),
            hotspots=str(row.get("ref_hotspots") or ""),
        )

    def message(self) -> str:
        """The follow-up user message: what happened, then what to do."""
        lines = []
        if self.truncated:
            lines.append("Your previous answer was cut off at the token limit before it was complete.")
        if self.status == "correct":
            lines.append(f"Your program is correct. {self._speed()}")
            if self.hotspots:
                lines.append(f"The PyTorch reference spends its time in: {self.hotspots}.")
            lines.append(
                "Make it faster: give a new version whose kernels do the work in fewer passes over memory, with "
                "less launch and allocation overhead, keeping the outputs the same."
            )
        elif self.status == "no_code":
            lines.append(
                "Your answer had no complete program: give the whole program defining `ModelNew` in one ```python "
                "block after your reasoning."
            )
        else:
            lines.append(_STATUS_TEXT.get(self.status, f"The verifier's verdict was {self.status!r}:"))
            lines.append(trimmed(self.reason) or "(no detail)")
            if self.status == "incorrect" and not math.isnan(self.max_abs_err):
                lines.append(f"Largest absolute difference from the reference's outputs: {self.max_abs_err:.3g}.")
            lines.append("Fix it: find the cause, then give the corrected program.")
        lines.append("Reason inside <think>...</think>, then give the full program in one ```python block.")
        return "\n\n".join(lines)

    def _speed(self) -> str:
        if math.isnan(self.speedup):
            return "Its runtime was too short to tell from the timer's noise."
        times = ""
        if not (math.isnan(self.ref_ms) or math.isnan(self.new_ms)):
            times = f" (PyTorch eager {self.ref_ms:.4g} ms, yours {self.new_ms:.4g} ms per call)"
        return f"It runs at {self.speedup:.3g}x the speed of the PyTorch reference{times}."


def trimmed(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text` cut to `limit` characters, marked where it was cut."""
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 14].rstrip() + " … (trimmed)"


def needs_refinement(correct: bool, speedup: float, stop_speedup: float | None) -> bool:
    """Whether a version's trajectory goes on: not correct, or correct but not faster than `stop_speedup`
    (strictly, as fast_p counts; an unresolved speedup, NaN, is not known to be faster). With `stop_speedup`
    None every trajectory goes on."""
    if stop_speedup is None or not correct:
        return True
    return not (speedup > stop_speedup)  # NaN > x is False


def shown_answer(answer: str, code: str) -> str:
    """A version as the next turn's chat shows the model's message: its answer without the reasoning; a program
    found only in the reasoning (an answer cut short) as a python block."""
    if (answer or "").strip():
        return answer
    return f"```python\n{code}\n```" if (code or "").strip() else ""


def trajectory_messages(chain: list) -> list[dict]:
    """The chat of a trajectory's versions `chain` (oldest first; each with `prompt`, `answer`, `code`): per
    version its user message and the model's answer as `shown_answer` gives it."""
    out: list[dict] = []
    for version in chain:
        out.append({"role": "user", "content": str(version["prompt"])})
        out.append({"role": "assistant", "content": shown_answer(str(version["answer"]), str(version["code"]))})
    return out


def chain_of(candidate_id: str, by_id: dict[str, dict]) -> list[dict]:
    """The versions of the trajectory ending at `candidate_id`, oldest first, following `parent_id` through
    `by_id` (candidate rows by id)."""
    chain, seen = [], set()
    current = by_id.get(candidate_id)
    while current is not None:
        if current["candidate_id"] in seen:
            raise ValueError(f"candidate {candidate_id}: its parent_id chain loops")
        seen.add(current["candidate_id"])
        chain.append(current)
        parent = current.get("parent_id") or ""
        if parent and parent not in by_id:
            raise ValueError(f"candidate {current['candidate_id']}: parent {parent!r} is not among the candidates")
        current = by_id.get(parent) if parent else None
    return chain[::-1]

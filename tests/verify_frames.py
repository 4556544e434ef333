"""Candidates and tasks tables for the verifier tests, following their contracts (docs/data.md sections 1 and 3)."""

import pandas as pd

from concur import contracts


def candidates_frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """(candidate_id, task_id, code) rows as a candidates table; the fields the verifier ignores are blank."""
    return contracts.conform(pd.DataFrame(
        [
            {"candidate_id": cid, "task_id": tid, "sample_idx": i, "generator": "test", "backend": "replay",
             "prompt": "", "response": "", "reasoning": "", "answer": "", "code": code, "reasoning_tokens": 0,
             "completion_tokens": 0, "finish_reason": "replay", "seed": 0, "reasoning_source": "none",
             "code_source": "answer" if code else "", "truncated": False, "truncation": "", "tokenizer": ""}
            for i, (cid, tid, code) in enumerate(rows)
        ]
    ), contracts.CANDIDATES)  # fmt: skip


def tasks_frame(rows: list[tuple[str, str]], category: str = "fused", precision: str | None = None) -> pd.DataFrame:
    """(task_id, program) rows as a tasks table; `precision` (fp32, fp16, bf16) for every task, or none given (a
    table made before tasks had one: read as fp32)."""
    extra = {} if precision is None else {"precision": precision}
    return contracts.conform(pd.DataFrame(
        [
            {"task_id": tid, "split": "train", "suite": "test", "level": 1, "name": tid, "code": code,
             "category": category, "n_ops": 1, "origin": "fixture", **extra}
            for tid, code in rows
        ]
    ), contracts.TASKS)  # fmt: skip

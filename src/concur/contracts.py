"""Column contracts between stages (documented in docs/data.md) and the one function that enforces them."""

from __future__ import annotations

import pandas as pd

SPLITS = ("train", "eval")

TASKS = {
    "task_id": "str",
    "split": "str",
    "suite": "str",
    "level": "int",
    "name": "str",
    "code": "str",
    "category": "str",
    "n_ops": "int",
    "origin": "str",
    "precision": "str",
}

# the precisions a task runs in (tasks' `precision`): floating inputs and weights cast to the dtype, as KernelBench's
# eval_kernel_against_ref(precision=...) casts them
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

# what the reference is timed under besides eager (verify.baselines): torch.compile with inductor's default mode,
# or one of the modes KernelBench sweeps; each gives the verdicts a speedup column (speedup_column)
COMPILE_BASELINES = {
    "compile": "default",
    "compile-reduce-overhead": "reduce-overhead",
    "compile-max-autotune": "max-autotune",
    "compile-max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
}
BASELINES = ("eager", *COMPILE_BASELINES)


def speedup_column(baseline: str) -> str:
    """The verdicts' speedup over `baseline`: `speedup` for eager (as ever), `speedup_<name>` for the others."""
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; known: {', '.join(BASELINES)}")
    return "speedup" if baseline == "eager" else "speedup_" + baseline.replace("-", "_")


CANDIDATES = {
    "candidate_id": "str",
    "task_id": "str",
    "sample_idx": "int",
    "generator": "str",
    "backend": "str",
    "prompt": "str",
    "response": "str",
    "reasoning": "str",
    "answer": "str",
    "code": "str",
    "reasoning_tokens": "int",
    "completion_tokens": "int",
    "finish_reason": "str",
    "seed": "int",
    "reasoning_source": "str",
    "code_source": "str",
    "truncated": "bool",
    "truncation": "str",
    "tokenizer": "str",
    "turn": "int",
    "parent_id": "str",
}

# how the reasoning was told from the answer (candidates' `reasoning_source`; docs/data.md, "Reading a response")
REASONING_SOURCES = ("field", "tags", "close_tag", "open_tag", "inferred", "none")
CODE_SOURCES = ("answer", "reasoning", "")
TRUNCATIONS = ("reported", "detected", "")

VERDICTS = {
    "candidate_id": "str",
    "task_id": "str",
    "status": "str",
    "reason": "str",
    "compiled": "bool",
    "correct": "bool",
    "ref_ms": "float",
    "new_ms": "float",
    "ref_median_ms": "float",
    "new_median_ms": "float",
    "ref_best_ms": "float",
    "new_best_ms": "float",
    "speedup": "float",
    **{speedup_column(b): "float" for b in COMPILE_BASELINES},  # NaN where that baseline was not timed
    "max_abs_err": "float",
    "device": "str",
    "verify_mode": "str",
    "compile_s": "float",
    "eval_s": "float",
    "flags": "str",
    "trusted": "bool",
    "ref_hotspots": "str",
}

BUILDS = {
    "candidate_id": "str",
    "task_id": "str",
    "status": "str",
    "reason": "str",
    "cache_key": "str",
    "compile_s": "float",
    "kernels": "str",
}

DATASET = {
    "candidate_id": "str",
    "task_id": "str",
    "generator": "str",
    "criterion": "str",
    "name": "str",
    "category": "str",
    "level": "int",
    "prompt": "str",
    "reasoning": "str",
    "answer": "str",
    "code": "str",
    "reasoning_tokens": "int",
    "speedup": "float",
    "turn": "int",
    "history": "str",
}

# columns a frame may lack, read as these values: files and writers of single-turn runs (turn 1, no parent, no
# earlier messages)
ABSENT_AS = {
    "turn": 1,
    "parent_id": "",
    "history": "[]",
    "precision": "fp32",  # tasks made before tasks had a precision: KernelBench's default
    "ref_hotspots": "",  # verdicts made before the reference's profile was kept
    **{speedup_column(b): float("nan") for b in COMPILE_BASELINES},  # verdicts made before baselines
}

BUILD_STATUSES = ("built", "cached", "no_build", "compile_error", "timeout", "runtime_error", "no_code", "rejected")
STATUSES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "no_code")
CATEGORIES = ("single_op", "fused", "model")

_PANDAS_TYPES = {"str": "string", "int": "int64", "float": "float64", "bool": "bool"}


class ContractError(ValueError):
    """A frame does not match its documented contract."""


def require_columns(frame: pd.DataFrame, columns, what: str, error: type[Exception] = ContractError) -> None:
    """Raise `error` naming `what` and every one of `columns` that `frame` lacks."""
    missing = [col for col in columns if col not in frame.columns]
    if missing:
        raise error(f"{what}: missing column(s) {', '.join(missing)}")


def conform(frame: pd.DataFrame, contract: dict[str, str], what: str = "frame") -> pd.DataFrame:
    """Return `frame` with exactly the contract's columns, in order and with the documented types; a column of
    `ABSENT_AS` that `frame` lacks is filled with its default."""
    absent = {col: ABSENT_AS[col] for col in contract if col in ABSENT_AS and col not in frame.columns}
    if absent:
        frame = frame.assign(**absent)
    require_columns(frame, contract, what)
    out = frame.loc[:, list(contract)].copy()
    for col, kind in contract.items():
        try:
            out[col] = out[col].astype(_PANDAS_TYPES[kind])
        except (TypeError, ValueError) as err:
            raise ContractError(f"{what}: column {col!r} is not {kind}: {err}") from None
    # arrow-backed strings round-trip through parquet; plain object columns are what downstream code expects
    for col, kind in contract.items():
        if kind == "str":
            out[col] = out[col].astype(object)
    return out.reset_index(drop=True)


def empty(contract: dict[str, str]) -> pd.DataFrame:
    """An empty frame with the contract's columns and types."""
    return conform(pd.DataFrame({col: [] for col in contract}), contract)

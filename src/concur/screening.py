"""Which candidates curation and analysis take, and which verdicts count as correct: one rule for both stages.

Every candidate is joined with its verdict (``concur.curate.join_candidates``), then `screen` sorts it, in this
order, into the first group that applies (docs/data.md sections 5 and 8):

``truncated``     its generation was cut at the token cap (candidates' ``truncated``): the reasoning is unfinished and
                  its length a floor. Left out unless the stage's ``include_truncated`` is set.
``no_reasoning``  no reasoning (empty, or ``reasoning_source`` ``none``) from a *reasoning generator*: a generator
                  any of whose candidates in the input has reasoning (``reasoning_source`` other than ``none``).
                  Its length is unknown, not 0. A generator that never writes reasoning is not held to this.
``untrusted``     its verdict is not ``trusted`` (a degenerate task: a trivial output passes the check), whatever
                  the verdict says.

Rows in none of these are *kept*: analysed, and the pool curation draws from. A kept row counts as correct by
`counts_as_correct`: a ``correct`` verdict on a candidate that has code (a verdict of correct on an empty program
is a mismatch of candidate and verdict, never a kernel). Kept rows without code are incorrect samples. Curation
then leaves out what is not correct, and reduced-precision kernels (a ``precision:`` flag) unless
``curate.allow_reduced_precision``: that is a choice of training data, not of correctness, so the analysis counts
those kernels as correct.

Candidate files written before ``reasoning_source``, ``code_source``, ``truncated``, ``truncation`` and
``tokenizer`` existed are read with `with_candidate_defaults`; verdict files without ``trusted`` or ``flags`` as
trusted and unflagged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

LEFT_OUT = ("truncated", "no_reasoning", "untrusted")
CANDIDATE_EXTRAS = ("reasoning_source", "code_source", "truncated", "truncation", "tokenizer")
VERDICT_EXTRAS = ("trusted", "flags")
REDUCED_PRECISION_FLAG = "precision:"
BEATS_ROOFLINE_FLAG = "timing:beats_roofline"


def blank(series: pd.Series) -> pd.Series:
    """Empty or whitespace only (missing values included)."""
    return series.fillna("").astype(str).str.strip() == ""


def with_candidate_defaults(candidates: pd.DataFrame) -> pd.DataFrame:
    """`candidates` with each of CANDIDATE_EXTRAS it lacks filled in the way an older file means it:
    reasoning_source ``tags`` where there is reasoning, else ``none``; code_source ``answer`` where there is code,
    else empty; not truncated; tokenizer unknown (empty)."""
    out = candidates.copy()
    if "reasoning_source" not in out.columns:
        out["reasoning_source"] = np.where(blank(out["reasoning"]), "none", "tags")
    if "code_source" not in out.columns:
        out["code_source"] = np.where(blank(out["code"]), "", "answer")
    if "truncated" not in out.columns:
        out["truncated"] = False
    if "truncation" not in out.columns:
        out["truncation"] = ""
    if "tokenizer" not in out.columns:
        out["tokenizer"] = ""
    out["truncated"] = out["truncated"].fillna(False).astype(bool)
    for column in ("reasoning_source", "code_source", "truncation", "tokenizer"):
        out[column] = out[column].fillna("").astype(str).astype(object)
    return out


def with_verdict_defaults(verdicts: pd.DataFrame) -> pd.DataFrame:
    """`verdicts` with ``trusted`` (true) and ``flags`` (empty) where the file has none."""
    out = verdicts.copy()
    out["trusted"] = out["trusted"].fillna(True).astype(bool) if "trusted" in out.columns else True
    out["flags"] = out["flags"].fillna("").astype(str).astype(object) if "flags" in out.columns else ""
    return out


def reasoning_generators(frame: pd.DataFrame) -> set[str]:
    """Generators any of whose candidates has reasoning (reasoning_source other than ``none``)."""
    has = frame["reasoning_source"] != "none"
    return set(frame.loc[has, "generator"])


def counts_as_correct(frame: pd.DataFrame) -> pd.Series:
    """THE correctness rule of curation and analysis: a trusted ``correct`` verdict on a candidate with code."""
    return frame["correct"].astype(bool) & frame["trusted"].astype(bool) & ~blank(frame["code"])


def reduced_precision(frame: pd.DataFrame) -> pd.Series:
    """Verdicts flagged ``precision:<name>`` (computed in fp16/bf16/TF32 where the reference is float32)."""
    return frame["flags"].fillna("").astype(str).str.contains(REDUCED_PRECISION_FLAG, regex=False)


def beats_roofline(frame: pd.DataFrame) -> pd.Series:
    """Verdicts flagged ``timing:beats_roofline``: timed quicker than writing their outputs once takes (a time that
    was not each call's work), so their speedup cannot be used."""
    return frame["flags"].fillna("").astype(str).str.contains(BEATS_ROOFLINE_FLAG, regex=False)


@dataclass
class Screened:
    kept: pd.DataFrame  # the rows analysed / curated from, with ``correct`` set by `counts_as_correct`
    counts: dict  # see `screen`


def screen(joined: pd.DataFrame, include_truncated: bool) -> Screened:
    """Sort the joined candidates (join_candidates' columns) into the LEFT_OUT groups and the kept rows.

    `counts` (JSON-ready): ``candidates`` (all rows), ``left_out`` (rows per LEFT_OUT reason, each row under its
    first reason), ``kept``, ``correct`` (kept rows that count as correct), ``no_code`` (kept rows without code,
    incorrect), ``correct_verdict_without_code`` (of those, verdicts that said correct), ``reduced_precision``
    (correct kept rows flagged precision:), ``truncated`` (``total``, ``reported``, ``detected`` over all rows,
    ``included``: include_truncated), ``reasoning_generators`` and ``tokenizers`` (generator -> the distinct
    ``tokenizer`` values of its candidates, empty meaning not recorded).
    """
    truncated = joined["truncated"].astype(bool)
    no_reasoning = joined["generator"].isin(reasoning_generators(joined)) & (
        blank(joined["reasoning"]) | (joined["reasoning_source"] == "none")
    )
    untrusted = ~joined["trusted"].astype(bool)
    reason = pd.Series("", index=joined.index, dtype=object)
    for name, hit in (("untrusted", untrusted), ("no_reasoning", no_reasoning)):
        reason = reason.mask(hit, name)
    if not include_truncated:
        reason = reason.mask(truncated, "truncated")

    kept = joined[reason == ""].copy()
    no_code = blank(kept["code"])
    verdict_correct = kept["correct"].astype(bool)
    kept["correct"] = counts_as_correct(kept)
    kept = kept.reset_index(drop=True)
    tokenizers = {
        str(gen): sorted(set(map(str, part))) for gen, part in joined.groupby("generator", sort=True)["tokenizer"]
    }
    counts = {
        "candidates": int(len(joined)),
        "left_out": {name: int((reason == name).sum()) for name in LEFT_OUT},
        "kept": int(len(kept)),
        "correct": int(kept["correct"].sum()),
        "no_code": int(no_code.sum()),
        "correct_verdict_without_code": int((no_code & verdict_correct).sum()),
        "reduced_precision": int((kept["correct"] & reduced_precision(kept)).sum()),
        "truncated": {
            "total": int(truncated.sum()),
            "reported": int((truncated & (joined["truncation"] == "reported")).sum()),
            "detected": int((truncated & (joined["truncation"] == "detected")).sum()),
            "included": bool(include_truncated),
        },
        "reasoning_generators": sorted(map(str, reasoning_generators(joined))),
        "tokenizers": tokenizers,
    }
    return Screened(kept=kept, counts=counts)

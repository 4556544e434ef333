"""Normalised code, duplicate hashes and the train/eval contamination report.

Similarity is the Jaccard index of token n-gram sets ("shingles") of the normalised code. Finding every train task
whose similarity to some eval task reaches the threshold would take millions of set comparisons at KernelBook scale,
so candidate pairs come from MinHash signatures split into LSH bands; each candidate's similarity is then computed
exactly. The bands are chosen so that a pair exactly at the threshold is found with probability >= 99.5% (higher
similarities more surely still).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re

import numpy as np
import pandas as pd

REPORT_COLUMNS = ["train_task_id", "eval_task_id", "similarity", "kind"]
NUM_PERM = 128
MIN_RECALL_AT_THRESHOLD = 0.995
_TOKEN = re.compile(r"\w+|[^\w\s]")


@functools.cache  # dedupe and the contamination report normalise the same programs
def normalise_code(code: str) -> str:
    """The program without comments, docstrings and formatting (unparsed AST); unparsable code only loses blanks."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return "\n".join(line.strip() for line in code.splitlines() if line.strip())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_hash(code: str) -> str:
    return hashlib.sha256(normalise_code(code).encode()).hexdigest()


def _has_docstring(node) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


class _Shingler:
    """Token n-grams as 64-bit hashes; tokens get ids from one shared vocabulary so equal n-grams hash equally."""

    def __init__(self, ngram: int):
        self.ngram = ngram
        self.vocab: dict[str, int] = {}

    def __call__(self, normalised: str) -> np.ndarray:
        ids = np.fromiter(
            (self.vocab.setdefault(t, len(self.vocab) + 1) for t in _TOKEN.findall(normalised)), dtype=np.uint64
        )
        n = min(self.ngram, len(ids))
        if n == 0:
            return np.zeros(1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            hashed = np.zeros(len(ids) - n + 1, dtype=np.uint64)
            for k in range(n):  # polynomial rolling hash, wrapping modulo 2**64
                hashed = hashed * np.uint64(1_000_003) + ids[k : len(ids) - n + 1 + k]
        return np.unique(hashed)


def _minhash(shingle_sets: list[np.ndarray], seed: int = 0) -> np.ndarray:
    """(n_docs, NUM_PERM) MinHash signatures with multiply-shift hashing, computed in chunks of documents."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, NUM_PERM, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)
    out = np.empty((len(shingle_sets), NUM_PERM), dtype=np.uint64)
    start = 0
    while start < len(shingle_sets):
        stop, size = start, 0
        while stop < len(shingle_sets) and (size < 40_000 or stop == start):
            size += len(shingle_sets[stop])
            stop += 1
        flat = np.concatenate(shingle_sets[start:stop])
        with np.errstate(over="ignore"):
            hashed = (flat[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)
        offsets = np.cumsum([0] + [len(s) for s in shingle_sets[start : stop - 1]])
        out[start:stop] = np.minimum.reduceat(hashed, offsets, axis=0)
        start = stop
    return out


def lsh_bands(threshold: float) -> tuple[int, int]:
    """(bands, rows): the most rows per band (fewest false candidates) that still find a pair at the threshold."""
    for rows in range(NUM_PERM, 0, -1):
        bands = NUM_PERM // rows
        if 1 - (1 - threshold**rows) ** bands >= MIN_RECALL_AT_THRESHOLD:
            return bands, rows
    return NUM_PERM, 1


def _band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n_docs, bands) one 64-bit key per band."""
    weights = np.arange(1, rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    shaped = signatures[:, : bands * rows].reshape(len(signatures), bands, rows)
    with np.errstate(over="ignore"):
        return (shaped * weights).sum(axis=2, dtype=np.uint64)


def _candidate_pairs(train_keys: np.ndarray, eval_keys: np.ndarray) -> set[tuple[int, int]]:
    pairs = set()
    for band in range(train_keys.shape[1]):
        index: dict[int, list[int]] = {}
        for j, key in enumerate(eval_keys[:, band].tolist()):
            index.setdefault(key, []).append(j)
        hits = np.flatnonzero(np.isin(train_keys[:, band], eval_keys[:, band]))
        for i in hits.tolist():
            pairs.update((i, j) for j in index[int(train_keys[i, band])])
    return pairs


def contamination_report(train: pd.DataFrame, eval_: pd.DataFrame, threshold: float, ngram: int) -> pd.DataFrame:
    """Every (train, eval) pair with equal normalised code (`exact`) or shingle Jaccard >= threshold (`near`)."""
    if train.empty or eval_.empty:
        return pd.DataFrame(columns=REPORT_COLUMNS)
    train_norm = [normalise_code(c) for c in train["code"]]
    eval_norm = [normalise_code(c) for c in eval_["code"]]
    shingle = _Shingler(ngram)
    train_sets, eval_sets = [shingle(c) for c in train_norm], [shingle(c) for c in eval_norm]
    bands, rows = lsh_bands(threshold)
    train_keys = _band_keys(_minhash(train_sets), bands, rows)
    eval_keys = _band_keys(_minhash(eval_sets), bands, rows)
    eval_by_text: dict[str, list[int]] = {}
    for j, text in enumerate(eval_norm):
        eval_by_text.setdefault(text, []).append(j)
    exact = {(i, j) for i, text in enumerate(train_norm) for j in eval_by_text.get(text, [])}
    records = []
    for i, j in sorted(_candidate_pairs(train_keys, eval_keys) | exact):
        if (i, j) in exact:
            records.append((i, j, 1.0, "exact"))
            continue
        a, b = set(train_sets[i].tolist()), set(eval_sets[j].tolist())
        similarity = len(a & b) / len(a | b)
        if similarity >= threshold:
            records.append((i, j, round(similarity, 4), "near"))
    train_ids, eval_ids = train["task_id"].tolist(), eval_["task_id"].tolist()
    report = pd.DataFrame([(train_ids[i], eval_ids[j], s, k) for i, j, s, k in records], columns=REPORT_COLUMNS)
    return report.sort_values(
        ["train_task_id", "similarity", "eval_task_id"], ascending=[True, False, True], ignore_index=True
    )

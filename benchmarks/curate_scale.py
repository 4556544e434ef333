"""Curation and analysis at the paper's scale (target: both together in <= 20 s on 2 cores).

Builds a synthetic synthesis run shaped like the paper's: 18,162 KernelBook-sized tasks x 5 candidates = 90,810
candidates, written as `--shards` parquet shards of candidates and verdicts (contracts 3 and 4 of docs/data.md), a
tasks table (contract 1) and a small evaluation score table; then times the two stages' own entry points,
`concur.curate.run` and `concur.analyze.run` (parquet in, every output and figure written), each separately and
both in a row, in this process after the imports (whose time is printed too).

The synthetic table: categories single_op / fused / model in 35/50/15 %, levels 1/2/3 from the category; a task
difficulty drawn per task and reasoning lengths lognormal around it (median about 5,000 tokens, clipped to 64 ..
20,000); about one candidate in three correct, less often for long reasoning and on hard tasks; correct kernels'
speedups lognormal (median about 0.8, a few above 5), incorrect ones 0 with a failure status. Text columns are
short (`--text-chars`): the timed work is the tables' logic and I/O, not megabytes of real reasoning traces.

    .venv/bin/python benchmarks/curate_scale.py [--tasks 18162] [--per-task 5] [--repeats 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 20.0
PAPER_TASKS = 18162
CATEGORY_SHARES = (0.35, 0.50, 0.15)
FAILURES = ("incorrect", "compile_error", "runtime_error", "timeout", "rejected", "no_code")
FAILURE_SHARES = (0.45, 0.25, 0.15, 0.03, 0.07, 0.05)
MAX_TOKENS = 20000


def _ids(prefix: str, n: int) -> list[str]:
    return [hashlib.sha256(f"{prefix}\x1f{i}".encode()).hexdigest()[:16] for i in range(n)]


def synthetic_tables(
    n_tasks: int = PAPER_TASKS, per_task: int = 5, seed: int = 0, text_chars: int = 256
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(candidates, verdicts, tasks) in the workflow's contracts, `n_tasks * per_task` candidates."""
    from concur import contracts

    rng = np.random.default_rng(seed)
    n = n_tasks * per_task
    task_ids = np.array([f"kernelbook/{i:06d}" for i in range(n_tasks)], dtype=object)
    category = rng.choice(np.array(contracts.CATEGORIES, dtype=object), size=n_tasks, p=CATEGORY_SHARES)
    level = np.select([category == "single_op", category == "fused"], [1, 2], 3)
    tasks = pd.DataFrame(
        {
            "task_id": task_ids,
            "split": "train",
            "suite": "kernelbook",
            "level": level,
            "name": [f"Module{i}" for i in range(n_tasks)],
            "code": "class Model: ...",
            "category": category,
            "n_ops": rng.integers(1, 30, size=n_tasks),
            "origin": "synthetic",
        }
    )

    # task difficulty drives both the lengths and the success rate, as in the paper's data
    hardness = rng.normal(0.0, 1.0, size=n_tasks)
    hardness += np.select([category == "single_op", category == "fused"], [-0.3, 0.0], 0.5)
    task_of = np.repeat(np.arange(n_tasks), per_task)
    log_len = np.log(5000) + 0.45 * hardness[task_of] + rng.normal(0.0, 0.35, size=n)
    tokens = np.clip(np.rint(np.exp(log_len)), 64, MAX_TOKENS).astype(np.int64)
    logit = 0.05 - 0.18 * (tokens / 1000.0) - 0.8 * hardness[task_of] + rng.normal(0.0, 0.5, size=n)
    correct = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    speedup = np.where(correct, np.exp(rng.normal(-0.2, 0.7, size=n)), 0.0)
    status = np.where(correct, "correct", rng.choice(np.array(FAILURES, dtype=object), size=n, p=FAILURE_SHARES))

    candidate_ids = _ids("synthetic", n)
    filler = "x" * max(0, text_chars - 24)
    reasoning = [f"think {cid} {filler}" for cid in candidate_ids]
    candidates = pd.DataFrame(
        {
            "candidate_id": candidate_ids,
            "task_id": task_ids[task_of],
            "sample_idx": np.tile(np.arange(per_task), n_tasks),
            "generator": "synthetic-teacher",
            "backend": "replay",
            "prompt": [f"prompt {t} {filler}" for t in task_ids[task_of]],
            "response": reasoning,
            "reasoning": reasoning,
            "answer": [f"answer {cid} {filler}" for cid in candidate_ids],
            "code": [f"# code {cid}\n{filler}" for cid in candidate_ids],
            "reasoning_tokens": tokens,
            "completion_tokens": tokens + 600,
            "finish_reason": "stop",
            "seed": 0,
            "reasoning_source": "tags",
            "code_source": "answer",
            "truncated": False,
            "truncation": "",
            "tokenizer": "synthetic",
        }
    )
    ref_ms = np.exp(rng.normal(0.0, 1.0, size=n))
    new_ms = np.where(correct, ref_ms / np.where(correct, speedup, 1.0), np.nan)
    verdicts = pd.DataFrame(
        {
            "candidate_id": candidate_ids,
            "task_id": task_ids[task_of],
            "status": status,
            "reason": np.where(correct, "", "trial 0: value_mismatch"),
            "compiled": ~np.isin(status, ["compile_error", "no_code"]),
            "correct": correct,
            "ref_ms": ref_ms,
            "new_ms": new_ms,
            "ref_median_ms": ref_ms,
            "new_median_ms": new_ms,
            "ref_best_ms": ref_ms,
            "new_best_ms": new_ms,
            "speedup": speedup,
            "max_abs_err": np.where(correct, 1e-4, 1.0),
            "device": "cuda:NVIDIA H100",
            "verify_mode": "hardened",
            "compile_s": 15.0,
            "eval_s": 2.0,
            "flags": "",
            "trusted": True,
        }
    )
    return (
        contracts.conform(candidates, contracts.CANDIDATES, "synthetic candidates"),
        contracts.conform(verdicts, contracts.VERDICTS, "synthetic verdicts"),
        contracts.conform(tasks, contracts.TASKS, "synthetic tasks"),
    )


def synthetic_scores(n_tasks: int = 250, samples: int = 10, seed: int = 1) -> pd.DataFrame:
    """A KernelBench-sized evaluation (levels 1 and 2; base, five adapters) scored by concur.evaluate."""
    from concur.evaluate import score

    rng = np.random.default_rng(seed)
    tasks = pd.DataFrame(
        {
            "task_id": [f"kernelbench/L{1 + i % 2}/{i}" for i in range(n_tasks)],
            "level": [1 + i % 2 for i in range(n_tasks)],
            "category": ["single_op" if i % 2 == 0 else "fused" for i in range(n_tasks)],
        }
    )
    difficulty = pd.DataFrame(
        {"task_id": tasks["task_id"], "difficulty": rng.choice(["Easy", "Medium", "Hard"], size=n_tasks)}
    )
    verdicts = {}
    for model, rate in (
        ("base", 0.18),
        ("concur", 0.58),
        ("min", 0.5),
        ("max", 0.3),
        ("speedup", 0.45),
        ("random", 0.4),
    ):
        n = n_tasks * samples
        ok = rng.random(n) < rate
        verdicts[model] = pd.DataFrame(
            {
                "task_id": np.repeat(tasks["task_id"].to_numpy(), samples),
                "correct": ok,
                "speedup": np.where(ok, np.exp(rng.normal(-0.2, 0.6, size=n)), 0.0),
            }
        )
    return score(verdicts, tasks, {"pass_k": [1, 10], "fast_p": [0, 1]}, difficulty)


def write_inputs(folder: Path, n_tasks: int, per_task: int, shards: int, text_chars: int) -> dict:
    """The synthetic run as the workflow leaves it before curation: shards, tasks table, scores.csv."""
    from concur.io import write_parquet
    from concur.tasks import shard_of

    candidates, verdicts, tasks = synthetic_tables(n_tasks, per_task, text_chars=text_chars)
    shard = np.array([shard_of(t, shards) for t in tasks["task_id"]])
    shard_by_task = dict(zip(tasks["task_id"], shard))
    cand_shard = candidates["task_id"].map(shard_by_task).to_numpy()
    paths = {"candidates": [], "verified": []}
    for i in range(shards):
        for kind, frame in (("candidates", candidates), ("verified", verdicts)):
            path = folder / kind / f"shard-{i}.parquet"
            write_parquet(frame[cand_shard == i], path)
            paths[kind].append(path)
    paths["tasks"] = folder / "tasks" / "train.parquet"
    write_parquet(tasks, paths["tasks"])
    paths["scores"] = folder / "eval" / "scores.csv"
    paths["scores"].parent.mkdir(parents=True, exist_ok=True)
    synthetic_scores().to_csv(paths["scores"], index=False)
    paths["n_candidates"] = len(candidates)
    paths["n_correct"] = int(verdicts["correct"].sum())
    return paths


def run_curate(inputs: dict, out: Path) -> None:
    from concur.curate import run

    outputs = SimpleNamespace(
        dataset=out / "dataset" / "concur.parquet",
        sft=out / "dataset" / "concur_sft.jsonl",
        card=out / "dataset" / "card.md",
        subsets=[out / "dataset" / "subsets" / f"{name}.parquet" for name in ("min", "max", "speedup", "random")],
    )
    run(
        inputs["candidates"],
        inputs["verified"],
        inputs["tasks"],
        {
            "selection": "strict",
            "speedup_threshold": 5.0,
            "single_op_share": 0.3,
            "ablations": ["min", "max", "speedup", "random"],
            "seed": 0,
        },
        outputs,
    )


def run_analyze(inputs: dict, out: Path) -> None:
    from concur.analyze import FIGURES, run

    run(
        inputs["candidates"],
        inputs["verified"],
        inputs["tasks"],
        inputs["scores"],
        {"bin_width": 512, "easy_below": 4000, "hard_above": 8500},
        out / "analysis" / "summary.json",
        [out / "figures" / name for name in FIGURES],
    )


def measure(inputs: dict, out: Path, repeats: int) -> dict[str, float]:
    """Median seconds of curate, analyze and both in a row."""
    times: dict[str, list[float]] = {"curate": [], "analyze": [], "together": []}
    for _ in range(repeats):
        start = time.perf_counter()
        run_curate(inputs, out / "alone")
        times["curate"].append(time.perf_counter() - start)
        start = time.perf_counter()
        run_analyze(inputs, out / "alone")
        times["analyze"].append(time.perf_counter() - start)
        start = time.perf_counter()
        run_curate(inputs, out / "together")
        run_analyze(inputs, out / "together")
        times["together"].append(time.perf_counter() - start)
    return {stage: statistics.median(values) for stage, values in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=PAPER_TASKS, help="synthetic tasks (the paper: 18,162)")
    parser.add_argument("--per-task", type=int, default=5, help="candidates per task (the paper: 5)")
    parser.add_argument("--shards", type=int, default=64, help="parquet shards (configs/paper.yaml: 64)")
    parser.add_argument("--text-chars", type=int, default=256, help="length of each text column's values")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs; the median is printed")
    parser.add_argument("--keep", type=Path, help="write inputs and outputs here instead of a temporary folder")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))

    start = time.perf_counter()
    import concur.analyze  # noqa: F401  (pandas, scipy, matplotlib)
    import concur.curate  # noqa: F401

    import_s = time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="concur-scale-") as tmp:
        folder = args.keep or Path(tmp)
        start = time.perf_counter()
        inputs = write_inputs(folder / "inputs", args.tasks, args.per_task, args.shards, args.text_chars)
        setup_s = time.perf_counter() - start
        seconds = measure(inputs, folder / "outputs", args.repeats)

    n = inputs["n_candidates"]
    print(
        f"\nsynthetic run: {args.tasks} tasks x {args.per_task} = {n} candidates "
        f"({inputs['n_correct']} correct, {inputs['n_correct'] / max(n, 1):.1%}), {args.shards} shards; "
        f"inputs written in {setup_s:.1f} s; imports {import_s:.1f} s (not in the times below)"
    )
    print(f"\n{'stage (parquet in, outputs written)':<48} {'candidates':>10} {'seconds':>8} {'target s':>9}")
    print(f"{'curate (concur.curate.run)':<48} {n:>10} {seconds['curate']:>8.2f} {'':>9}")
    print(f"{'analyze (concur.analyze.run, figures included)':<48} {n:>10} {seconds['analyze']:>8.2f} {'':>9}")
    verdict = "met" if seconds["together"] <= TARGET_S else "MISSED"
    print(
        f"{'curate + analyze, one after the other':<48} {n:>10} {seconds['together']:>8.2f} {TARGET_S:>9.0f}  {verdict}"
    )
    return {**seconds, "n_candidates": n, "n_correct": inputs["n_correct"]}


if __name__ == "__main__":
    main()

"""How a synthesis run's responses were read, and the paper's length analysis on them, beside the paper's numbers.

Takes a candidates table (what `concur synthesize` wrote, e.g. from a replay of an imported KernelBench run) and
prints, as tables:

1. reading: samples, the share with a reasoning split (by `reasoning_source`), with a program (by `code_source`),
   truncated (reported / detected), and the tokenizer that counted;
2. for each set of verdicts given (ours: `--verified`, any subset of the candidates; the run's own:
   `--recorded`, the `.recorded.csv` of `concur import-kernelbench`, used only here, for comparison): the median
   reasoning length of correct and incorrect samples, accuracy by reasoning length, and the ARL split into
   Easy / Medium / Hard, each computed by `concur.analyze` with its defaults (truncated samples left out), with
   the paper's numbers beside them.

    python benchmarks/reasoning_lengths.py --candidates C.parquet --tasks T.parquet \
        [--verified V.parquet ...] [--recorded R.recorded.csv] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from concur import analyze, config, contracts

# ConCuR (Kong et al., 2025), QwQ-32B on KernelBook/KernelBench: about 6K tokens of reasoning for correct samples
# against 8K for incorrect ones; accuracy about 0.65 in the shortest length bin, about 0.04 in the longest; ARL
# split of 200 tasks 37 / 114 / 49 (Easy / Medium / Hard, at 4,000 and 8,500 tokens)
PAPER = {"median_correct": 6000, "median_incorrect": 8000, "acc_shortest": 0.65, "acc_longest": 0.04}
PAPER_SPLIT = {"Easy": 37, "Medium": 114, "Hard": 49}
LENGTH_BINS = (0, 2000, 4000, 6000, 8000, 10000, 12000, 10**9)


def share(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.1f}%)" if whole else "0"


def reading_table(candidates: pd.DataFrame) -> list[str]:
    n = len(candidates)
    answered = candidates[(candidates["response"].str.strip() != "") | (candidates["reasoning"].str.strip() != "")]
    split = answered[answered["reasoning_source"] != "none"]
    rows = [
        ("samples", str(n)),
        ("non-empty responses", share(len(answered), n)),
        ("with a reasoning split (of non-empty)", share(len(split), len(answered))),
    ]
    for source, count in answered["reasoning_source"].value_counts().items():
        rows.append((f"  reasoning_source {source}", share(int(count), len(answered))))
    with_code = candidates[candidates["code"] != ""]
    rows.append(("with a program", share(len(with_code), n)))
    for source, count in with_code["code_source"].value_counts().items():
        rows.append((f"  found in the {source}", share(int(count), n)))
    truncated = candidates[candidates["truncated"]]
    rows.append(("truncated", share(len(truncated), n)))
    for kind, count in truncated["truncation"].value_counts().items():
        rows.append((f"  {kind}", share(int(count), n)))
    rows.append(("  truncated with a program (a draft)", share(int((truncated["code"] != "").sum()), n)))
    rows.append(("tokenizer", "; ".join(sorted(set(candidates["tokenizer"])))))
    rows.append(("reasoning tokens, median (all samples)", f"{candidates['reasoning_tokens'].median():.0f}"))
    return ["| reading | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]


def recorded_verdicts(candidates: pd.DataFrame, recorded_path: Path) -> pd.DataFrame:
    """The run's own verdicts in the verdicts contract's shape (correct only; no times, nothing flagged)."""
    recorded = pd.read_csv(recorded_path)
    joined = candidates[["candidate_id", "task_id", "sample_idx"]].merge(
        recorded[["task_id", "sample_idx", "correct"]], on=["task_id", "sample_idx"], how="inner"
    )
    correct = joined["correct"].fillna(False).astype(bool)
    return pd.DataFrame(
        {
            "candidate_id": joined["candidate_id"],
            "task_id": joined["task_id"],
            "status": correct.map({True: "correct", False: "incorrect"}),
            "correct": correct,
            "speedup": float("nan"),
            "trusted": True,
            "flags": "",
        }
    )


def length_analysis(candidates: pd.DataFrame, verdicts: pd.DataFrame, tasks: pd.DataFrame) -> dict:
    judged = candidates[candidates["candidate_id"].isin(set(verdicts["candidate_id"]))]
    settings = config.with_defaults("analyze", {})
    with tempfile.TemporaryDirectory() as figures:
        summary = analyze.analyze(judged, verdicts, tasks, None, settings, Path(figures))
    return summary


def coarse_bins(summary_bins: list[dict]) -> list[tuple[str, int, float | None]]:
    """The analysis's bins merged into LENGTH_BINS (tokens), for a table that fits a page."""
    out = []
    for lo, hi in zip(LENGTH_BINS, LENGTH_BINS[1:]):
        inside = [b for b in summary_bins if lo <= b["lo"] < hi]
        n, hits = sum(b["count"] for b in inside), sum(b["n_correct"] for b in inside)
        label = f"{lo // 1000}K+" if hi == LENGTH_BINS[-1] else f"{lo // 1000}-{hi // 1000}K"
        out.append((label, n, hits / n if n else None))
    return out


def analysis_table(name: str, summary: dict) -> list[str]:
    lengths = summary["length_by_correctness"]
    counts = summary["difficulty_counts"]
    bins = [b for b in coarse_bins(summary["accuracy_by_length"]) if b[1]]

    def fmt(value) -> str:
        return "n/a" if value is None else f"{value:.0f}" if value > 1 else f"{value:.2f}"

    lines = [
        f"### {name}",
        "",
        f"{summary['n_candidates']} samples analysed ({summary['screening']['left_out']} left out), "
        f"{summary['n_correct']} correct, {summary['n_tasks']} tasks",
        "",
        "| measure | this run | paper |",
        "|---|---:|---:|",
        f"| median reasoning tokens, correct | {fmt(lengths['correct']['median'])} | ≈{PAPER['median_correct']} |",
        f"| median reasoning tokens, incorrect | {fmt(lengths['incorrect']['median'])} | "
        f"≈{PAPER['median_incorrect']} |",
        f"| accuracy, shortest bin ({bins[0][0] if bins else '-'}) | {fmt(bins[0][2] if bins else None)} | "
        f"≈{PAPER['acc_shortest']} |",
        f"| accuracy, longest bin ({bins[-1][0] if bins else '-'}) | {fmt(bins[-1][2] if bins else None)} | "
        f"≈{PAPER['acc_longest']} |",
        f"| ARL split Easy / Medium / Hard | {counts['Easy']} / {counts['Medium']} / {counts['Hard']} | "
        f"{PAPER_SPLIT['Easy']} / {PAPER_SPLIT['Medium']} / {PAPER_SPLIT['Hard']} |",
        "",
        "| reasoning tokens | samples | accuracy |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {n} | {fmt(acc)} |" for label, n, acc in bins]
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", nargs="+", required=True, type=Path)
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--verified", nargs="*", default=[], type=Path, help="our verdicts (any subset)")
    parser.add_argument("--recorded", type=Path, help="the imported run's .recorded.csv (for comparison only)")
    parser.add_argument("--json", type=Path, help="also write every number printed, as JSON")
    args = parser.parse_args(argv)

    candidates = pd.concat([pd.read_parquet(p) for p in args.candidates], ignore_index=True)
    contracts.require_columns(candidates, contracts.CANDIDATES, "candidates")
    tasks = pd.read_parquet(args.tasks)
    lines = ["## Reading the responses", ""] + reading_table(candidates) + [""]
    results = {}
    if args.verified:
        ours = pd.concat([pd.read_parquet(p) for p in args.verified], ignore_index=True)
        results["ours"] = length_analysis(candidates, ours, tasks)
        lines += analysis_table("Our verdicts", results["ours"])
    if args.recorded:
        results["recorded"] = length_analysis(candidates, recorded_verdicts(candidates, args.recorded), tasks)
        lines += analysis_table("The run's recorded verdicts (comparison only)", results["recorded"])
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

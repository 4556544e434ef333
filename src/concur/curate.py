"""ConCuR curation: pick correct kernels with concise reasoning (contract 5 of docs/data.md).

"Correct kernels" below are the *eligible* candidates: `concur.screening.screen` leaves out truncated samples
(unless ``include_truncated``), reasoning generators' samples without reasoning and untrusted verdicts, and counts
as correct a trusted ``correct`` verdict on a candidate with code (the rule the analysis uses too); curation also
leaves out reduced-precision kernels unless ``allow_reduced_precision``. The card counts every candidate under
the first of these that applies.

Criteria, applied in order; a candidate is admitted once, tagged with the first criterion that takes it:

(a) ``shortest_fastest`` -- per task, among its correct kernels, the one that is both the fastest (largest
    speedup) and has the shortest reasoning (fewest reasoning tokens).
    * ``strict``: if no kernel is both, the task contributes nothing to (a). When several kernels are equal on
      both counts, the smallest candidate_id is taken.
    * ``fastest_then_shortest``: the fastest kernel; ties in speedup go to the shortest reasoning, then to the
      smallest candidate_id.
    Speedups are measured floats and count as equal only when exactly equal.
(b) ``high_speedup`` -- every correct kernel with speedup > ``speedup_threshold``.
(c) ``single_op_balance`` -- while single_op rows / all rows < ``single_op_share``, add one more correct
    single_op kernel: first from tasks not yet in the dataset, then by shortest reasoning, then candidate_id.

Ablation subsets (``min``, ``max``, ``speedup``, ``random``) have the dataset's size (capped at the number of
eligible candidates) and are drawn from all eligible candidates; ties are broken by candidate_id.

Turns: with refinement (synthesize.turns > 1) every turn's version is a candidate of its task, so the criteria pick
across turns. ``records`` says what a picked version is trained on: ``single_turn``, the task's prompt and the
version's reasoning and answer; ``multi_turn``, its trajectory's chat (each earlier turn's user message and answer
without reasoning, then its own user message: the verifier's feedback) before its reasoning and answer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from concur import config, contracts, screening
from concur.io import read_parquets, write_jsonl, write_parquet, write_text

CRITERIA = ("shortest_fastest", "high_speedup", "single_op_balance")
ABLATIONS = ("min", "max", "speedup", "random")
SELECTIONS = ("strict", "fastest_then_shortest")
RECORDS = ("single_turn", "multi_turn")
log = logging.getLogger(__name__)

TIE_RULE = (
    "Ties: among kernels equal on the deciding keys the smallest candidate_id wins; speedups are equal only "
    "when exactly equal."
)

_CANDIDATE_COLUMNS = (
    "candidate_id",
    "task_id",
    "generator",
    "prompt",
    "reasoning",
    "answer",
    "code",
    "reasoning_tokens",
)
_TRAJECTORY_COLUMNS = ("turn", "parent_id")  # turn 1 and no parent where a file has none
_VERDICT_COLUMNS = ("candidate_id", "task_id", "correct", "speedup")
_TASK_COLUMNS = ("task_id", "name", "category", "level")


@dataclass
class Curated:
    dataset: pd.DataFrame
    subsets: dict[str, pd.DataFrame] = field(default_factory=dict)
    sft: list[dict] = field(default_factory=list)
    card: str = ""
    counts: dict = field(default_factory=dict)  # screening.screen's counts plus incorrect, eligible and
    # reduced_precision_left_out: how every candidate was sorted (the card's "Candidates" table)


def _require_unique(frame: pd.DataFrame, column: str, what: str) -> None:
    dup = frame[column][frame[column].duplicated()]
    if len(dup):
        raise ValueError(f"{what}: duplicate {column} {dup.iloc[0]!r}")


def over_baseline(verdicts: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """`verdicts` whose `speedup` is over `baseline` (curate.baseline): eager's own, or that baseline's column, which
    the verify step must have timed (verify.baselines)."""
    column = contracts.speedup_column(baseline)
    if column == "speedup":
        return verdicts
    if column not in verdicts.columns or verdicts[column].isna().all():
        raise ValueError(f"curate.baseline is {baseline!r} but no verdict has {column} (add it to verify.baselines)")
    return verdicts.assign(speedup=verdicts[column])


def join_candidates(candidates: pd.DataFrame, verdicts: pd.DataFrame, tasks: pd.DataFrame) -> pd.DataFrame:
    """One row per candidate with its verdict (correct, speedup, trusted, flags) and its task (name, category,
    level), the candidates' reading and truncation columns included (filled in for older files: concur.screening).
    `correct` is still the verdict's own; `concur.screening.screen` decides what counts as correct.

    Every candidate needs exactly one verdict with the same task_id, and every task_id must be in `tasks`.
    """
    contracts.require_columns(candidates, _CANDIDATE_COLUMNS, "candidates")
    contracts.require_columns(verdicts, _VERDICT_COLUMNS, "verdicts")
    contracts.require_columns(tasks, _TASK_COLUMNS, "tasks")
    _require_unique(candidates, "candidate_id", "candidates")
    _require_unique(verdicts, "candidate_id", "verdicts")
    _require_unique(tasks, "task_id", "tasks")

    cand = screening.with_candidate_defaults(candidates)
    cand = cand.assign(**{c: contracts.ABSENT_AS[c] for c in _TRAJECTORY_COLUMNS if c not in cand.columns})
    cand = cand.loc[:, [*_CANDIDATE_COLUMNS, *_TRAJECTORY_COLUMNS, *screening.CANDIDATE_EXTRAS]]
    verd = screening.with_verdict_defaults(verdicts).loc[:, [*_VERDICT_COLUMNS, *screening.VERDICT_EXTRAS]]
    verd = verd.rename(columns={"task_id": "verdict_task_id"})
    merged = cand.merge(verd, on="candidate_id", how="outer", indicator=True)
    orphans = merged[merged["_merge"] != "both"]
    if len(orphans):
        row = orphans.iloc[0]
        side = "no verdict" if row["_merge"] == "left_only" else "a verdict but no candidate row"
        raise ValueError(f"candidate {row['candidate_id']!r} has {side}")
    clash = merged[merged["task_id"] != merged["verdict_task_id"]]
    if len(clash):
        row = clash.iloc[0]
        raise ValueError(
            f"candidate {row['candidate_id']!r}: candidate task_id {row['task_id']!r} != "
            f"verdict task_id {row['verdict_task_id']!r}"
        )
    unknown = sorted(set(merged["task_id"]) - set(tasks["task_id"]))
    if unknown:
        raise ValueError(f"candidates refer to task_id {unknown[0]!r}, which is not in the tasks table")

    merged = merged.drop(columns=["_merge", "verdict_task_id"])
    merged = merged.merge(tasks.loc[:, list(_TASK_COLUMNS)], on="task_id", how="left")
    merged["correct"] = merged["correct"].astype(bool)
    merged["trusted"] = merged["trusted"].astype(bool)
    merged["truncated"] = merged["truncated"].astype(bool)
    merged["speedup"] = merged["speedup"].astype(float)
    merged["reasoning_tokens"] = merged["reasoning_tokens"].astype("int64")
    merged["turn"] = merged["turn"].astype("int64")
    merged["parent_id"] = merged["parent_id"].fillna("").astype(str).astype(object)
    return merged.sort_values("candidate_id", kind="stable").reset_index(drop=True)


def _speed_key(frame: pd.DataFrame) -> pd.Series:
    """Speedup for ranking: an unmeasured (NaN) speedup ranks below every measured one."""
    return frame["speedup"].fillna(-np.inf)


def select_shortest_fastest(correct: pd.DataFrame, selection: str) -> list[str]:
    """Criterion (a): candidate ids, one per task at most, in task_id order (whole-column groupby, no per-task
    Python)."""
    if selection not in SELECTIONS:
        raise ValueError(f"curate.selection: {selection!r} is not one of {', '.join(SELECTIONS)}")
    if correct.empty:
        return []
    speed = _speed_key(correct)
    tokens = correct["reasoning_tokens"]
    if selection == "strict":
        by_task = correct["task_id"]
        both = (speed == speed.groupby(by_task).transform("max")) & (tokens == tokens.groupby(by_task).transform("min"))
        picked = correct.loc[both, ["task_id", "candidate_id"]].groupby("task_id", sort=True)["candidate_id"].min()
        return list(picked)
    ranked = pd.DataFrame(
        {"task_id": correct["task_id"], "neg_speed": -speed, "tokens": tokens, "candidate_id": correct["candidate_id"]}
    )
    ranked = ranked.sort_values(["task_id", "neg_speed", "tokens", "candidate_id"], kind="stable")
    return list(ranked.drop_duplicates("task_id")["candidate_id"])


def select_high_speedup(correct: pd.DataFrame, threshold: float, taken: set[str]) -> list[str]:
    """Criterion (b): every correct kernel faster than `threshold`, not already taken, in candidate_id order."""
    fast = correct[(correct["speedup"] > threshold) & ~correct["candidate_id"].isin(taken)]
    return list(fast["candidate_id"])


def select_single_op_balance(correct: pd.DataFrame, admitted: pd.DataFrame, share: float) -> list[str]:
    """Criterion (c): single_op kernels added one by one until single_op rows / all rows >= `share`."""
    pool = correct[(correct["category"] == "single_op") & ~correct["candidate_id"].isin(set(admitted["candidate_id"]))]
    pool = pool.sort_values(["reasoning_tokens", "candidate_id"], kind="stable")
    # Greedy order: each unrepresented task's best kernel (best first), then everything else by the same key.
    represented = set(admitted["task_id"])
    firsts = pool[~pool["task_id"].isin(represented)].drop_duplicates("task_id")
    first_ids = set(firsts["candidate_id"])
    order = list(firsts["candidate_id"]) + [c for c in pool["candidate_id"] if c not in first_ids]

    singles = int((admitted["category"] == "single_op").sum())
    total = len(admitted)
    chosen = []
    for cid in order:
        if share <= 0 or (total and singles / total >= share):
            break
        chosen.append(cid)
        singles += 1
        total += 1
    return chosen


def _rows(correct: pd.DataFrame, ids: list[str], criterion: str) -> pd.DataFrame:
    by_id = correct.set_index("candidate_id", drop=False)
    return by_id.loc[ids].assign(criterion=criterion).reset_index(drop=True)


def _ablation(correct: pd.DataFrame, name: str, size: int, seed: int) -> pd.DataFrame:
    pool = correct.sort_values("candidate_id", kind="stable").reset_index(drop=True)
    size = min(size, len(pool))
    if name == "min":
        ordered = pool.sort_values("reasoning_tokens", kind="stable")
    elif name == "max":
        ordered = pool.sort_values("reasoning_tokens", ascending=False, kind="stable")
    elif name == "speedup":
        ordered = pool.assign(_neg=-_speed_key(pool)).sort_values("_neg", kind="stable")
    elif name == "random":
        picks = np.random.default_rng(seed).choice(len(pool), size=size, replace=False) if size else []
        ordered = pool.iloc[list(picks)]
    else:
        raise ValueError(f"curate.ablations: unknown subset {name!r} (known: {', '.join(ABLATIONS)})")
    subset = ordered.head(size).assign(criterion=name)
    return contracts.conform(subset, contracts.DATASET, f"subset {name}")


def _check_rows(table: pd.DataFrame, reasoning_generators: set[str], what: str) -> None:
    """The guard screening promises, checked on what is written: every row has code, and reasoning when its
    generator is a reasoning generator."""
    no_reasoning = screening.blank(table["reasoning"]) & table["generator"].isin(reasoning_generators)
    bad = table[screening.blank(table["code"]) | no_reasoning]
    if len(bad):
        raise AssertionError(f"curate: {what} row {bad['candidate_id'].iloc[0]!r} has no code or no reasoning")


def sft_record(row) -> dict:
    """One chat-format training record (docs/data.md, concur_sft.jsonl) from a dataset row or dict: its `history`
    (the earlier turns of a multi-turn record; none in older tables), the user's `prompt`, the assistant's reasoning
    and answer."""
    assistant = f"<think>\n{row['reasoning']}\n</think>\n\n{row['answer']}"
    history = row.get("history") if hasattr(row, "get") else None
    return {
        "candidate_id": str(row["candidate_id"]),
        "task_id": str(row["task_id"]),
        "messages": [
            *(json.loads(history) if isinstance(history, str) and history else []),
            {"role": "user", "content": str(row["prompt"])},
            {"role": "assistant", "content": assistant},
        ],
    }


def with_records(table: pd.DataFrame, candidates: dict[str, dict], records: str) -> pd.DataFrame:
    """`table` (dataset rows) with each row's `prompt` and `history` as `records` has them: single_turn, the prompt
    of its trajectory's first turn (the task's) and no history; multi_turn, its own prompt after the chat of its
    trajectory's earlier versions (`feedback.trajectory_messages`). `candidates` holds every candidate by id."""
    from concur.feedback import chain_of, trajectory_messages

    if records not in RECORDS:
        raise ValueError(f"curate.records: {records!r} is not one of {', '.join(RECORDS)}")
    prompts, histories = [], []
    for cid, prompt in zip(table["candidate_id"], table["prompt"]):
        chain = chain_of(cid, candidates)
        if records == "single_turn":
            prompts.append(str(chain[0]["prompt"]))
            histories.append("[]")
        else:
            prompts.append(prompt)
            histories.append(json.dumps(trajectory_messages(chain[:-1]), ensure_ascii=False))
    return table.assign(prompt=pd.Series(prompts, index=table.index, dtype=object),
                        history=pd.Series(histories, index=table.index, dtype=object))  # fmt: skip


def curate(candidates: pd.DataFrame, verdicts: pd.DataFrame, tasks: pd.DataFrame, settings: dict) -> Curated:
    """Build the ConCuR dataset, its ablation subsets, the SFT records and the dataset card."""
    settings = config.with_defaults("curate", settings)
    selection = settings["selection"]
    threshold = float(settings["speedup_threshold"])
    share = float(settings["single_op_share"])
    ablations = list(settings["ablations"])
    seed = int(settings["seed"])
    records = settings["records"]
    if records not in RECORDS:
        raise ValueError(f"curate.records: {records!r} is not one of {', '.join(RECORDS)}")
    if not 0 <= share <= 1:
        raise ValueError(f"curate.single_op_share: {share} is not in 0..1")
    unknown = [a for a in ablations if a not in ABLATIONS]
    if unknown:
        raise ValueError(f"curate.ablations: unknown subset {unknown[0]!r} (known: {', '.join(ABLATIONS)})")

    allow_reduced = bool(settings["allow_reduced_precision"])
    baseline = settings["baseline"]
    joined = join_candidates(candidates, over_baseline(verdicts, baseline), tasks)
    screened = screening.screen(joined, bool(settings["include_truncated"]))
    kept = screened.kept
    flagged = kept["correct"] & screening.reduced_precision(kept)
    impossible = kept["correct"] & (allow_reduced | ~flagged) & screening.beats_roofline(kept)
    # the pool every criterion and ablation draws from: correct by the shared rule, reduced precision only if allowed,
    # never a time quicker than writing the outputs takes
    correct = kept[kept["correct"] & (allow_reduced | ~flagged) & ~impossible].reset_index(drop=True)
    counts = {**screened.counts, "incorrect": int((~kept["correct"]).sum())}
    counts["reduced_precision_left_out"] = 0 if allow_reduced else int(flagged.sum())
    counts["beats_roofline_left_out"] = int(impossible.sum())
    counts["eligible"] = len(correct)
    counts["tasks"] = {"candidates": int(joined["task_id"].nunique()), "eligible": int(correct["task_id"].nunique())}

    ids_a = select_shortest_fastest(correct, selection)
    ids_b = select_high_speedup(correct, threshold, set(ids_a))
    admitted = pd.concat([_rows(correct, ids_a, CRITERIA[0]), _rows(correct, ids_b, CRITERIA[1])], ignore_index=True)
    ids_c = select_single_op_balance(correct, admitted, share)
    admitted = pd.concat([admitted, _rows(correct, ids_c, CRITERIA[2])], ignore_index=True)
    dataset = contracts.conform(admitted, contracts.DATASET, "curated dataset")
    subsets = {name: _ablation(correct, name, len(dataset), seed) for name in ablations}
    # every candidate by id, for the trajectories the records follow back to their first turn
    versions = joined.loc[:, ["candidate_id", "prompt", "answer", "code", "parent_id"]].to_dict("records")
    by_id = {row["candidate_id"]: row for row in versions}
    dataset = contracts.conform(with_records(dataset, by_id, records), contracts.DATASET, "curated dataset")
    subsets = {
        name: contracts.conform(with_records(table, by_id, records), contracts.DATASET, f"subset {name}")
        for name, table in subsets.items()
    }
    for name, table in {"dataset": dataset, **subsets}.items():
        _check_rows(table, set(counts["reasoning_generators"]), name)
    sft = [
        sft_record(row)
        for row in dataset.loc[:, ["candidate_id", "task_id", "prompt", "reasoning", "answer", "history"]].to_dict(
            orient="records"
        )
    ]
    counts["turns"] = {
        int(turn): {
            "candidates": int((joined["turn"] == turn).sum()),
            "eligible": int((correct["turn"] == turn).sum()),
            "dataset": int((dataset["turn"] == turn).sum()),
        }
        for turn in sorted(joined["turn"].unique())
    }
    card = dataset_card(
        dataset,
        correct,
        counts,
        settings={
            "records": records,
            "selection": selection,
            "speedup_threshold": threshold,
            "baseline": baseline,
            "single_op_share": share,
            "ablations": ablations,
            "seed": seed,
            "allow_reduced_precision": allow_reduced,
            "include_truncated": bool(settings["include_truncated"]),
        },
    )
    return Curated(dataset=dataset, subsets=subsets, sft=sft, card=card, counts=counts)


# ---------------------------------------------------------------- dataset card


def _fmt(value: float) -> str:
    return "n/a" if pd.isna(value) else f"{value:.4g}"


def _stats_row(label: str, values: pd.Series) -> str:
    values = values.dropna().astype(float)
    if values.empty:
        return f"| {label} | 0 | n/a | n/a | n/a | n/a |"
    return (
        f"| {label} | {len(values)} | {_fmt(values.min())} | {_fmt(values.median())} | "
        f"{_fmt(values.mean())} | {_fmt(values.max())} |"
    )


def _count_table(series: pd.Series, header: str, order) -> list[str]:
    counts = series.value_counts()
    keys = list(order) + sorted(k for k in counts.index if k not in order)
    lines = [f"| {header} | rows |", "|---|---:|"]
    lines += [f"| {k} | {int(counts.get(k, 0))} |" for k in keys]
    return lines


CANDIDATE_ROWS = (  # the card's "Candidates" table: each candidate under the first line that applies
    ("truncated", "left out: generation cut at the token cap (`include_truncated` false)"),
    ("no_reasoning", "left out: no reasoning, from a reasoning generator"),
    ("untrusted", "left out: verdict not trusted (degenerate task)"),
    ("no_code", "no code (never correct)"),
    ("other_incorrect", "incorrect"),
    ("reduced_precision_left_out", "left out: correct, reduced precision (`allow_reduced_precision` false)"),
    ("beats_roofline_left_out", "left out: correct, timed quicker than writing its outputs (`timing:beats_roofline`)"),
    ("eligible", "eligible: correct (the pool of every criterion and ablation subset)"),
)


def candidate_table(counts: dict) -> list[str]:
    """Every candidate counted once, under the first line that applies; the lines add up to the candidates."""
    values = {
        **counts["left_out"],
        "no_code": counts["no_code"],
        "other_incorrect": counts["incorrect"] - counts["no_code"],
        "reduced_precision_left_out": counts["reduced_precision_left_out"],
        "beats_roofline_left_out": counts["beats_roofline_left_out"],
        "eligible": counts["eligible"],
    }
    lines = ["| candidates | n |", "|---|---:|"]
    lines += [f"| {label} | {values[key]} |" for key, label in CANDIDATE_ROWS]
    lines.append(f"| **all** | {counts['candidates']} |")
    return lines


def _turns_line(turns: dict, records: str) -> str:
    """The card's line on turns: per turn the candidates, eligible ones and dataset rows; what a record holds."""
    kind = (
        "each record is the task's prompt and the picked version's reasoning and answer (`single_turn`)"
        if records == "single_turn"
        else "each record is the picked version's trajectory: the earlier prompts, answers (without reasoning) and "
        "feedback, then its reasoning and answer (`multi_turn`)"
    )
    per_turn = "; ".join(
        f"turn {turn}: {c['candidates']} candidates, {c['eligible']} eligible, {c['dataset']} rows"
        for turn, c in sorted(turns.items())
    )
    if len(turns) <= 1:
        return f"- Turns: 1 (single-turn generations); {kind}"
    return f"- Turns: {len(turns)}, the criteria picking across them ({per_turn}); {kind}"


def dataset_card(dataset: pd.DataFrame, pool: pd.DataFrame, counts: dict, settings: dict) -> str:
    """Markdown card: sources, how every candidate was sorted (`counts` of curate), counts per criterion and
    category, reasoning-length and speedup statistics of the dataset and of the eligible pool."""
    generators = ", ".join(counts["tokenizers"]) or "none"
    trunc = counts["truncated"]
    tokenizers = "; ".join(
        f"{gen}: {', '.join(f'`{t}`' if t else '(not recorded)' for t in values)}"
        for gen, values in counts["tokenizers"].items()
    )
    lines = [
        "# ConCuR dataset card",
        "",
        f"- Generators: {generators}; reasoning generators (any candidate with reasoning): "
        f"{', '.join(counts['reasoning_generators']) or 'none'}",
        f"- Reasoning tokens counted with: {tokenizers or 'n/a'}",
        f"- Candidates: {counts['candidates']} over {counts['tasks']['candidates']} tasks; eligible (correct): "
        f"{counts['eligible']} over {counts['tasks']['eligible']} tasks",
        f"- Truncated (cut at the token cap): {trunc['total']} ({trunc['reported']} reported by the backend, "
        f"{trunc['detected']} detected); {'included' if trunc['included'] else 'left out'}",
        f"- Dataset rows: {len(dataset)} over {dataset['task_id'].nunique()} tasks",
        _turns_line(counts.get("turns") or {}, settings.get("records", RECORDS[0])),
        "",
    ]
    if dataset.empty:
        lines += [
            "**The dataset is empty**: no candidate was admitted "
            f"({'no eligible candidates' if pool.empty else 'no criterion matched'}).",
            "",
        ]
    lines += ["## Candidates", ""] + candidate_table(counts)
    lines += [
        "",
        f"Correct means a trusted `correct` verdict on a candidate with code (`concur.screening`); "
        f"{counts['correct_verdict_without_code']} `correct` verdicts on candidates without code count as incorrect. "
        "No dataset or subset row lacks code, or reasoning when its generator is a reasoning generator.",
    ]
    lines += ["", "## Rows per criterion", ""] + _count_table(dataset["criterion"], "criterion", CRITERIA)
    lines += ["", "## Rows per category", ""] + _count_table(dataset["category"], "category", contracts.CATEGORIES)
    stats_header = ["| set | n | min | median | mean | max |", "|---|---:|---:|---:|---:|---:|"]
    lines += (
        ["", "## Reasoning length (tokens)", ""]
        + stats_header
        + [
            _stats_row("dataset", dataset["reasoning_tokens"]),
            _stats_row("eligible candidates", pool["reasoning_tokens"]),
        ]
    )
    lines += (
        ["", "## Speedup (reference time / kernel time)", ""]
        + stats_header
        + [
            _stats_row("dataset", dataset["speedup"]),
            _stats_row("eligible candidates", pool["speedup"]),
        ]
    )
    lines += ["", "## Settings", ""] + [f"- `{k}`: {v}" for k, v in settings.items()]
    lines += [
        "",
        "## Tie rule",
        "",
        TIE_RULE,
        "",
        "Under `strict` a task whose fastest kernel is not also its shortest-reasoning kernel adds nothing "
        "to `shortest_fastest`.",
        "",
    ]
    return "\n".join(lines)


def run(candidate_paths, verified_paths, tasks_path, settings: dict, outputs) -> None:
    """The curate stage. `outputs` has .dataset, .sft, .card and .subsets (paths named {subset}.parquet)."""
    curated = curate(
        read_parquets(candidate_paths), read_parquets(verified_paths), pd.read_parquet(tasks_path), settings
    )
    write_parquet(curated.dataset, outputs.dataset)
    write_jsonl(curated.sft, outputs.sft)
    write_text(curated.card, outputs.card)
    for path in outputs.subsets:
        write_parquet(curated.subsets[Path(path).stem], path)
    dataset = curated.dataset
    counts = curated.counts
    log.info(
        "curate: %d rows over %d tasks (%s); subset rows: %s; %d of %d candidates eligible, left out: %s, "
        "reduced precision %d",
        len(dataset),
        dataset["task_id"].nunique(),
        dataset["criterion"].value_counts().to_dict(),
        {name: len(s) for name, s in curated.subsets.items()},
        counts["eligible"],
        counts["candidates"],
        counts["left_out"],
        counts["reduced_precision_left_out"],
    )

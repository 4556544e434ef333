"""The synthesize stage: prompts for tasks -> generations from a backend -> the candidates contract; and its
refinement turns: each version that is not yet correct and fast enough, with the verifier's feedback -> the next
version (`refine`; the chat and the feedback: `concur.feedback`).

Backends (`concur.backends`) yield `Generation`s; everything after (extraction, token counts, ids) is shared, so
training candidates and evaluation candidates are produced by the same code. Generation is resumable: every finished
sample is appended to a checkpoint next to the output (`<out>.partial.jsonl`, never a declared Snakemake output, so a
failed job's checkpoint survives), a restarted job skips what is in it, and the checkpoint is removed once the
output is written.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pandas as pd

from . import contracts
from .backends import PROMPT_TOO_LONG, Generation, Request, Skipped, make_backend, wanted_samples
from .extract import extract
from .prompts import build_prompt
from .workflow import drawn_with

log = logging.getLogger(__name__)

# what changes the samples themselves; a checkpoint written under other values is not resumed
SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "seed")


# finish reasons that say the generation hit its token cap, and those that say the model ended on its own
CUT_FINISH = frozenset({"length", "max_tokens", "max_output_tokens"})
ENDED_FINISH = frozenset({"stop", "eos", "end_turn", "stop_sequence"})
REPORT_COLUMNS = tuple(f.name for f in fields(Skipped))  # kind, task_id, sample_idx, detail


@dataclass(frozen=True)
class Counter:
    """What counts tokens: a `models` entry's tokenizer (`tokenizer` None: the backend's own counts) and the label
    the candidates' `tokenizer` column carries (", not the generator's" when it is not declared the generator's)."""

    label: str
    tokenizer: object = None
    engine_counts: bool = False  # the backend's own completion counts are exact (vllm's token ids): keep them


@dataclass
class Synthesized:
    candidates: pd.DataFrame
    report: list[Skipped] = field(default_factory=list)


def candidate_id(generator: str, task_id: str, sample_idx: int, turn: int = 1) -> str:
    """sha256 of (generator, task_id, sample_idx), and the turn after 1 (turn 1's ids are single-turn runs')."""
    key = f"{generator}\x1f{task_id}\x1f{sample_idx}" + (f"\x1f{turn}" if turn > 1 else "")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def cap_margin(cap: int) -> int:
    """How close to a cap a completion ends when the cap cut it: 0.5% of it, at least 16 tokens (a cut lands
    mid-token in the text that is kept, and a count of the text may differ from the server's by a few tokens), at
    most an eighth of a small cap."""
    return min(max(16, cap // 200), cap // 8)


def cap_reached(tokens: int, cap: int | None) -> bool:
    return bool(cap) and tokens > 0 and tokens >= cap - cap_margin(cap)


def inferred_cap(lengths: Iterable[int]) -> int | None:
    """The token cap a set of completions was cut at, read off the lengths themselves (for files that record no
    finish reason): a cap piles completions up just below it. A window of one cap margin below some length counts
    as such a pile when it holds at least 5% of the completions (and at least 10), at least five times one more
    than the window of the same width just below it, and lies at 256 tokens or more; completions that ended on
    their own spread far wider (tests/test_synthesize.py measures how rarely such a pile appears by chance). The
    fullest pile wins; the cap is the lowest top whose window holds 99% of it. None when there
    is no pile.
    """
    values = sorted(v for v in lengths if v > 0)
    need = max(10, -(-5 * len(values) // 100))
    piles = {}
    for value in set(values):
        margin = cap_margin(value)
        pile = bisect.bisect_right(values, value) - bisect.bisect_left(values, value - margin)
        below = bisect.bisect_left(values, value - margin) - bisect.bisect_left(values, value - 2 * margin)
        if value >= 256 and pile >= need and pile >= 5 * (below + 1):
            piles[value] = pile
    if not piles:
        return None
    fullest = max(piles.values())  # the lowest top that holds (nearly) all of the fullest pile: the tightest window
    return min(value for value, pile in piles.items() if pile >= 0.99 * fullest)


def in_pile(tokens: int, cap: int | None) -> bool:
    """Within one cap margin below an inferred cap, or a few tokens over it (a text counted again may read a token
    or two more than the server counted); further above lie completions the cap did not bound."""
    return bool(cap) and cap - cap_margin(cap) <= tokens <= cap + 4


def to_candidates(
    generations: Iterable[Generation],
    prompts: dict[str, str],
    generator: str,
    backend: str,
    counter: Counter | None = None,
    cap: int | None = None,
    turn: int = 1,
    parents: dict[tuple[str, int], str] | None = None,
) -> pd.DataFrame:
    """Extract reasoning/answer/code, count tokens, tell truncation; one row per generation (contracts.CANDIDATES).
    `prompts` maps a task_id to its prompt, or for a refinement turn (`turn` > 1) a (task_id, sample_idx) to its
    follow-up message, and `parents` the same pair to the id of the version it refines.

    Truncation (`truncated`, `truncation`): `reported` when the finish reason says the cap cut it; else, unless the
    finish reason says the model ended, `detected` when the text ends inside its reasoning or a code fence, or its
    completion ends within a cap margin of `cap` (a replay file's `max_new_tokens`) or of the cap the lengths
    themselves show (`inferred_cap`); its finish_reason then reads `length`."""
    counter = counter or Counter("")
    tokenizer = counter.tokenizer
    generations = list(generations)
    completions = [
        _count(tokenizer, g.response if g.reasoning is None else g.reasoning + g.response)
        if tokenizer is not None and not (counter.engine_counts and g.completion_tokens is not None)
        else int(g.completion_tokens or 0)
        for g in generations
    ]
    open_ended = [g.finish_reason not in CUT_FINISH | ENDED_FINISH | {PROMPT_TOO_LONG} for g in generations]
    seen_cap = inferred_cap(c for c, o in zip(completions, open_ended) if o)
    if seen_cap and seen_cap != cap:
        log.warning(
            "%s: completions without a finish reason pile up at %d tokens: taken for a cap", generator, seen_cap
        )
    rows = []
    for gen, completion, open_end in zip(generations, completions, open_ended):
        reported = gen.finish_reason in CUT_FINISH
        at_cap = open_end and (cap_reached(completion, cap) or in_pile(completion, seen_cap))
        parts = extract(gen.response, gen.reasoning, cut=reported or at_cap)
        detected = open_end and (at_cap or parts.unclosed)
        truncation = "reported" if reported else "detected" if detected else ""
        rows.append(
            {
                "candidate_id": candidate_id(generator, gen.task_id, gen.sample_idx, turn),
                "task_id": gen.task_id,
                "sample_idx": gen.sample_idx,
                "generator": generator,
                "backend": backend,
                "prompt": gen.prompt or (prompts[(gen.task_id, gen.sample_idx)] if turn > 1 else prompts[gen.task_id]),
                "response": gen.response,
                "reasoning": parts.reasoning,
                "answer": parts.answer,
                "code": parts.code,
                "reasoning_tokens": (
                    _count(tokenizer, parts.reasoning) if tokenizer is not None else int(gen.reasoning_tokens or 0)
                ),
                "completion_tokens": completion,
                "finish_reason": "length" if detected else gen.finish_reason,
                "seed": gen.seed,
                "reasoning_source": parts.reasoning_source,
                "code_source": parts.code_source,
                "truncated": bool(truncation),
                "truncation": truncation,
                "tokenizer": counter.label,
                "turn": turn,
                "parent_id": (parents or {}).get((gen.task_id, gen.sample_idx), ""),
            }
        )
    frame = pd.DataFrame(rows, columns=list(contracts.CANDIDATES))
    frame = frame.sort_values(["task_id", "sample_idx"], kind="stable")
    dupes = frame["candidate_id"].duplicated()
    if dupes.any():
        raise ValueError(f"generator {generator}: task {frame.loc[dupes, 'task_id'].iloc[0]} has a sample_idx twice")
    return contracts.conform(frame, contracts.CANDIDATES, "candidates")


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0


def noted(frame: pd.DataFrame) -> list[Skipped]:
    """The kept samples a reader should know about: empty responses, truncated ones, ones without a program."""
    out = []
    for row in frame.itertuples():
        if row.finish_reason == PROMPT_TOO_LONG:
            out.append(Skipped("prompt_too_long", row.task_id, row.sample_idx, "the server refused the prompt"))
            continue
        if not row.response.strip() and not row.reasoning.strip():
            out.append(Skipped("empty", row.task_id, row.sample_idx, f"finish_reason {row.finish_reason}"))
            continue
        if row.truncated:
            out.append(Skipped("truncated", row.task_id, row.sample_idx, f"{row.truncation}"))
        if not row.code:
            out.append(Skipped("no_code", row.task_id, row.sample_idx, f"reasoning: {row.reasoning_source}"))
    return out


def checkpoint_path(out_path: str | Path) -> Path:
    return Path(f"{out_path}.partial.jsonl")


def checkpoint_fingerprint(
    generator: dict, settings: dict, samples: int, language: str, adapter: str | Path | None, chats: str = ""
) -> str:
    """Identifies what a checkpoint's samples were drawn with: generator entry (but its transport keys, see
    `workflow.TRANSPORT_KEYS`), sampling settings, adapter; for a refinement turn `chats`, the digest of its
    requests (the feedback they carry changes with the verdicts before them)."""
    identity = {
        **({"chats": chats} if chats else {}),
        "generator": drawn_with(generator),
        "sampling": {k: settings.get(k) for k in SAMPLING_KEYS},
        "samples": samples,
        "language": language,
        "adapter": str(adapter) if adapter else None,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_checkpoint(path: Path, fingerprint: str) -> dict[tuple[str, int], Generation] | None:
    """Generations a previous run of this job finished (a truncated line is skipped); None when the file was
    written with other settings, or has no header."""
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if not isinstance(header, dict) or header.get("checkpoint") != fingerprint:
        return None
    done: dict[tuple[str, int], Generation] = {}
    for line in lines[1:]:
        try:
            gen = Generation(**json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
        done[(gen.task_id, gen.sample_idx)] = gen
    return done


def open_checkpoint(path: Path, fingerprint: str):
    """(samples already there, file open for appending), starting the file afresh when it cannot be resumed."""
    done = read_checkpoint(path, fingerprint)
    if done is None:
        log.warning("%s was written with other generation settings: starting afresh", path)
        path.unlink()
        done = {}
    elif done:
        log.info("resuming from %s: %d samples already answered", path, len(done))
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = not path.is_file()
    fh = open(path, "a", encoding="utf-8")
    if fresh:
        fh.write(json.dumps({"checkpoint": fingerprint}) + "\n")
    elif path.read_bytes()[-1:] != b"\n":
        fh.write("\n")  # a line cut short by a killed job stays on its own line and is skipped
    fh.flush()
    return done, fh


def generate_resumable(
    backend, requests: list[Request], samples: int, checkpoint: Path | None, fingerprint: str = ""
) -> list[Generation]:
    """All samples of all requests: those in the checkpoint plus new ones, each appended and flushed on arrival
    (but those of prompts the server refused as too long: a rerun asks again, which costs nothing)."""
    if checkpoint is None:
        return list(backend.generate(requests, samples))
    done, fh = open_checkpoint(checkpoint, fingerprint)
    wanted = {(r.task_id, i) for r in requests for i in wanted_samples(r, samples)}
    done = {key: gen for key, gen in done.items() if key in wanted}  # the shard's tasks may have changed
    with fh:
        for gen in backend.generate(requests, samples, skip=frozenset(done)):
            key = (gen.task_id, gen.sample_idx)
            if key in done or key not in wanted:
                continue
            done[key] = gen
            if gen.finish_reason != PROMPT_TOO_LONG:
                fh.write(json.dumps(asdict(gen)) + "\n")
                fh.flush()
    return list(done.values())


def generate_candidates(*args, **kwargs) -> pd.DataFrame:
    """The candidates of `synthesize` (same arguments), without its report."""
    return synthesize(*args, **kwargs).candidates


def synthesize(
    tasks: pd.DataFrame,
    generator_name: str,
    generator: dict,
    model_specs: dict,
    settings: dict,
    language: str,
    samples: int,
    adapter: str | Path | None = None,
    checkpoint: str | Path | None = None,
    all_task_ids: Iterable[str] | None = None,
) -> Synthesized:
    """Prompts for `tasks`, generations from the generator, candidates and their report out. With `checkpoint`,
    every finished sample is appended to that JSONL and samples already in it are not generated again. Rows a
    replay file holds for a task outside `all_task_ids` are reported as `no_task` (with None: not reported, as in
    every shard but the first, so that each is reported once)."""
    prompts = {row.task_id: build_prompt(row.code, language) for row in tasks.itertuples()}
    requests = [Request(task_id, prompt) for task_id, prompt in prompts.items()]
    return _generate(
        requests,
        prompts,
        generator_name,
        generator,
        model_specs,
        settings,
        language,
        samples,
        adapter,
        checkpoint,
        all_task_ids,
    )


def refine(
    tasks: pd.DataFrame,
    history: pd.DataFrame,
    verdicts: pd.DataFrame,
    turn: int,
    generator_name: str,
    generator: dict,
    model_specs: dict,
    settings: dict,
    language: str,
    samples: int,
    stop_speedup: float | None,
    adapter: str | Path | None = None,
    checkpoint: str | Path | None = None,
) -> Synthesized:
    """Turn `turn` (> 1) of the trajectories of `tasks`, from `history` (their candidates of turns 1 … turn-1) and
    `verdicts` (of turn `turn - 1`): each version of turn `turn - 1` that `feedback.needs_refinement` is asked
    again, in the chat of its trajectory followed by its feedback, for its own sample index. The new candidates
    carry `turn` and their parent's id."""
    requests, prompts, parents = refinement_requests(tasks, history, verdicts, turn, stop_speedup)
    log.info("%s turn %d: %d version(s) of turn %d to refine", generator_name, turn, len(requests), turn - 1)
    digest = hashlib.sha256(
        json.dumps([[r.task_id, r.samples, r.history, r.prompt] for r in requests], default=str).encode()
    ).hexdigest()[:16]
    return _generate(
        requests,
        prompts,
        generator_name,
        generator,
        model_specs,
        settings,
        language,
        samples,
        adapter,
        checkpoint,
        None,
        turn=turn,
        parents=parents,
        chats=digest,
    )


def refinement_requests(
    tasks: pd.DataFrame, history: pd.DataFrame, verdicts: pd.DataFrame, turn: int, stop_speedup: float | None
) -> tuple[list[Request], dict[tuple[str, int], str], dict[tuple[str, int], str]]:
    """The requests of turn `turn` for `tasks`, the follow-up message and the parent id per (task_id,
    sample_idx)."""
    from .feedback import Feedback, chain_of, needs_refinement, trajectory_messages

    if turn < 2:
        raise ValueError(f"refinement turn {turn}: turns after the first are 2, 3, …")
    history = contracts.conform(history, contracts.CANDIDATES, "earlier turns' candidates")
    previous = history[(history["turn"] == turn - 1) & history["task_id"].isin(set(tasks["task_id"]))]
    contracts.require_columns(verdicts, ("candidate_id", "status", "correct", "speedup"), f"turn {turn - 1} verdicts")
    joined = previous.merge(verdicts.drop(columns=["task_id"], errors="ignore"), on="candidate_id", how="left")
    unjudged = joined[joined["status"].isna()]
    if len(unjudged):
        raise ValueError(f"turn {turn - 1} candidate {unjudged['candidate_id'].iloc[0]!r} has no verdict")
    by_id = {row["candidate_id"]: row for row in history.to_dict("records")}
    requests, prompts, parents = [], {}, {}
    for row in joined.sort_values(["task_id", "sample_idx"], kind="stable").to_dict("records"):
        correct = bool(row["correct"]) and bool(str(row["code"]).strip())
        if not needs_refinement(correct, float(row["speedup"]), stop_speedup):
            continue
        key = (row["task_id"], int(row["sample_idx"]))
        prompts[key] = Feedback.from_row(row).message()
        parents[key] = row["candidate_id"]
        chat = tuple(trajectory_messages(chain_of(row["candidate_id"], by_id)))
        requests.append(Request(key[0], prompts[key], chat, (key[1],), turn))
    return requests, prompts, parents


def _generate(
    requests: list[Request],
    prompts: dict,
    generator_name: str,
    generator: dict,
    model_specs: dict,
    settings: dict,
    language: str,
    samples: int,
    adapter: str | Path | None,
    checkpoint: str | Path | None,
    all_task_ids: Iterable[str] | None,
    turn: int = 1,
    parents: dict | None = None,
    chats: str = "",
) -> Synthesized:
    if not requests and generator["backend"] != "replay":  # nothing to ask: no model is loaded
        backend_name, generations, backend = generator["backend"], [], None
        counter = Counter("")
    else:
        backend = make_backend(generator, model_specs, settings, adapter)
        backend_name = backend.name
        counter = make_counter(generator_name, generator, model_specs, backend)
        fingerprint = checkpoint_fingerprint(generator, settings, samples, language, adapter, chats)
        path = Path(checkpoint) if checkpoint else None
        generations = generate_resumable(backend, requests, samples, path, fingerprint)
    log.info("%s: %d generations for %d requests", generator_name, len(generations), len(requests))
    cap = generator.get("max_new_tokens") if generator["backend"] == "replay" else settings.get("max_new_tokens")
    frame = to_candidates(generations, prompts, generator_name, backend_name, counter, cap, turn, parents)
    if counter.tokenizer is None and ((frame["reasoning"] != "") & (frame["reasoning_tokens"] == 0)).any():
        log.warning("%s: the server counts no reasoning tokens; set the generator's `tokenizer`", generator_name)
    known = None if all_task_ids is None else set(all_task_ids)
    dropped = [
        Skipped("no_task", s.task_id, s.sample_idx, s.detail) if s.kind == "other_task" else s
        for s in getattr(backend, "skipped", [])
        if s.kind != "other_task" or (known is not None and s.task_id not in known)
    ]
    return Synthesized(frame, dropped + noted(frame))


def counting_tokenizer(generator: dict) -> str | None:
    """The `models` entry named as the generator's `tokenizer` (required for replay); None: the backend counts with
    its own model's tokenizer (transformers, vllm) or the server's usage (openai)."""
    return generator.get("tokenizer")


def owns_tokenizer(generator: dict, name: str, model_specs: dict) -> bool:
    """Whether the `models` entry `name` holds the generator's own tokenizer: it is the generator's `model` entry,
    or loads from the same place, or (for a `model` that is a name, as openai's and replay's) its folder or hub id
    ends in that name (`/models/QwQ-32B` for `Qwen/QwQ-32B`)."""
    model = generator.get("model")
    if not model:
        return False
    if model == name:
        return True

    def places(spec: dict) -> set[str]:
        return {p.rstrip("/") for p in (spec.get("path"), spec.get("tokenizer")) if isinstance(p, str) and p}

    mine = places(model_specs.get(name, {}))
    if model in model_specs:
        return bool(mine & places(model_specs[model]))
    return model.rsplit("/", 1)[-1].lower() in {p.rsplit("/", 1)[-1].lower() for p in mine}


def make_counter(generator_name: str, generator: dict, model_specs: dict, backend=None) -> Counter:
    """The tokenizer that counts this generator's tokens, and its label; a warning when it is not the generator's
    own (lengths are then not in the generator's tokens, and the paper's thresholds do not apply as they are)."""
    from .models import load_counting_tokenizer

    name = counting_tokenizer(generator)
    if name is None:
        own = getattr(backend, "own_tokenizer", None)
        if own is None:
            return Counter("server")
        spec = model_specs.get(generator.get("model"), {})
        label = f"{generator.get('model')} ({spec.get('tokenizer') or spec.get('path')})"
        return Counter(label, own(), engine_counts=True)
    spec = model_specs[name]
    label = f"{name} ({spec.get('tokenizer') or spec.get('path')})"
    if not owns_tokenizer(generator, name, model_specs):
        label += ", not the generator's"
        log.warning(
            "%s: tokens are counted with %s, which is not declared the tokenizer of the generator's model %r "
            "(docs/data.md §3, whose tokens)",
            generator_name,
            name,
            generator.get("model"),
        )
    return Counter(label, load_counting_tokenizer(spec))


def report_path(out_path: str | Path) -> Path:
    """`shard-0.parquet` -> `shard-0.report.csv`: the samples synthesis dropped or a reader should know about."""
    return Path(str(out_path).removesuffix(".parquet") + ".report.csv")


def write_report(report: list[Skipped], out_path: str | Path, what: str) -> None:
    from .io import write_csv

    path = report_path(out_path)
    frame = pd.DataFrame([asdict(r) for r in report], columns=list(REPORT_COLUMNS))
    write_csv(frame, path)
    log.info("%s: report %s: %s", what, path.name, frame["kind"].value_counts().to_dict() or "nothing to report")


def write_candidates(frame: pd.DataFrame, out_path: str | Path) -> None:
    """Write the output atomically, then drop its checkpoint."""
    from .io import write_parquet

    write_parquet(frame, out_path)
    checkpoint_path(out_path).unlink(missing_ok=True)


def run(tasks_path: str, shard: int, n_shards: int, generator_name: str, config: dict, out_path: str) -> None:
    """The synthesize stage for one shard of the training tasks: candidates and their report."""
    from .tasks import select_shard

    settings = config["synthesize"]
    all_tasks = pd.read_parquet(tasks_path)
    made = synthesize(
        select_shard(all_tasks, shard, n_shards),
        generator_name,
        config["generators"][generator_name],
        config["models"],
        settings,
        settings["language"],
        settings["samples_per_task"],
        checkpoint=checkpoint_path(out_path),
        all_task_ids=all_tasks["task_id"] if shard == 0 else None,
    )
    write_report(made.report, out_path, f"{generator_name} shard {shard}")
    write_candidates(made.candidates, out_path)


def run_refine(
    tasks_path: str,
    history_paths: list,
    verified_path: str,
    turn: int,
    shard: int,
    n_shards: int,
    generator_name: str,
    config: dict,
    out_path: str,
) -> None:
    """The refine stage for one shard of the training tasks: turn `turn`'s candidates and their report, from the
    earlier turns' candidates of the shard and turn `turn - 1`'s verdicts."""
    from .io import read_parquets
    from .tasks import select_shard

    settings = config["synthesize"]
    made = refine(
        select_shard(pd.read_parquet(tasks_path), shard, n_shards),
        read_parquets(history_paths),
        pd.read_parquet(verified_path),
        turn,
        generator_name,
        config["generators"][generator_name],
        config["models"],
        settings,
        settings["language"],
        settings["samples_per_task"],
        settings["stop_speedup"],
        checkpoint=checkpoint_path(out_path),
    )
    write_report(made.report, out_path, f"{generator_name} shard {shard} turn {turn}")
    write_candidates(made.candidates, out_path)


def run_eval_generation(
    tasks_path,
    adapter_dir,
    model_name: str,
    generator_name: str,
    generator: dict,
    model_specs: dict,
    settings: dict,
    language: str,
    out_path,
    turn: int = 1,
    history_paths: list | None = None,
    verified_path=None,
) -> None:
    """The eval_generate stage for one evaluated model: the base generator, the base generator with a trained
    adapter, or a baseline generator, answering every eval task `samples` times (resumable like synthesis); for
    `turn` > 1 the eval_refine stage: the next version of every trajectory still going (`refine`, with the earlier
    turns' candidates in `history_paths` and turn `turn - 1`'s verdicts in `verified_path`)."""
    from .io import read_parquets

    label = generator_name if adapter_dir is None else f"{generator_name}+{model_name}"
    tasks = pd.read_parquet(tasks_path)
    if turn > 1:
        made = refine(
            tasks,
            read_parquets(history_paths or []),
            pd.read_parquet(verified_path),
            turn,
            label,
            generator,
            model_specs,
            settings,
            language,
            settings["samples"],
            settings["stop_speedup"],
            adapter=adapter_dir,
            checkpoint=checkpoint_path(out_path),
        )
    else:
        made = synthesize(
            tasks,
            label,
            generator,
            model_specs,
            settings,
            language,
            settings["samples"],
            adapter=adapter_dir,
            checkpoint=checkpoint_path(out_path),
            all_task_ids=tasks["task_id"],
        )
    write_report(made.report, out_path, label if turn == 1 else f"{label} turn {turn}")
    write_candidates(made.candidates, out_path)

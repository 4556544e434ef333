"""The synthesize stage: prompts for tasks -> generations from a backend -> the candidates contract.

Backends (`concur.backends`) yield `Generation`s; everything after (extraction, token counts, ids) is shared, so
training candidates and evaluation candidates are produced by the same code. Generation is resumable: every finished
sample is appended to a checkpoint next to the output (`<out>.partial.jsonl`, never a declared Snakemake output, so a
failed job's checkpoint survives), a restarted job skips what is in it, and the checkpoint is removed once the
output is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from . import contracts
from .backends import PROMPT_TOO_LONG, Generation, Request, make_backend
from .extract import extract
from .prompts import build_prompt
from .workflow import drawn_with

log = logging.getLogger(__name__)

# what changes the samples themselves; a checkpoint written under other values is not resumed
SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "seed")


def candidate_id(generator: str, task_id: str, sample_idx: int) -> str:
    return hashlib.sha256(f"{generator}\x1f{task_id}\x1f{sample_idx}".encode()).hexdigest()[:16]


def to_candidates(
    generations: Iterable[Generation], prompts: dict[str, str], generator: str, backend: str, tokenizer
) -> pd.DataFrame:
    """Extract reasoning/answer/code and count tokens; one row per generation, in contracts.CANDIDATES."""
    rows = []
    for gen in generations:
        parts = extract(gen.response, gen.reasoning)
        full = gen.response if gen.reasoning is None else gen.reasoning + gen.response
        rows.append(
            {
                "candidate_id": candidate_id(generator, gen.task_id, gen.sample_idx),
                "task_id": gen.task_id,
                "sample_idx": gen.sample_idx,
                "generator": generator,
                "backend": backend,
                "prompt": prompts[gen.task_id],
                "response": gen.response,
                "reasoning": parts.reasoning,
                "answer": parts.answer,
                "code": parts.code,
                "reasoning_tokens": (
                    _count(tokenizer, parts.reasoning) if tokenizer is not None else int(gen.reasoning_tokens or 0)
                ),
                "completion_tokens": (
                    _count(tokenizer, full) if tokenizer is not None else int(gen.completion_tokens or 0)
                ),
                "finish_reason": gen.finish_reason,
                "seed": gen.seed,
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


def checkpoint_path(out_path: str | Path) -> Path:
    return Path(f"{out_path}.partial.jsonl")


def checkpoint_fingerprint(
    generator: dict, settings: dict, samples: int, language: str, adapter: str | Path | None
) -> str:
    """Identifies what a checkpoint's samples were drawn with: generator entry (but its transport keys, see
    `workflow.TRANSPORT_KEYS`), sampling settings, adapter."""
    identity = {
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
    wanted = {(r.task_id, i) for r in requests for i in range(samples)}
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


def generate_candidates(
    tasks: pd.DataFrame,
    generator_name: str,
    generator: dict,
    model_specs: dict,
    settings: dict,
    language: str,
    samples: int,
    adapter: str | Path | None = None,
    checkpoint: str | Path | None = None,
) -> pd.DataFrame:
    """Prompts for `tasks`, generations from the generator, candidates out. With `checkpoint`, every finished
    sample is appended to that JSONL and samples already in it are not generated again."""
    from .models import load_tokenizer

    prompts = {row.task_id: build_prompt(row.code, language) for row in tasks.itertuples()}
    requests = [Request(task_id, prompt) for task_id, prompt in prompts.items()]
    backend = make_backend(generator, model_specs, settings, adapter)
    token_name = counting_tokenizer(generator)
    tokenizer = load_tokenizer(model_specs[token_name]) if token_name else None
    fingerprint = checkpoint_fingerprint(generator, settings, samples, language, adapter)
    generations = generate_resumable(backend, requests, samples, Path(checkpoint) if checkpoint else None, fingerprint)
    log.info("%s: %d generations for %d tasks", generator_name, len(generations), len(requests))
    return to_candidates(generations, prompts, generator_name, backend.name, tokenizer)


def counting_tokenizer(generator: dict) -> str | None:
    """The `models` entry whose tokenizer counts tokens: replay's (required), openai's and vllm's (optional),
    transformers' own model."""
    if generator["backend"] == "transformers":
        return generator["model"]
    return generator.get("tokenizer")


def write_candidates(frame: pd.DataFrame, out_path: str | Path) -> None:
    """Write the output atomically, then drop its checkpoint."""
    from .io import write_parquet

    write_parquet(frame, out_path)
    checkpoint_path(out_path).unlink(missing_ok=True)


def run(tasks_path: str, shard: int, n_shards: int, generator_name: str, config: dict, out_path: str) -> None:
    """The synthesize stage for one shard of the training tasks."""
    from .tasks import select_shard

    settings = config["synthesize"]
    tasks = select_shard(pd.read_parquet(tasks_path), shard, n_shards)
    frame = generate_candidates(
        tasks,
        generator_name,
        config["generators"][generator_name],
        config["models"],
        settings,
        settings["language"],
        settings["samples_per_task"],
        checkpoint=checkpoint_path(out_path),
    )
    write_candidates(frame, out_path)


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
) -> None:
    """The eval_generate stage for one evaluated model: the base generator, the base generator with a trained
    adapter, or a baseline generator, answering every eval task `samples` times (resumable like synthesis)."""
    label = generator_name if adapter_dir is None else f"{generator_name}+{model_name}"
    frame = generate_candidates(
        pd.read_parquet(tasks_path),
        label,
        generator,
        model_specs,
        settings,
        language,
        settings["samples"],
        adapter=adapter_dir,
        checkpoint=checkpoint_path(out_path),
    )
    write_candidates(frame, out_path)

"""What every backend takes and yields: requests (task id + user message, after the earlier turns of a refinement
chat) in, `Generation`s out, `samples` per request (or the sample indices a request names). `skip` holds the
(task_id, sample_idx) pairs a checkpoint already has: a backend does not ask its model for those again (replay reads
them anyway; the caller drops them)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Protocol

NOTHING: frozenset = frozenset()
# finish_reason of the samples of a prompt the server refused as longer than its context (their response is empty);
# they are not checkpointed, so a rerun asks again (e.g. once the model is served with a longer context)
PROMPT_TOO_LONG = "prompt_too_long"


@dataclass(frozen=True)
class Request:
    """One chat to answer: `history` (the earlier user and assistant messages of a refinement trajectory, oldest
    first) then the user message `prompt`. `samples`: the sample indices asked for (a refinement turn asks for its
    trajectory's own), None for 0..samples-1; `turn`: which turn of the trajectories it is (replay reads that
    turn's rows)."""

    task_id: str
    prompt: str
    history: tuple[dict, ...] = ()
    samples: tuple[int, ...] | None = None
    turn: int = 1


@dataclass(frozen=True)
class Generation:
    task_id: str
    sample_idx: int
    response: str
    finish_reason: str
    seed: int
    reasoning: str | None = None  # a backend's separate reasoning field, when it has one
    completion_tokens: int | None = None  # the backend's own count, used when no tokenizer is configured
    reasoning_tokens: int | None = None  # the server's count of reasoning tokens (openai usage), the same way
    prompt: str | None = None  # the prompt the model saw, when it differs from ours (replay: the file's)


@dataclass(frozen=True)
class Skipped:
    """A generation a backend read but did not yield (replay: a row for no task of this job, a row past
    `samples_per_task`, a second row for the same sample); synthesis reports them (docs/data.md §3)."""

    kind: str  # other_task | past_samples | duplicate | stopped
    task_id: str
    sample_idx: int
    detail: str


class Backend(Protocol):
    name: str

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]: ...


def wanted_samples(request: Request, samples: int) -> list[int]:
    """The sample indices a request asks for: its own (a refinement turn), else 0..samples-1."""
    return list(request.samples) if request.samples is not None else list(range(samples))


def missing_samples(request: Request, samples: int, skip: Collection[tuple[str, int]]) -> list[int]:
    return [i for i in wanted_samples(request, samples) if (request.task_id, i) not in skip]


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def messages(request: Request) -> list[dict]:
    """The chat a request sends: its history, then its user message."""
    return [dict(m) for m in request.history] + chat(request.prompt)

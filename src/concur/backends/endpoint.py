"""openai: any OpenAI-compatible chat-completions endpoint (`vllm serve`, llama.cpp's server, a hosted API). The
HTTP exchange itself (retries, event streams, error messages) is `transport`'s."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from .. import config
from .base import NOTHING, PROMPT_TOO_LONG, Generation, Request, messages, missing_samples
from .transport import ServerError, call

log = logging.getLogger(__name__)

MODEL_LIST_TIMEOUT_S = 60.0
# how servers word the refusal of a prompt longer than their context: OpenAI and llama.cpp (code
# context_length_exceeded), vLLM ("maximum context length", "longer than the maximum model length"), others
# ("context window", "prompt is too long")
CONTEXT_ERROR = re.compile(r"context[ _]length|context window|maximum model length|prompt is too long", re.I)


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint, at most `max_concurrency` requests in flight.

    Before any work the server must list `model` (GET /models; `check_model`), so a wrong name, a refused key or an
    unreachable URL fails in one line. With `request_n` (default) one request asks for all of a prompt's missing
    samples (`n`); a server that answers fewer choices (llama.cpp's ignores `n`) is asked again for the rest.
    Otherwise every sample is its own request with seed `seed + sample_idx`. Failed requests are retried (see
    `transport.call`); a request that fails for good stops the job once the requests in flight are answered, so none
    of them is lost. With `stream`, answers come as server-sent events: `request_timeout_s` then bounds the silence
    between two events, not the whole generation, and a killed job's requests are cancelled by the server."""

    name = "openai"

    def __init__(self, generator: dict, settings: dict):
        generator = config.with_defaults("generator", generator)
        self.api_key = api_key(generator)
        self.base_url = generator["base_url"].rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = generator["model"]
        self.concurrency = int(generator["max_concurrency"])
        self.retries = int(generator["max_retries"])
        self.timeout = float(generator["request_timeout_s"])
        self.backoff = float(generator["backoff_s"])
        self.request_n = bool(generator["request_n"])
        self.stream = bool(generator["stream"])
        self.settings = settings
        self._warned: set[str] = set()
        if generator["check_model"]:
            self.check_model()

    def check_model(self) -> None:
        """GET /models (retried like any request) must list `model`. A server without that route is warned about
        and not checked."""
        url = self.base_url + "/models"
        timeout = min(self.timeout, MODEL_LIST_TIMEOUT_S)
        try:
            data = call(url, None, self.api_key, timeout, self.retries, self.backoff, "the list of served models")
        except ServerError as err:
            if err.status not in (404, 405, 501):
                raise
            log.warning("%s: HTTP %d, the server lists no models: model %r not checked", url, err.status, self.model)
            return
        listed = data.get("data") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            raise RuntimeError(
                f"{url}: the answer is not a list of models (base_url must be the API's root, e.g. http://host:8000/v1)"
            )
        ids = [str(m.get("id")) for m in listed if isinstance(m, dict)]
        if self.model not in ids:
            shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            raise RuntimeError(
                f"{url}: the server does not serve model {self.model!r} (it serves: {shown or 'nothing'}); "
                f"set the generator's `model` to a served name"
            )

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        jobs = self._jobs(requests, samples, skip)
        failure: BaseException | None = None
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._answer, req, indices) for req, indices in jobs]
            try:
                for fut in as_completed(futures):
                    if fut.cancelled():
                        continue
                    try:
                        gens = fut.result()
                    except Exception as err:  # raised below, once the answers already underway are in
                        if failure is None:
                            failure = err
                            self._stop(futures, err)
                        continue
                    yield from gens
            finally:
                for fut in futures:
                    fut.cancel()
        if failure is not None:
            raise failure

    @staticmethod
    def _stop(futures: list, err: BaseException) -> None:
        """No new request after a failure; those in flight are answered (and checkpointed) first."""
        for other in futures:
            other.cancel()
        running = sum(other.running() for other in futures)
        if running:
            log.warning("%s; waiting for the %d request(s) in flight", err, running)

    def _jobs(self, requests: list[Request], samples: int, skip) -> list[tuple[Request, list[int]]]:
        if self.request_n:
            jobs = [(r, missing_samples(r, samples, skip)) for r in requests]
            return [(r, indices) for r, indices in jobs if indices]
        singles = [(i, r) for r in requests for i in missing_samples(r, samples, skip)]
        return [(r, [i]) for i, r in sorted(singles, key=lambda pair: pair[0])]  # every prompt's sample 0 first

    def _answer(self, req: Request, indices: list[int]) -> list[Generation]:
        """Every sample in `indices`, asking again for those a short answer left out."""
        gens: list[Generation] = []
        todo = list(indices)
        while todo:
            got = self._request(req, todo)
            gens += got
            todo = todo[len(got) :]
            if todo:
                self._warn_once(
                    "n",
                    "%s answered %d of %d choices (it ignores `n`): asking again for the rest, one request per "
                    "missing sample",
                    self.url,
                    len(got),
                    len(got) + len(todo),
                )
        return gens

    def _request(self, req: Request, indices: list[int]) -> list[Generation]:
        """One request for `indices`: Generations for the first k of them (k = the choices answered, at least 1)."""
        seed = int(self.settings["seed"]) + indices[0]
        body = {
            "model": self.model,
            "messages": messages(req),
            "temperature": self.settings["temperature"],
            "top_p": self.settings["top_p"],
            "max_tokens": self.settings["max_new_tokens"],
            "seed": seed,
            "n": len(indices),
        }
        if self.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        what = f"{req.task_id} sample {indices[0]}" + (f"-{indices[-1]}" if len(indices) > 1 else "")
        try:
            data = call(self.url, body, self.api_key, self.timeout, self.retries, self.backoff, what, self.stream)
        except ServerError as err:
            if err.status not in (400, 413, 422) or not CONTEXT_ERROR.search(err.detail):
                raise
            log.warning(
                "%s: the server refused the prompt as too long (%s): recorded as %s", what, err.detail, PROMPT_TOO_LONG
            )
            return [Generation(req.task_id, i, "", PROMPT_TOO_LONG, seed) for i in indices]
        gens = parse_choices(data, req, indices, seed, f"{self.url}: {what}")
        if gens[0].completion_tokens is None:
            self._warn_once(
                "usage",
                "%s answers without a count of completion tokens (usage): without the generator's `tokenizer` "
                "completion_tokens will be 0",
                self.url,
            )
        elif len(gens) > 1:
            self._warn_once(
                "split",
                "%s counts the tokens of all of a request's choices together: each sample gets the mean (set the "
                "generator's `tokenizer` for exact counts)",
                self.url,
            )
        return gens

    def _warn_once(self, key: str, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


def api_key(generator: dict) -> str | None:
    env = generator.get("api_key_env")
    if not env:
        return None
    key = os.environ.get(env)
    if not key:
        raise RuntimeError(
            f"openai generator {generator.get('model')!r}: environment variable {env} (api_key_env) is not set"
        )
    return key


def parse_choices(data: dict, req: Request, indices: list[int], seed: int, where: str) -> list[Generation]:
    """One Generation per choice, for the first len(choices) of `indices` (a server may answer fewer choices than
    asked, never none or more). The separate reasoning field is `reasoning_content` (vLLM before 0.10, DeepSeek)
    or `reasoning` (newer vLLM, OpenRouter). Token counts come from `usage` (`usage_counts`), split evenly over the
    choices: servers count a request's choices together."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or len(choices) > len(indices):
        got = len(choices) if isinstance(choices, list) else "no"
        raise RuntimeError(f"{where}: asked for {len(indices)} choice(s), the server returned {got}")
    choices = [c if isinstance(c, dict) else {} for c in choices]
    tokens, thought = usage_counts(data.get("usage"))

    def share(count: int | None) -> int | None:
        return None if count is None else count // len(choices)

    ordered = sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0)
    gens = []
    for idx, choice in zip(indices, ordered):
        msg = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
        finish = choice.get("finish_reason") or "unknown"
        content = msg.get("content") or ""
        gens.append(Generation(req.task_id, idx, content, finish, seed, reasoning, share(tokens), share(thought)))
    return gens


def usage_counts(usage) -> tuple[int | None, int | None]:
    """(completion tokens, reasoning tokens) of an answer's `usage`, None where it does not say. Servers differ:
    llama.cpp and vLLM give prompt/completion/total tokens (vLLM's streams only with `include_usage`, llama.cpp's
    streams none); OpenAI's reasoning models add `completion_tokens_details.reasoning_tokens` for reasoning they
    do not return; some give only the total (then total - prompt)."""
    if not isinstance(usage, dict):
        return None, None

    def count(value) -> int | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        return int(value) if ok else None

    tokens = count(usage.get("completion_tokens"))
    total, prompt = count(usage.get("total_tokens")), count(usage.get("prompt_tokens"))
    if tokens is None and total is not None and prompt is not None and total >= prompt:
        tokens = total - prompt
    details = usage.get("completion_tokens_details")
    return tokens, count(details.get("reasoning_tokens")) if isinstance(details, dict) else None

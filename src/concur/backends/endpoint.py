"""openai: any OpenAI-compatible chat-completions endpoint (`vllm serve`, a hosted API), through the standard
library's HTTP client, with retries."""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from .. import config
from .base import NOTHING, Generation, Request, chat, missing_samples

log = logging.getLogger(__name__)


RETRY_STATUS = {408, 409, 429}  # and every 5xx
MAX_BACKOFF_S = 120.0


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint, at most `max_concurrency` requests in flight.

    With `request_n` (default) one request asks for all of a prompt's missing samples (`n`); otherwise every
    sample is its own request with seed `seed + sample_idx`. Failed requests are retried (see `post`)."""

    name = "openai"

    def __init__(self, generator: dict, settings: dict):
        generator = config.with_defaults("generator", generator)
        self.api_key = api_key(generator)
        self.url = generator["base_url"].rstrip("/") + "/chat/completions"
        self.model = generator["model"]
        self.concurrency = int(generator["max_concurrency"])
        self.retries = int(generator["max_retries"])
        self.timeout = float(generator["request_timeout_s"])
        self.backoff = float(generator["backoff_s"])
        self.request_n = bool(generator["request_n"])
        self.settings = settings

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        jobs = self._jobs(requests, samples, skip)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._answer, req, indices) for req, indices in jobs]
            try:
                for fut in as_completed(futures):
                    yield from fut.result()
            finally:
                for fut in futures:
                    fut.cancel()

    def _jobs(self, requests: list[Request], samples: int, skip) -> list[tuple[Request, list[int]]]:
        if self.request_n:
            jobs = [(r, missing_samples(r, samples, skip)) for r in requests]
            return [(r, indices) for r, indices in jobs if indices]
        return [(r, [i]) for i in range(samples) for r in requests if (r.task_id, i) not in skip]

    def _answer(self, req: Request, indices: list[int]) -> list[Generation]:
        seed = int(self.settings["seed"]) + indices[0]
        body = {
            "model": self.model,
            "messages": chat(req.prompt),
            "temperature": self.settings["temperature"],
            "top_p": self.settings["top_p"],
            "max_tokens": self.settings["max_new_tokens"],
            "seed": seed,
            "n": len(indices),
        }
        what = f"{req.task_id} sample {indices[0]}" + (f"-{indices[-1]}" if len(indices) > 1 else "")
        data = post(self.url, body, self.api_key, self.timeout, self.retries, self.backoff, what)
        return parse_choices(data, req, indices, seed, f"{self.url}: {what}")


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
    """One Generation per choice; the separate reasoning field is `reasoning_content` (vLLM, DeepSeek) or
    `reasoning` (newer vLLM, OpenRouter). A server's count of completion tokens is split evenly over choices."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != len(indices):
        got = len(choices) if isinstance(choices, list) else "no"
        raise RuntimeError(
            f"{where}: expected {len(indices)} choice(s), the server returned {got} "
            f"(set request_n: false if it ignores `n`)"
        )
    tokens = (data.get("usage") or {}).get("completion_tokens")
    share = int(tokens) // len(choices) if tokens is not None else None
    ordered = sorted(choices, key=lambda c: c.get("index", 0))
    gens = []
    for idx, choice in zip(indices, ordered):
        msg = choice.get("message") or {}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
        gens.append(
            Generation(
                req.task_id,
                idx,
                msg.get("content") or "",
                choice.get("finish_reason") or "unknown",
                seed,
                reasoning,
                share,
            )
        )
    return gens


def post(url: str, body: dict, key: str | None, timeout: float, retries: int, backoff: float, what: str) -> dict:
    """POST JSON, retrying 408/409/429/5xx, timeouts, dropped connections and cut-off bodies with exponential
    backoff and jitter (`Retry-After` in seconds wins); other HTTP errors fail at once with one line."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload = json.dumps(body).encode()
    for attempt in range(retries + 1):
        try:
            req = urllib.request.Request(url, data=payload, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            if err.code not in RETRY_STATUS and err.code < 500:
                detail = err.read().decode("utf-8", "replace")[:200].replace("\n", " ")
                raise RuntimeError(f"{url}: HTTP {err.code} for {what}: {detail}") from None
            problem, wait = f"HTTP {err.code}", retry_after(err.headers)
        except (OSError, http.client.HTTPException, ValueError) as err:  # URLError, timeouts, resets, bad JSON
            problem, wait = type(err).__name__, None
        if attempt == retries:
            raise RuntimeError(f"{url}: {what} failed after {retries + 1} attempts (last: {problem})")
        if wait is None:
            wait = min(MAX_BACKOFF_S, backoff * 2**attempt) * (0.5 + random.random())
        log.warning("%s: %s, retry %d of %d in %.1fs", what, problem, attempt + 1, retries, wait)
        time.sleep(wait)
    raise AssertionError("unreachable")


def retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None

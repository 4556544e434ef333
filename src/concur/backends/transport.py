"""The HTTP exchange of the openai backend (`endpoint`) with an OpenAI-compatible server, through the standard
library's client: GET or POST JSON with retries, server-sent event streams gathered into one answer, and the
server's errors in one line."""

from __future__ import annotations

import http.client
import json
import logging
import random
import time
import urllib.error
import urllib.request

from concur.text import one_line

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 429}  # and every 5xx
MAX_BACKOFF_S = 120.0


class ServerError(RuntimeError):
    """An HTTP error that retrying does not cure (a 4xx other than 408/409/429), in one line."""

    def __init__(self, url: str, status: int, what: str, detail: str):
        super().__init__(f"{url}: HTTP {status} for {what}: {detail}")
        self.status, self.detail = status, detail


class StreamError(ValueError):
    """An event stream cut off before its end, or an error event inside it (retried like a dropped connection)."""


def call(
    url: str,
    body: dict | None,
    key: str | None,
    timeout: float,
    retries: int,
    backoff: float,
    what: str,
    stream: bool = False,
) -> dict:
    """GET (`body` None) or POST JSON, retrying 408/409/429/5xx, timeouts, dropped connections, cut-off bodies and
    streams with exponential backoff and jitter (`Retry-After` in seconds wins); other HTTP errors raise
    ServerError at once. `stream`: the answer is an event stream, gathered by `read_stream`."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload = json.dumps(body).encode() if body is not None else None
    for attempt in range(retries + 1):
        try:
            req = urllib.request.Request(url, data=payload, headers=headers, method="GET" if body is None else "POST")
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                if stream and resp.headers.get_content_type() == "text/event-stream":
                    return read_stream(resp)
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            if err.code not in RETRY_STATUS and err.code < 500:
                raise ServerError(url, err.code, what, error_detail(err)) from None
            problem, wait = f"HTTP {err.code}", retry_after(err.headers)
        except (OSError, http.client.HTTPException, ValueError) as err:  # URLError, timeouts, resets, bad JSON
            problem, wait = describe(err), None
        if attempt == retries:
            raise RuntimeError(f"{url}: {what} failed after {retries + 1} attempts (last: {problem})")
        if wait is None:
            wait = min(MAX_BACKOFF_S, backoff * 2**attempt) * (0.5 + random.random())
        log.warning("%s: %s, retry %d of %d in %.1fs", what, problem, attempt + 1, retries, wait)
        time.sleep(wait)
    raise AssertionError("unreachable")


def read_stream(resp) -> dict:
    """A chat-completions event stream gathered into the shape of a plain answer: per choice index the content and
    reasoning deltas joined and the last finish_reason; the usage chunk when the server sends one. A stream that
    ends, even with `[DONE]`, before every choice has its finish_reason (llama-cpp-python's server ends a stream
    that way when another request arrives, unless started with `--interrupt_requests false`), or that carries an
    error event, raises StreamError."""
    choices: dict[int, dict] = {}
    usage, done = None, False
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments (keep-alive pings), event:/id: fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error") or chunk.get("object") == "error":
            error = chunk.get("error") if isinstance(chunk.get("error"), dict) else chunk
            raise StreamError(f"error event: {one_line(str(error.get('message') or error))}")
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                _add_delta(choices, choice)
    unfinished = [index for index, slot in sorted(choices.items()) if slot["finish_reason"] is None]
    if not choices or unfinished:  # never keep a cut answer as if it were whole
        raise StreamError(
            f"the event stream ended ({'[DONE]' if done else 'closed'}) before choice "
            f"{unfinished[0] if unfinished else 0} finished"
        )
    return {
        "choices": [
            {
                "index": index,
                "finish_reason": slot["finish_reason"],
                "message": {"content": "".join(slot["content"]), "reasoning": "".join(slot["reasoning"]) or None},
            }
            for index, slot in sorted(choices.items())
        ],
        "usage": usage,
    }


def _add_delta(choices: dict[int, dict], choice: dict) -> None:
    """One streamed choice chunk added to its choice's slot: content and reasoning deltas, finish_reason."""
    index = choice["index"] if isinstance(choice.get("index"), int) else 0
    slot = choices.setdefault(index, {"content": [], "reasoning": [], "finish_reason": None})
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
    if delta.get("content"):
        slot["content"].append(delta["content"])
    thought = delta.get("reasoning_content") or delta.get("reasoning")
    if thought:
        slot["reasoning"].append(thought)
    if choice.get("finish_reason"):
        slot["finish_reason"] = choice["finish_reason"]


def error_detail(err: urllib.error.HTTPError) -> str:
    """The message of an error answer, in one line: OpenAI's `error.message`, FastAPI's `detail`, else the body."""
    raw = err.read().decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        message = (inner.get("message") if isinstance(inner, dict) else inner) or data.get("message")
        message = message or data.get("detail")
        if message:
            raw = message if isinstance(message, str) else json.dumps(message)
    return one_line(raw)[:300]


def describe(err: BaseException) -> str:
    reason = err.reason if isinstance(err, urllib.error.URLError) else str(err)
    return one_line(f"{type(err).__name__}: {reason}" if str(reason) else type(err).__name__)


def retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None

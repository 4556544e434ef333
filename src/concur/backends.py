"""Generator backends, shared by synthesis (training candidates) and evaluation (eval candidates).

A backend turns requests (task id + user message) into `Generation`s, `samples` per request. `skip` holds the
(task_id, sample_idx) pairs a checkpoint already has: a backend does not ask its model for those again (replay reads
them anyway; the caller drops them).

* replay: generations made elsewhere (the demo's file).
* transformers: batched Hugging Face sampling, optionally with a peft adapter.
* vllm: offline vLLM (`LLM.chat`, tensor parallel, a LoRA adapter per request); vllm is imported only here.
* openai: any OpenAI-compatible chat-completions endpoint (`vllm serve`, a hosted API), standard library HTTP.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator, Protocol

import pandas as pd

log = logging.getLogger(__name__)

NOTHING: frozenset = frozenset()


@dataclass(frozen=True)
class Request:
    task_id: str
    prompt: str


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


class Backend(Protocol):
    name: str

    def generate(self, requests: list[Request], samples: int,
                 skip: Collection[tuple[str, int]] = NOTHING) -> Iterator[Generation]: ...


def missing_samples(request: Request, samples: int, skip: Collection[tuple[str, int]]) -> list[int]:
    return [i for i in range(samples) if (request.task_id, i) not in skip]


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


# --------------------------------------------------------------------------------------------------------- replay


class ReplayBackend:
    """Generations made elsewhere, from JSONL or parquet rows with `task_id`, `response` and optionally
    `sample_idx` (else the row's order within its task), `reasoning`, `finish_reason`, `seed`."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read_generations(self.path)

    def generate(self, requests: list[Request], samples: int,
                 skip: Collection[tuple[str, int]] = NOTHING) -> Iterator[Generation]:
        wanted = {r.task_id for r in requests}
        by_task: dict[str, int] = {}
        for row in self.rows:
            task_id = row["task_id"]
            if task_id not in wanted:
                continue
            idx = int(row.get("sample_idx", by_task.get(task_id, 0)))
            by_task[task_id] = idx + 1
            if idx >= samples or (task_id, idx) in skip:
                continue
            yield Generation(task_id, idx, row["response"], row.get("finish_reason") or "replay",
                             int(row.get("seed") or 0), row.get("reasoning") or None)
        absent = sorted(wanted - set(by_task))
        if absent:
            log.warning("%s has no generations for %d task(s), e.g. %s", self.path, len(absent), absent[0])


def _read_generations(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: generations file not found")
    if path.suffix == ".parquet":
        rows = pd.read_parquet(path).to_dict("records")
        where = lambda i: f"{path} row {i}"  # noqa: E731
    else:
        rows = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        where = lambda i: f"{path} record {i + 1}"  # noqa: E731
    for i, row in enumerate(rows):
        missing = [k for k in ("task_id", "response") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{where(i)}: missing or non-string {', '.join(missing)}")
    return rows


# --------------------------------------------------------------------------------------------------- transformers


class TransformersBackend:
    """Batched sampling with a Hugging Face model and its chat template (optionally with a peft adapter).
    Sample i of every prompt is drawn with seed `seed + i`, batch by batch; a batch's prompts are read once for all
    its samples."""

    name = "transformers"

    def __init__(self, model_spec: dict, settings: dict, adapter: str | Path | None = None, device: str | None = None):
        import torch

        from .models import load_model, load_tokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.settings = settings
        self.tokenizer = load_tokenizer(model_spec)
        self.tokenizer.padding_side = "left"
        self.model = load_model(model_spec, self.device)
        if adapter:
            from peft import PeftModel

            # folded into the base weights: sampling then costs what the base model costs
            self.model = PeftModel.from_pretrained(self.model, str(adapter)).merge_and_unload()
        self.model.eval()

    def generate(self, requests: list[Request], samples: int,
                 skip: Collection[tuple[str, int]] = NOTHING) -> Iterator[Generation]:
        from tqdm import tqdm

        todo = [(r, missing) for r in requests if (missing := missing_samples(r, samples, skip))]
        size = self.settings["batch_size"]
        batches = [todo[i:i + size] for i in range(0, len(todo), size)]
        for batch in tqdm(batches, desc=f"generate ({samples} samples a prompt)", unit="batch"):
            yield from self._sample_batch(batch)

    def _sample_batch(self, batch: list[tuple[Request, list[int]]]) -> Iterator[Generation]:
        """Every missing sample of a batch of prompts. The prompts are read once: their KV cache is copied for each
        sample (the prompt is most of the compute when answers are short, e.g. `samples` 10 on long tasks)."""
        enc = self._encode([request for request, _ in batch])
        prefix = self._prompt_cache(enc)
        for sample_idx in sorted({i for _, missing in batch for i in missing}):
            rows = [k for k, (_, missing) in enumerate(batch) if sample_idx in missing]
            if len(rows) == len(batch):
                yield from self._sample(batch, rows, enc, prefix, sample_idx)
            else:  # a resumed batch: only some prompts lack this sample
                yield from self._sample(batch, rows, {k: v[rows] for k, v in enc.items()}, None, sample_idx)

    def _encode(self, requests: list[Request]):
        texts = [self.tokenizer.apply_chat_template(chat(r.prompt), tokenize=False, add_generation_prompt=True)
                 for r in requests]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)

    def _prompt_cache(self, enc):
        """The KV cache of every prompt token but the last, at the positions generate() gives them (left padding)."""
        import torch

        mask = enc["attention_mask"]
        if mask.shape[1] < 2:
            return None
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with torch.inference_mode():
            out = self.model(input_ids=enc["input_ids"][:, :-1], attention_mask=mask[:, :-1],
                             position_ids=positions[:, :-1], use_cache=True)
        return out.past_key_values

    def _sample(self, batch, rows: list[int], enc, prefix, sample_idx: int) -> Iterator[Generation]:
        import copy

        import torch
        from transformers import set_seed

        seed = self.settings["seed"] + sample_idx
        temperature = self.settings["temperature"]
        set_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                past_key_values=copy.deepcopy(prefix) if prefix is not None else None,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=self.settings["top_p"] if temperature > 0 else None,
                max_new_tokens=self.settings["max_new_tokens"],
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new_tokens = out[:, enc["input_ids"].shape[1]:]
        eos = self.tokenizer.eos_token_id
        for row, tokens in zip(rows, new_tokens):
            ended = eos is not None and bool((tokens == eos).any())
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            yield Generation(batch[row][0].task_id, sample_idx, text, "stop" if ended else "length", seed)


# ----------------------------------------------------------------------------------------------------------- vllm


class VLLMBackend:
    """Offline vLLM: one engine over `tensor_parallel_size` GPUs, the model's chat template applied by `LLM.chat`,
    all samples of a prompt from one request (`SamplingParams.n`). Prompts go to the engine in chunks of
    `prompts_per_call`, so a killed job loses at most one chunk. With an adapter, LoRA is enabled and every request
    carries a `LoRARequest`.

    Reasoning comes from the `<think>` tags in the text (QwQ's template opens the block itself, so often only
    `</think>` appears; extraction handles both). vLLM's reasoning parsers belong to its server: to use one, serve
    the model with `vllm serve --reasoning-parser …` and use the openai backend, which reads the separate field.
    """

    name = "vllm"

    def __init__(self, generator: dict, model_spec: dict, settings: dict, adapter: str | Path | None = None):
        import vllm

        self.vllm = vllm
        self.settings = settings
        self.adapter = str(adapter) if adapter else None
        self.chunk = int(generator.get("prompts_per_call", 512))
        self.llm = vllm.LLM(**engine_kwargs(generator, model_spec, settings, self.adapter))

    def generate(self, requests: list[Request], samples: int,
                 skip: Collection[tuple[str, int]] = NOTHING) -> Iterator[Generation]:
        todo = [r for r in requests if missing_samples(r, samples, skip)]
        seed = int(self.settings["seed"])
        params = self.vllm.SamplingParams(n=samples, temperature=self.settings["temperature"],
                                          top_p=self.settings["top_p"], max_tokens=self.settings["max_new_tokens"],
                                          seed=seed)
        lora = self._lora_request()
        for start in range(0, len(todo), self.chunk):
            chunk = todo[start:start + self.chunk]
            outputs = self.llm.chat([chat(r.prompt) for r in chunk], params, lora_request=lora)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vllm returned {len(outputs)} outputs for {len(chunk)} prompts")
            for req, out in zip(chunk, outputs):
                yield from completions(req, out, seed)

    def _lora_request(self):
        if not self.adapter:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(Path(self.adapter).name or "adapter", 1, self.adapter)


def engine_kwargs(generator: dict, model_spec: dict, settings: dict, adapter: str | None) -> dict:
    """Arguments of `vllm.LLM`: tensor parallelism over the rule's GPUs unless `tensor_parallel_size` is set."""
    from .models import lora_rank, resolve_path

    kwargs = {"model": resolve_path(model_spec),
              "tensor_parallel_size": generator.get("tensor_parallel_size") or max(1, int(settings.get("gpus") or 1)),
              "dtype": model_spec.get("dtype", "auto"), "seed": int(settings["seed"]),
              "gpu_memory_utilization": generator.get("gpu_memory_utilization", 0.9)}
    for key in ("max_model_len", "max_num_seqs"):
        if generator.get(key):
            kwargs[key] = generator[key]
    if model_spec.get("tokenizer"):
        kwargs["tokenizer"] = model_spec["tokenizer"]
    if model_spec.get("revision"):
        kwargs["revision"] = model_spec["revision"]
    if adapter:
        kwargs["enable_lora"] = True
        kwargs["max_lora_rank"] = generator.get("max_lora_rank") or lora_rank(adapter)
    return kwargs


def completions(req: Request, output, seed: int) -> Iterator[Generation]:
    """Generations from one vLLM RequestOutput (its `outputs` are CompletionOutputs, `index` = sample)."""
    for position, comp in enumerate(output.outputs):
        idx = getattr(comp, "index", position)
        yield Generation(req.task_id, int(idx), comp.text, comp.finish_reason or "unfinished", seed, None,
                         len(comp.token_ids))


# --------------------------------------------------------------------------------------------------------- openai


RETRY_STATUS = {408, 409, 429}  # and every 5xx
MAX_BACKOFF_S = 120.0
MODEL_LIST_TIMEOUT_S = 60.0
# finish_reason of the samples of a prompt the server refused as longer than its context (their response is empty);
# they are not checkpointed, so a rerun asks again (e.g. once the model is served with a longer context)
PROMPT_TOO_LONG = "prompt_too_long"
# how servers word that refusal: OpenAI and llama.cpp (code context_length_exceeded), vLLM ("maximum context
# length", "longer than the maximum model length"), others ("context window", "prompt is too long")
CONTEXT_ERROR = re.compile(r"context[ _]length|context window|maximum model length|prompt is too long", re.I)


class ServerError(RuntimeError):
    """An HTTP error that retrying does not cure (a 4xx other than 408/409/429), in one line."""

    def __init__(self, url: str, status: int, what: str, detail: str):
        super().__init__(f"{url}: HTTP {status} for {what}: {detail}")
        self.status, self.detail = status, detail


class StreamError(ValueError):
    """An event stream cut off before its end, or an error event inside it (retried like a dropped connection)."""


class OpenAIBackend:
    """An OpenAI-compatible chat-completions endpoint, at most `max_concurrency` requests in flight.

    Before any work the server must list `model` (GET /models), so a wrong name, a refused key or an unreachable
    URL fails in one line. With `request_n` (default) one request asks for all of a prompt's missing samples
    (`n`); a server that answers fewer choices (llama.cpp's ignores `n`) is asked again for the rest. Otherwise
    every sample is its own request with seed `seed + sample_idx`. Failed requests are retried (see `call`); a
    request that fails for good stops the job once the requests in flight are answered, so none of them is lost.
    With `stream`, answers come as server-sent events: `request_timeout_s` then bounds the silence between two
    events, not the whole generation, and a killed job's requests are cancelled by the server."""

    name = "openai"

    def __init__(self, generator: dict, settings: dict):
        self.api_key = api_key(generator)
        self.base_url = generator["base_url"].rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = generator["model"]
        self.concurrency = int(generator.get("max_concurrency", 8))
        self.retries = int(generator.get("max_retries", 6))
        self.timeout = float(generator.get("request_timeout_s", 600))
        self.backoff = float(generator.get("backoff_s", 1.0))
        self.request_n = bool(generator.get("request_n", True))
        self.stream = bool(generator.get("stream", False))
        self.settings = settings
        self._warned: set[str] = set()
        if generator.get("check_model", True):
            self.check_model()

    def check_model(self) -> None:
        """GET /models (retried like any request) must list `model`. A server without that route is warned about
        and not checked."""
        url = self.base_url + "/models"
        try:
            data = call(url, None, self.api_key, min(self.timeout, MODEL_LIST_TIMEOUT_S), self.retries, self.backoff,
                        "the list of served models")
        except ServerError as err:
            if err.status not in (404, 405, 501):
                raise
            log.warning("%s: HTTP %d, the server lists no models: model %r not checked", url, err.status, self.model)
            return
        listed = data.get("data") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            raise RuntimeError(f"{url}: the answer is not a list of models (base_url must be the API's root, "
                               f"e.g. http://host:8000/v1)")
        ids = [str(m.get("id")) for m in listed if isinstance(m, dict)]
        if self.model not in ids:
            shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
            raise RuntimeError(f"{url}: the server does not serve model {self.model!r} (it serves: "
                               f"{shown or 'nothing'}); set the generator's `model` to a served name")

    def generate(self, requests: list[Request], samples: int,
                 skip: Collection[tuple[str, int]] = NOTHING) -> Iterator[Generation]:
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
                            for other in futures:
                                other.cancel()
                            running = sum(other.running() for other in futures)
                            if running:
                                log.warning("%s; waiting for the %d request(s) in flight", err, running)
                        continue
                    yield from gens
            finally:
                for fut in futures:
                    fut.cancel()
        if failure is not None:
            raise failure

    def _jobs(self, requests: list[Request], samples: int, skip) -> list[tuple[Request, list[int]]]:
        if self.request_n:
            jobs = [(r, missing_samples(r, samples, skip)) for r in requests]
            return [(r, indices) for r, indices in jobs if indices]
        return [(r, [i]) for i in range(samples) for r in requests if (r.task_id, i) not in skip]

    def _answer(self, req: Request, indices: list[int]) -> list[Generation]:
        """Every sample in `indices`, asking again for those a short answer left out."""
        gens: list[Generation] = []
        todo = list(indices)
        while todo:
            got = self._request(req, todo)
            gens += got
            todo = todo[len(got):]
            if todo:
                self._warn_once("n", "%s answered %d of %d choices (it ignores `n`): asking again for the rest, "
                                "one request per missing sample", self.url, len(got), len(got) + len(todo))
        return gens

    def _request(self, req: Request, indices: list[int]) -> list[Generation]:
        """One request for `indices`: Generations for the first k of them (k = the choices answered, at least 1)."""
        seed = int(self.settings["seed"]) + indices[0]
        body = {"model": self.model, "messages": chat(req.prompt), "temperature": self.settings["temperature"],
                "top_p": self.settings["top_p"], "max_tokens": self.settings["max_new_tokens"], "seed": seed,
                "n": len(indices)}
        if self.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        what = f"{req.task_id} sample {indices[0]}" + (f"-{indices[-1]}" if len(indices) > 1 else "")
        try:
            data = call(self.url, body, self.api_key, self.timeout, self.retries, self.backoff, what, self.stream)
        except ServerError as err:
            if err.status not in (400, 413, 422) or not CONTEXT_ERROR.search(err.detail):
                raise
            log.warning("%s: the server refused the prompt as too long (%s): recorded as %s", what, err.detail,
                        PROMPT_TOO_LONG)
            return [Generation(req.task_id, i, "", PROMPT_TOO_LONG, seed) for i in indices]
        gens = parse_choices(data, req, indices, seed, f"{self.url}: {what}")
        if gens[0].completion_tokens is None:
            self._warn_once("usage", "%s answers without a count of completion tokens (usage): without the "
                            "generator's `tokenizer` completion_tokens will be 0", self.url)
        elif len(gens) > 1:
            self._warn_once("split", "%s counts the tokens of all of a request's choices together: each sample gets "
                            "the mean (set the generator's `tokenizer` for exact counts)", self.url)
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
        raise RuntimeError(f"openai generator {generator.get('model')!r}: environment variable {env} "
                           f"(api_key_env) is not set")
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
    share = lambda count: None if count is None else count // len(choices)  # noqa: E731
    ordered = sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0)
    gens = []
    for idx, choice in zip(indices, ordered):
        msg = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
        gens.append(Generation(req.task_id, idx, msg.get("content") or "", choice.get("finish_reason") or "unknown",
                               seed, reasoning, share(tokens), share(thought)))
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


def call(url: str, body: dict | None, key: str | None, timeout: float, retries: int, backoff: float, what: str,
         stream: bool = False) -> dict:
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
            wait = min(MAX_BACKOFF_S, backoff * 2 ** attempt) * (0.5 + random.random())
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
        data = line[len("data:"):].strip()
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
            if not isinstance(choice, dict):
                continue
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
    unfinished = [index for index, slot in sorted(choices.items()) if slot["finish_reason"] is None]
    if not choices or unfinished:  # never keep a cut answer as if it were whole
        raise StreamError(f"the event stream ended ({'[DONE]' if done else 'closed'}) before choice "
                          f"{unfinished[0] if unfinished else 0} finished")
    return {"choices": [{"index": index, "finish_reason": slot["finish_reason"],
                         "message": {"content": "".join(slot["content"]),
                                     "reasoning": "".join(slot["reasoning"]) or None}}
                        for index, slot in sorted(choices.items())],
            "usage": usage}


def error_detail(err: urllib.error.HTTPError) -> str:
    """The message of an error answer, in one line: OpenAI's `error.message`, FastAPI's `detail`, else the body."""
    raw = err.read().decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        message = (inner.get("message") if isinstance(inner, dict) else inner) or data.get("message") \
            or data.get("detail")
        if message:
            raw = message if isinstance(message, str) else json.dumps(message)
    return one_line(raw)[:300]


def describe(err: BaseException) -> str:
    reason = err.reason if isinstance(err, urllib.error.URLError) else str(err)
    return one_line(f"{type(err).__name__}: {reason}" if str(reason) else type(err).__name__)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


# ------------------------------------------------------------------------------------------------------- factory


def make_backend(generator: dict, model_specs: dict, settings: dict, adapter: str | Path | None = None) -> Backend:
    kind = generator["backend"]
    if kind == "replay":
        return ReplayBackend(generator["path"])
    if kind == "openai":
        if adapter:
            raise ValueError("openai generators cannot apply an adapter; serve it (vllm serve --lora-modules) and "
                             "name it as the generator's model")
        return OpenAIBackend(generator, settings)
    if kind == "vllm":
        return VLLMBackend(generator, model_spec(generator, model_specs), settings,
                           adapter or generator.get("adapter"))
    if kind == "transformers":
        return TransformersBackend(model_spec(generator, model_specs), settings, adapter or generator.get("adapter"))
    raise ValueError(f"unknown generator backend {kind!r}")


def model_spec(generator: dict, model_specs: dict) -> dict:
    name = generator.get("model")
    if name not in model_specs:
        raise ValueError(f"{generator['backend']} generator: model {name!r} is not a `models` entry "
                         f"(entries: {', '.join(sorted(model_specs)) or 'none'})")
    return model_specs[name]

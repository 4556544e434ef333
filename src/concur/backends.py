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
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd

from . import config

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


class Backend(Protocol):
    name: str

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]: ...


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

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
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
            yield Generation(
                task_id,
                idx,
                row["response"],
                row.get("finish_reason") or "replay",
                int(row.get("seed") or 0),
                row.get("reasoning") or None,
            )
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

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        from tqdm import tqdm

        todo = [(r, missing) for r in requests if (missing := missing_samples(r, samples, skip))]
        size = self.settings["batch_size"]
        batches = [todo[i : i + size] for i in range(0, len(todo), size)]
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
        texts = [
            self.tokenizer.apply_chat_template(chat(r.prompt), tokenize=False, add_generation_prompt=True)
            for r in requests
        ]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)

    def _prompt_cache(self, enc):
        """The KV cache of every prompt token but the last, at the positions generate() gives them (left padding)."""
        import torch

        mask = enc["attention_mask"]
        if mask.shape[1] < 2:
            return None
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with torch.inference_mode():
            out = self.model(
                input_ids=enc["input_ids"][:, :-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, :-1],
                use_cache=True,
            )
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
        new_tokens = out[:, enc["input_ids"].shape[1] :]
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
        generator = config.with_defaults("generator", generator)
        self.chunk = int(generator["prompts_per_call"])
        self.llm = vllm.LLM(**engine_kwargs(generator, model_spec, settings, self.adapter))

    def generate(
        self, requests: list[Request], samples: int, skip: Collection[tuple[str, int]] = NOTHING
    ) -> Iterator[Generation]:
        todo = [r for r in requests if missing_samples(r, samples, skip)]
        seed = int(self.settings["seed"])
        params = self.vllm.SamplingParams(
            n=samples,
            temperature=self.settings["temperature"],
            top_p=self.settings["top_p"],
            max_tokens=self.settings["max_new_tokens"],
            seed=seed,
        )
        lora = self._lora_request()
        for start in range(0, len(todo), self.chunk):
            chunk = todo[start : start + self.chunk]
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

    generator = config.with_defaults("generator", generator)
    kwargs = {
        "model": resolve_path(model_spec),
        "tensor_parallel_size": generator.get("tensor_parallel_size") or max(1, int(settings.get("gpus") or 1)),
        "dtype": model_spec.get("dtype", "auto"),
        "seed": int(settings["seed"]),
        "gpu_memory_utilization": generator["gpu_memory_utilization"],
    }
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
        yield Generation(
            req.task_id, int(idx), comp.text, comp.finish_reason or "unfinished", seed, None, len(comp.token_ids)
        )


# --------------------------------------------------------------------------------------------------------- openai


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


# ------------------------------------------------------------------------------------------------------- factory


def make_backend(generator: dict, model_specs: dict, settings: dict, adapter: str | Path | None = None) -> Backend:
    kind = generator["backend"]
    if kind == "replay":
        return ReplayBackend(generator["path"])
    if kind == "openai":
        if adapter:
            raise ValueError(
                "openai generators cannot apply an adapter; serve it (vllm serve --lora-modules) and "
                "name it as the generator's model"
            )
        return OpenAIBackend(generator, settings)
    if kind == "vllm":
        return VLLMBackend(generator, model_spec(generator, model_specs), settings, adapter or generator.get("adapter"))
    if kind == "transformers":
        return TransformersBackend(model_spec(generator, model_specs), settings, adapter or generator.get("adapter"))
    raise ValueError(f"unknown generator backend {kind!r}")


def model_spec(generator: dict, model_specs: dict) -> dict:
    name = generator.get("model")
    if name not in model_specs:
        raise ValueError(
            f"{generator['backend']} generator: model {name!r} is not a `models` entry "
            f"(entries: {', '.join(sorted(model_specs)) or 'none'})"
        )
    return model_specs[name]

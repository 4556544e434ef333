"""The synthesize stage: prompts for tasks -> generations from a backend -> the candidates contract.

Backends yield `Generation`s; everything after (extraction, token counts, ids) is shared, so training candidates and
evaluation candidates are produced by the same code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Protocol

import pandas as pd

from . import contracts
from .extract import extract
from .prompts import build_prompt

log = logging.getLogger(__name__)


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
    completion_tokens: int | None = None  # the server's count, used when no tokenizer is configured


class Backend(Protocol):
    name: str

    def generate(self, requests: list[Request], samples: int) -> Iterator[Generation]: ...


def candidate_id(generator: str, task_id: str, sample_idx: int) -> str:
    return hashlib.sha256(f"{generator}\x1f{task_id}\x1f{sample_idx}".encode()).hexdigest()[:16]


class ReplayBackend:
    """Generations made elsewhere, from JSONL or parquet rows with `task_id`, `response` and optionally
    `sample_idx` (else the row's order within its task), `reasoning`, `finish_reason`, `seed`."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read_generations(self.path)

    def generate(self, requests: list[Request], samples: int) -> Iterator[Generation]:
        wanted = {r.task_id for r in requests}
        by_task: dict[str, int] = {}
        for row in self.rows:
            task_id = row["task_id"]
            if task_id not in wanted:
                continue
            idx = int(row.get("sample_idx", by_task.get(task_id, 0)))
            by_task[task_id] = idx + 1
            if idx >= samples:
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


class TransformersBackend:
    """Batched sampling with a Hugging Face model and its chat template (optionally with a peft adapter)."""

    name = "transformers"
    done: set = frozenset()

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

            self.model = PeftModel.from_pretrained(self.model, str(adapter))
        self.model.eval()

    def generate(self, requests: list[Request], samples: int) -> Iterator[Generation]:
        from tqdm import tqdm

        size = self.settings["batch_size"]
        batches = [requests[i:i + size] for i in range(0, len(requests), size)]
        with tqdm(total=len(batches) * samples, desc="generate", unit="batch") as bar:
            for sample_idx in range(samples):
                seed = self.settings["seed"] + sample_idx
                for batch in batches:
                    if all((r.task_id, sample_idx) in self.done for r in batch):
                        bar.update()
                        continue
                    yield from self._sample(batch, sample_idx, seed)
                    bar.update()

    def _sample(self, batch: list[Request], sample_idx: int, seed: int) -> Iterator[Generation]:
        import torch
        from transformers import set_seed

        texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": r.prompt}], tokenize=False,
                                                    add_generation_prompt=True) for r in batch]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        temperature = self.settings["temperature"]
        set_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=self.settings["top_p"] if temperature > 0 else None,
                max_new_tokens=self.settings["max_new_tokens"],
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new_tokens = out[:, enc["input_ids"].shape[1]:]
        eos = self.tokenizer.eos_token_id
        for req, tokens in zip(batch, new_tokens):
            ended = eos is not None and bool((tokens == eos).any())
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            yield Generation(req.task_id, sample_idx, text, "stop" if ended else "length", seed)


class VLLMBackend:
    """Offline batched sampling with vLLM (imported lazily; optionally with a LoRA adapter)."""

    name = "vllm"
    done: set = frozenset()

    def __init__(self, generator: dict, model_spec: dict, settings: dict, adapter: str | Path | None = None):
        import vllm

        self.vllm = vllm
        self.settings = settings
        self.adapter = str(adapter) if adapter else None
        tp = generator.get("tensor_parallel_size") or max(1, int(settings.get("gpus") or 1))
        kwargs = {"model": model_spec["path"], "tensor_parallel_size": tp, "dtype": model_spec.get("dtype", "auto"),
                  "seed": settings["seed"], "enable_lora": self.adapter is not None,
                  "gpu_memory_utilization": generator.get("gpu_memory_utilization", 0.9)}
        for key in ("max_model_len",):
            if generator.get(key):
                kwargs[key] = generator[key]
        if model_spec.get("tokenizer"):
            kwargs["tokenizer"] = model_spec["tokenizer"]
        if model_spec.get("revision"):
            kwargs["revision"] = model_spec["revision"]
        if self.adapter and generator.get("max_lora_rank"):
            kwargs["max_lora_rank"] = generator["max_lora_rank"]
        self.llm = vllm.LLM(**kwargs)

    def generate(self, requests: list[Request], samples: int) -> Iterator[Generation]:
        todo = [r for r in requests if any((r.task_id, i) not in self.done for i in range(samples))]
        if not todo:
            return
        seed = self.settings["seed"]
        params = self.vllm.SamplingParams(n=samples, temperature=self.settings["temperature"],
                                          top_p=self.settings["top_p"], max_tokens=self.settings["max_new_tokens"],
                                          seed=seed)
        lora = None
        if self.adapter:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest("adapter", 1, self.adapter)
        conversations = [[{"role": "user", "content": r.prompt}] for r in todo]
        outputs = self.llm.chat(conversations, params, lora_request=lora)
        for req, out in zip(todo, outputs):
            for idx, comp in enumerate(out.outputs):
                yield Generation(req.task_id, idx, comp.text, comp.finish_reason or "unknown", seed, None,
                                 len(comp.token_ids))


RETRY_STATUS = {429, 500, 502, 503, 504}


class OpenAIBackend:
    """Any OpenAI-compatible chat-completions endpoint; one request per sample, at most `max_concurrency` in flight."""

    name = "openai"
    done: set = frozenset()

    def __init__(self, generator: dict, settings: dict):
        env = generator.get("api_key_env")
        self.api_key = None
        if env:
            self.api_key = os.environ.get(env)
            if not self.api_key:
                raise RuntimeError(f"openai generator: environment variable {env} (api_key_env) is not set")
        self.url = generator["base_url"].rstrip("/") + "/chat/completions"
        self.model = generator["model"]
        self.concurrency = int(generator.get("max_concurrency", 8))
        self.retries = int(generator.get("max_retries", 6))
        self.timeout = float(generator.get("request_timeout_s", 600))
        self.backoff = float(generator.get("backoff_s", 1.0))
        self.settings = settings

    def generate(self, requests: list[Request], samples: int) -> Iterator[Generation]:
        jobs = [(r, i) for i in range(samples) for r in requests if (r.task_id, i) not in self.done]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._one, r, i) for r, i in jobs]
            try:
                for fut in as_completed(futures):
                    yield fut.result()
            finally:
                for fut in futures:
                    fut.cancel()

    def _one(self, req: Request, sample_idx: int) -> Generation:
        seed = self.settings["seed"] + sample_idx
        body = {"model": self.model, "messages": [{"role": "user", "content": req.prompt}],
                "temperature": self.settings["temperature"], "top_p": self.settings["top_p"],
                "max_tokens": self.settings["max_new_tokens"], "seed": seed, "n": 1}
        data = self._post(body, f"{req.task_id} sample {sample_idx}")
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
        usage = data.get("usage") or {}
        return Generation(req.task_id, sample_idx, msg.get("content") or "", choice.get("finish_reason") or "unknown",
                          seed, reasoning, usage.get("completion_tokens"))

    def _post(self, body: dict, what: str) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            wait = None
            try:
                req = urllib.request.Request(self.url, data=payload, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as err:
                if err.code not in RETRY_STATUS:
                    detail = err.read().decode("utf-8", "replace")[:200].replace("\n", " ")
                    raise RuntimeError(f"{self.url}: HTTP {err.code} for {what}: {detail}") from None
                problem = f"HTTP {err.code}"
                after = err.headers.get("Retry-After") if err.headers else None
                try:
                    wait = float(after) if after is not None else None
                except ValueError:
                    wait = None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                problem = type(err).__name__
            if attempt == self.retries:
                raise RuntimeError(f"{self.url}: {what} failed after {self.retries + 1} attempts ({problem})")
            if wait is None:
                wait = self.backoff * 2 ** attempt * (0.5 + random.random())
            log.warning("%s: %s, retry %d in %.1fs", what, problem, attempt + 1, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")


def make_backend(generator: dict, model_specs: dict, settings: dict, adapter: str | Path | None = None) -> Backend:
    if generator["backend"] == "replay":
        return ReplayBackend(generator["path"])
    if generator["backend"] == "openai":
        return OpenAIBackend(generator, settings)
    if generator["backend"] == "vllm":
        return VLLMBackend(generator, model_specs[generator["model"]], settings, adapter or generator.get("adapter"))
    if generator["backend"] == "transformers":
        return TransformersBackend(model_specs[generator["model"]], settings, adapter or generator.get("adapter"))
    raise ValueError(f"unknown generator backend {generator['backend']!r}")


def to_candidates(generations: Iterable[Generation], prompts: dict[str, str], generator: str, backend: str,
                  tokenizer) -> pd.DataFrame:
    """Extract reasoning/answer/code and count tokens; one row per generation, in contracts.CANDIDATES."""
    rows = []
    for gen in generations:
        parts = extract(gen.response, gen.reasoning)
        full = gen.response if gen.reasoning is None else gen.reasoning + gen.response
        rows.append({
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
            "reasoning_tokens": _count(tokenizer, parts.reasoning) if tokenizer is not None else 0,
            "completion_tokens": (_count(tokenizer, full) if tokenizer is not None
                                  else int(gen.completion_tokens or 0)),
            "finish_reason": gen.finish_reason,
            "seed": gen.seed,
        })
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


def read_checkpoint(path: Path) -> dict[tuple[str, int], Generation]:
    """Generations a previous run of this job finished; a truncated last line is ignored."""
    done: dict[tuple[str, int], Generation] = {}
    if not path.is_file():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            gen = Generation(**json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
        done[(gen.task_id, gen.sample_idx)] = gen
    return done


def _generate_resumable(backend, requests: list[Request], samples: int, checkpoint: Path | None) -> list[Generation]:
    if checkpoint is None:
        return list(backend.generate(requests, samples))
    done = read_checkpoint(checkpoint)
    if done:
        log.info("resuming from %s: %d samples already answered", checkpoint, len(done))
    backend.done = set(done)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    with open(checkpoint, "a", encoding="utf-8") as fh:
        if fh.tell() and checkpoint.read_bytes()[-1:] != b"\n":
            fh.write("\n")  # a line cut short by a killed job stays on its own line and is ignored
        for gen in backend.generate(requests, samples):
            key = (gen.task_id, gen.sample_idx)
            if key in done:
                continue
            done[key] = gen
            fh.write(json.dumps(asdict(gen)) + "\n")
            fh.flush()
    return list(done.values())


def generate_candidates(tasks: pd.DataFrame, generator_name: str, generator: dict, model_specs: dict,
                        settings: dict, language: str, samples: int, adapter: str | Path | None = None,
                        checkpoint: str | Path | None = None) -> pd.DataFrame:
    """Prompts for `tasks`, generations from the generator, candidates out. With `checkpoint`, every finished
    sample is appended to that JSONL and samples already in it are not generated again."""
    from .models import load_tokenizer

    prompts = {row.task_id: build_prompt(row.code, language) for row in tasks.itertuples()}
    requests = [Request(task_id, prompt) for task_id, prompt in prompts.items()]
    backend = make_backend(generator, model_specs, settings, adapter)
    if generator["backend"] == "replay":
        token_name = generator["tokenizer"]
    elif generator["backend"] in ("openai", "vllm"):
        token_name = generator.get("tokenizer")
    else:
        token_name = generator["model"]
    tokenizer = load_tokenizer(model_specs[token_name]) if token_name else None
    generations = _generate_resumable(backend, requests, samples, Path(checkpoint) if checkpoint else None)
    log.info("%s: %d generations for %d tasks", generator_name, len(generations), len(requests))
    return to_candidates(generations, prompts, generator_name, backend.name, tokenizer)


def run(tasks_path: str, shard: int, n_shards: int, generator_name: str, config: dict, out_path: str) -> None:
    """The synthesize stage for one shard of the training tasks."""
    from .io import write_parquet
    from .tasks import select_shard

    settings = config["synthesize"]
    tasks = select_shard(pd.read_parquet(tasks_path), shard, n_shards)
    frame = generate_candidates(tasks, generator_name, config["generators"][generator_name], config["models"],
                                settings, settings["language"], settings["samples_per_task"],
                                checkpoint=checkpoint_path(out_path))
    write_parquet(frame, out_path)
    checkpoint_path(out_path).unlink(missing_ok=True)

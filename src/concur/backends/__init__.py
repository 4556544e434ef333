"""Generator backends, shared by synthesis (training candidates) and evaluation (eval candidates).

A backend turns requests (task id + user message) into `Generation`s (`base`):

* replay: generations made elsewhere (the demo's file), every turn of a trajectory from its own rows.
* transformers: batched Hugging Face sampling, optionally with a peft adapter (`local`).
* vllm: offline vLLM (`LLM.chat`, tensor parallel, a LoRA adapter per request; `local`).
* openai: any OpenAI-compatible chat-completions endpoint (`vllm serve`, llama.cpp's server, a hosted API),
  standard library HTTP (`endpoint`; its requests, retries and event streams: `transport`).

A refinement turn's request carries the trajectory's earlier messages (`Request.history`): transformers, vllm and
openai send them as one multi-turn chat.
"""

from __future__ import annotations

from pathlib import Path

from .base import (
    NOTHING,
    PROMPT_TOO_LONG,
    Backend,
    Generation,
    Request,
    Skipped,
    chat,
    messages,
    missing_samples,
    wanted_samples,
)
from .endpoint import OpenAIBackend, api_key, parse_choices, usage_counts
from .local import TransformersBackend, VLLMBackend, completions, engine_kwargs
from .replay import ReplayBackend
from .transport import ServerError, StreamError, call, read_stream, retry_after

__all__ = [
    "NOTHING",
    "PROMPT_TOO_LONG",
    "Backend",
    "Generation",
    "OpenAIBackend",
    "ReplayBackend",
    "Request",
    "ServerError",
    "Skipped",
    "StreamError",
    "TransformersBackend",
    "VLLMBackend",
    "api_key",
    "call",
    "chat",
    "completions",
    "engine_kwargs",
    "make_backend",
    "messages",
    "missing_samples",
    "model_spec",
    "parse_choices",
    "read_stream",
    "retry_after",
    "usage_counts",
    "wanted_samples",
]


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

"""Backends that run the model in the job's own process: transformers (batched Hugging Face sampling, optionally
with a peft adapter) and vllm (offline `LLM.chat`, tensor parallel, a LoRA adapter per request; vllm is imported
only here)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

from .. import config
from .base import NOTHING, Generation, Request, messages, missing_samples, wanted_samples


class TransformersBackend:
    """Batched sampling with a Hugging Face model and its chat template (optionally with a peft adapter).
    Sample i of every prompt is drawn with seed `seed + i`, batch by batch; a batch's prompts are read once for all
    its samples."""

    name = "transformers"

    def __init__(self, model_spec: dict, settings: dict, adapter: str | Path | None = None, device: str | None = None):
        import torch

        from ..models import load_model, load_tokenizer

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

    def own_tokenizer(self):
        """The model's tokenizer, for counting tokens."""
        return self.tokenizer

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
            self.tokenizer.apply_chat_template(messages(r), tokenize=False, add_generation_prompt=True)
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
        lora = self._lora_request()
        for start in range(0, len(todo), self.chunk):
            chunk = todo[start : start + self.chunk]
            # every sample a request asks for (a refinement turn: its trajectory's one), drawn in one request
            wanted = [wanted_samples(r, samples) for r in chunk]
            params = [self._params(len(indices), seed) for indices in wanted]
            same = len({len(indices) for indices in wanted}) == 1
            outputs = self.llm.chat([messages(r) for r in chunk], params[0] if same else params, lora_request=lora)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vllm returned {len(outputs)} outputs for {len(chunk)} prompts")
            for req, out, indices in zip(chunk, outputs, wanted):
                yield from completions(req, out, seed, indices)

    def _params(self, n: int, seed: int):
        return self.vllm.SamplingParams(
            n=n,
            temperature=self.settings["temperature"],
            top_p=self.settings["top_p"],
            max_tokens=self.settings["max_new_tokens"],
            seed=seed,
        )

    def own_tokenizer(self):
        """The engine's tokenizer (the model's own), for counting tokens."""
        return self.llm.get_tokenizer()

    def _lora_request(self):
        if not self.adapter:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(Path(self.adapter).name or "adapter", 1, self.adapter)


def engine_kwargs(generator: dict, model_spec: dict, settings: dict, adapter: str | None) -> dict:
    """Arguments of `vllm.LLM`: tensor parallelism over the rule's GPUs unless `tensor_parallel_size` is set."""
    from ..models import lora_rank, resolve_path

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


def completions(req: Request, output, seed: int, indices: list[int] | None = None) -> Iterator[Generation]:
    """Generations from one vLLM RequestOutput (its `outputs` are CompletionOutputs, `index` = the position among
    the request's samples: sample `indices[index]`, or `index` itself without `indices`)."""
    for position, comp in enumerate(output.outputs):
        idx = int(getattr(comp, "index", position))
        idx = indices[idx] if indices is not None else idx
        yield Generation(
            req.task_id, idx, comp.text, comp.finish_reason or "unfinished", seed, None, len(comp.token_ids)
        )

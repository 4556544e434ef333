"""LoRA supervised fine-tuning on the curated SFT records (docs/data.md §5 in, §6 out).

The loss covers the assistant turn only: every record is tokenised twice with the model's chat template, once up to
the generation prompt and once in full; the first is a prefix of the second and is masked out (label -100).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments, set_seed

from concur import io
from concur.models import load_model, load_tokenizer

IGNORE_INDEX = -100  # label value the cross-entropy loss skips
CHECKPOINTS = "checkpoints"
FINGERPRINT = "fingerprint.txt"  # in the checkpoint folder: sha256 of what its checkpoints were trained on
LOGGER = logging.getLogger("concur.train")

DEFAULTS: dict[str, Any] = {
    "lora": {
        "r": 32,
        "alpha": 32,
        "dropout": 0.05,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    },
    "epochs": 3,
    "learning_rate": 1.0e-4,
    "lr_scheduler": "cosine",
    "warmup_ratio": 0.03,
    "max_length": 16384,
    "batch_size": 1,
    "gradient_accumulation_steps": 8,
    "seed": 0,
    "gpus": 0,
}


# ---------------------------------------------------------------------------------------------------------------
# Tokenisation and loss masking


def masked_example(tokenizer, messages: list[dict], max_length: int) -> dict[str, list[int]]:
    """input_ids / labels / attention_mask of one conversation; labels are -100 except on the last (assistant) turn.

    Truncated to `max_length` tokens, keeping the start; when the prompt alone fills it, no label is left.
    """
    _check_messages(messages)
    prompt_ids = _chat_ids(tokenizer, messages[:-1], add_generation_prompt=True)
    full_ids = _chat_ids(tokenizer, messages, add_generation_prompt=False)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise ValueError(
            "chat template: the tokens of the prompt (with the generation prompt) are not a prefix of the tokens of "
            "the full conversation, so the assistant part cannot be masked; use a template that renders the "
            "assistant turn after the generation prompt unchanged"
        )
    input_ids = full_ids[:max_length]
    n_prompt = min(len(prompt_ids), len(input_ids))
    labels = [IGNORE_INDEX] * n_prompt + input_ids[n_prompt:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def _chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or len(messages) < 2:
        raise ValueError(f"messages: expected a list of at least 2 turns ending with the assistant, got {messages!r:.80}")
    if messages[-1].get("role") != "assistant":
        raise ValueError(f"messages: the last turn must have role 'assistant', not {messages[-1].get('role')!r}")


def encode_records(records: list[dict], tokenizer, max_length: int) -> tuple[list[dict], int]:
    """Masked examples of the records that keep at least one target token, and the count of those dropped."""
    examples, n_dropped = [], 0
    for index, record in enumerate(records):
        try:
            example = masked_example(tokenizer, record["messages"], max_length)
        except (KeyError, ValueError) as error:
            raise ValueError(f"SFT record {record.get('candidate_id', index)!r}: {error}") from None
        if n_target_tokens(example) == 0:
            n_dropped += 1
        else:
            examples.append(example)
    return examples, n_dropped


def n_target_tokens(example: dict) -> int:
    return sum(label != IGNORE_INDEX for label in example["labels"])


def pad_batch(examples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: pad id in input_ids, 0 in attention_mask, -100 in labels (padding is never a target)."""
    width = max(len(e["input_ids"]) for e in examples)
    fill = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "attention_mask": 0}
    return {
        key: torch.tensor([e[key] + [value] * (width - len(e[key])) for e in examples], dtype=torch.long)
        for key, value in fill.items()
    }


class _Examples(torch.utils.data.Dataset):
    def __init__(self, examples: list[dict]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        return self.examples[index]


# ---------------------------------------------------------------------------------------------------------------
# Training


def run(dataset_path: str, model_spec: dict, settings: dict, out_dir: str) -> dict:
    """The train stage: one adapter on a curated table (docs/data.md §5 rows).

    Snakemake deletes a `directory()` output before rerunning its job, so checkpoints live next to it, in
    `.{name}.checkpoints`, where a killed run finds them again.
    """
    from .curate import sft_record

    records = [sft_record(row) for row in pd.read_parquet(dataset_path).to_dict("records")]
    out = Path(out_dir)
    return train_adapter(records, model_spec, settings, out, checkpoint_dir=out.parent / f".{out.name}.checkpoints")


def train_adapter(
    records: list[dict],
    model_spec: dict,
    settings: dict,
    out_dir: Path,
    log_path: Path | None = None,
    checkpoint_dir: Path | None = None,
) -> dict:
    """Train a LoRA adapter on `records`; write it, the tokenizer, train_log.jsonl and train_summary.json to out_dir.

    Resumes from the last complete checkpoint in `checkpoint_dir` (default out_dir/checkpoints) when it was made
    with the same records, model and settings (epochs aside: asking for more epochs continues). Returns the summary.
    """
    started = time.time()
    settings = _with_defaults(settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else out_dir / CHECKPOINTS
    tokenizer = load_tokenizer(model_spec)
    examples, n_dropped = encode_records(records, tokenizer, settings["max_length"])
    if not examples:
        raise ValueError(
            f"no SFT record keeps an assistant token within max_length={settings['max_length']} "
            f"({len(records)} records, {n_dropped} dropped)"
        )
    device = _device(settings["gpus"])
    resume = _usable_checkpoint(checkpoint_dir, _fingerprint(records, model_spec, settings), log_path)
    trainer = _build_trainer(examples, model_spec, settings, tokenizer, checkpoint_dir, device, log_path)
    _note(log_path, f"train: {len(examples)} examples ({n_dropped} dropped) on {device}, resume from {resume}")
    with warnings.catch_warnings():
        # peft looks for the base model's config.json to check the vocabulary; a GGUF folder has none
        warnings.filterwarnings("ignore", message="Could not find a config file in")
        trainer.train(resume_from_checkpoint=resume)
        _save_adapter(trainer.model, tokenizer, out_dir)

    log = step_log(trainer.state.log_history)
    summary = _summary(records, examples, n_dropped, trainer.state.global_step, log, model_spec, settings, device)
    summary["runtime_s"] = round(time.time() - started, 3)
    io.write_jsonl(log, out_dir / "train_log.jsonl")
    io.write_json(summary, out_dir / "train_summary.json")  # written last: marks a finished adapter
    _note(log_path, f"train: done, {summary['steps']} steps, final loss {summary['final_loss']}")
    return summary


def _summary(records, examples, n_dropped, steps, log, model_spec, settings, device) -> dict:
    return {
        "n_records": len(records),
        "n_dropped": n_dropped,
        "n_examples": len(examples),
        "n_target_tokens": sum(n_target_tokens(e) for e in examples),  # per epoch
        "steps": steps,
        "epochs": settings["epochs"],
        "final_loss": log[-1]["loss"] if log else None,
        "device": device,
        "base_model": dict(model_spec),
        "lora": dict(settings["lora"]),
    }


def _with_defaults(settings: dict) -> dict:
    merged = {**DEFAULTS, **settings}
    merged["lora"] = {**DEFAULTS["lora"], **settings.get("lora", {})}
    return merged


def _device(gpus: int) -> str:
    return "cuda" if gpus and torch.cuda.is_available() else "cpu"


def _build_trainer(examples, model_spec, settings, tokenizer, checkpoint_dir: Path, device: str, log_path):
    set_seed(settings["seed"])  # before LoRA init, so the adapter's starting weights are reproducible
    model = _lora_model(load_model(model_spec, device=device), settings["lora"])
    trainer = _TargetTokenTrainer(
        model=model,
        args=_training_arguments(settings, checkpoint_dir, on_cuda=device == "cuda"),
        train_dataset=_Examples(examples),
        data_collator=functools.partial(pad_batch, pad_token_id=tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[_ProgressCallback(log_path)],
    )
    trainer.remove_callback(PrinterCallback)  # one JSON line per step goes to train_log.jsonl instead
    return trainer


def _lora_model(model, lora: dict):
    from peft import LoraConfig, get_peft_model

    model.config.use_cache = False  # no KV cache while training (and required with gradient checkpointing)
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]),
    )
    return get_peft_model(model, config)


def _training_arguments(settings: dict, checkpoint_dir: Path, on_cuda: bool):
    kwargs = dict(
        output_dir=str(checkpoint_dir),
        num_train_epochs=settings["epochs"],
        learning_rate=settings["learning_rate"],
        lr_scheduler_type=settings["lr_scheduler"],
        per_device_train_batch_size=settings["batch_size"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"],
        seed=settings["seed"],
        bf16=on_cuda,
        use_cpu=not on_cuda,
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="epoch",
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_pin_memory=on_cuda,
        **_version_kwargs(settings["warmup_ratio"], checkpointing=on_cuda),
    )
    return TrainingArguments(**kwargs)


def _version_kwargs(warmup_ratio: float, checkpointing: bool) -> dict:
    """Length grouping, warmup and gradient checkpointing are spelled differently in transformers 4.x and 5.x."""
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kwargs: dict[str, Any] = {}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    kwargs[f"{prefix}_checkpointing"] = checkpointing
    if checkpointing:  # non-reentrant: works with a frozen base model (LoRA) without enable_input_require_grads
        kwargs[f"{prefix}_checkpointing_kwargs"] = {"use_reentrant": False}
    if "train_sampling_strategy" in fields:
        kwargs["train_sampling_strategy"] = "group_by_length"
    else:
        kwargs["group_by_length"] = True
    if "warmup_ratio" in fields:
        kwargs["warmup_ratio"] = warmup_ratio
    else:  # 5.x: a float below 1 is a ratio of the total steps; 1.0 would mean "1 step"
        kwargs["warmup_steps"] = min(float(warmup_ratio), 0.9999)
    return kwargs


def _fingerprint(records: list[dict], model_spec: dict, settings: dict) -> str:
    """What a checkpoint must have been trained on to be resumed (epochs, GPU count and the adapter list aside)."""
    kept = {key: value for key, value in settings.items() if key not in ("epochs", "gpus", "adapters")}
    material = {"records": records, "model": model_spec, "settings": kept}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _usable_checkpoint(checkpoint_dir: Path, fingerprint: str, log_path: Path | None) -> str | None:
    """The checkpoint to resume from, or None; checkpoints of other data or settings are deleted, not resumed."""
    stamp = checkpoint_dir / FINGERPRINT
    previous = stamp.read_text().strip() if stamp.is_file() else None
    resume = last_checkpoint(checkpoint_dir)
    if resume and previous != fingerprint:
        _note(log_path, f"train: {checkpoint_dir} holds checkpoints of other records or settings; starting afresh")
        for folder in checkpoint_dir.glob("checkpoint-*"):
            shutil.rmtree(folder)
        resume = None
    io.write_text(fingerprint + "\n", stamp)
    return resume


def last_checkpoint(checkpoint_dir: Path) -> str | None:
    """The highest-step checkpoint-N folder holding trainer_state.json (written last, so the save completed)."""
    if not checkpoint_dir.is_dir():
        return None
    steps = {}
    for folder in checkpoint_dir.iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", folder.name)
        if match and (folder / "trainer_state.json").is_file():
            steps[int(match.group(1))] = folder
    return str(steps[max(steps)]) if steps else None


def step_log(log_history: list[dict]) -> list[dict]:
    """One record per optimizer step from the Trainer's log history (the run-summary entry has no `loss`)."""
    keys = ("step", "epoch", "loss", "learning_rate", "tokens")
    return [{key: entry.get(key) for key in keys} for entry in log_history if "loss" in entry]


def _save_adapter(model, tokenizer, out_dir: Path) -> None:
    """Write the adapter and tokenizer to a temporary folder, then move each file in with an atomic rename.

    adapter_config.json moves last among them, so a visible config always sits next to complete weights.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".adapter.", dir=out_dir))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        files = sorted(staging.iterdir(), key=lambda p: p.name == "adapter_config.json")
        for path in files:
            if path.is_dir():
                raise RuntimeError(f"unexpected folder {path.name!r} in the saved adapter")
            os.replace(path, out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _note(log_path: Path | None, line: str) -> None:
    """Progress to the `concur.train` logger and, when given, appended to `log_path`."""
    LOGGER.info(line)
    if log_path is None:
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(line.rstrip("\n") + "\n")


class _TargetTokenTrainer(Trainer):
    """Counts the target (labelled) tokens trained on and adds the running total to each step's log as `tokens`."""

    target_tokens: int | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            if self.target_tokens is None:  # first batch of this run: continue a resumed run's count
                self.target_tokens = _last_logged_tokens(self.state.log_history)
            self.target_tokens += int((inputs["labels"] != IGNORE_INDEX).sum())
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["tokens"] = self.target_tokens or 0
        super().log(logs, start_time)


def _last_logged_tokens(log_history: list[dict]) -> int:
    counts = [entry["tokens"] for entry in log_history if "tokens" in entry]
    return counts[-1] if counts else 0


class _ProgressCallback(TrainerCallback):
    """One short line per optimizer step (see _note)."""

    def __init__(self, log_path: Path):
        self.log_path = log_path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            line = "step {} epoch {:.2f} loss {:.4f} lr {:.3g} tokens {}".format(
                state.global_step, logs.get("epoch", 0), logs["loss"], logs.get("learning_rate", 0), logs.get("tokens"))
            _note(self.log_path, line)

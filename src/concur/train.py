"""LoRA supervised fine-tuning on the curated SFT records (docs/data.md §5 in, §6 out), with TRL's SFTTrainer.

Loss masking. Each record goes to the trainer as a conversational prompt/completion pair (the user turn, then the
assistant turn), so TRL tokenises both with the model's chat template and puts the loss on the completion only.
Every record is also tokenised here first (`masked_example`): TRL only warns when the tokens of the prompt are not a
prefix of the tokens of the whole conversation, and then trains on a context generation never sees; we refuse such a
template, drop the records whose prompt alone fills `max_length`, and check that TRL labelled exactly the tokens we
expect (`_check_labels`).

Batches. `packing: true` packs examples into rows of up to `max_length` tokens (TRL's best-fit decreasing) and
flattens a batch into one padding-free row whose position ids restart at 0 for every example. With no attention mask,
transformers derives a block-diagonal causal mask from those position ids (sdpa and eager attention;
flash-attention uses the sequence boundaries TRL passes), so no example attends to another: tests/test_train.py
checks an example's logits inside a packed row against the same example alone. `packing: false`: padded batches of
examples of similar length (length-grouped sampler).

Devices. One process on the CPU (`gpus: 0`) or one GPU (bf16 autocast, non-reentrant gradient checkpointing). With
`gpus` > 1 `run` starts `accelerate launch` with that many processes and the accelerate config of `distributed`
(configs/accelerate/); each process runs `train_adapter`, and only the main process writes outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments, set_seed
from trl import SFTConfig, SFTTrainer

from concur import io
from concur.models import load_model, load_tokenizer

IGNORE_INDEX = -100  # label value the cross-entropy loss skips
CHECKPOINTS = "checkpoints"
FINGERPRINT = "fingerprint.txt"  # in the checkpoint folder: sha256 of what its checkpoints were trained on
LAUNCH_FILE = "launch.json"  # in the checkpoint folder: what the processes of a multi-GPU launch train
LOSS_FIGURE = "loss.png"
DISTRIBUTED = ("ddp", "fsdp", "deepspeed_zero3")
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
    "packing": False,
    "max_steps": 0,
    "save_steps": 0,
    "merge": False,
    "seed": 0,
    "gpus": 0,
    "distributed": "fsdp",
    "accelerate_config": None,
}

# Keys that do not change what a checkpoint holds: a run with other values may resume it.
RESUMABLE_ACROSS = ("epochs", "max_steps", "gpus", "adapters", "merge", "save_steps", "distributed", "accelerate_config")


# ---------------------------------------------------------------------------------------------------------------
# Tokenisation and loss masking (our own, to check what TRL does with the same records)


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


def select_records(records: list[dict], tokenizer, max_length: int) -> tuple[list[dict], list[dict], int]:
    """The records that keep at least one target token within max_length, their masked examples, and how many not."""
    kept, examples, n_dropped = [], [], 0
    for index, record in enumerate(records):
        try:
            example = masked_example(tokenizer, record["messages"], max_length)
        except (KeyError, ValueError) as error:
            raise ValueError(f"SFT record {record.get('candidate_id', index)!r}: {error}") from None
        if n_target_tokens(example) == 0:
            n_dropped += 1
        else:
            kept.append(record)
            examples.append(example)
    return kept, examples, n_dropped


def encode_records(records: list[dict], tokenizer, max_length: int) -> tuple[list[dict], int]:
    """Masked examples of the records that keep at least one target token, and the count of those dropped."""
    _, examples, n_dropped = select_records(records, tokenizer, max_length)
    return examples, n_dropped


def n_target_tokens(example: dict) -> int:
    return sum(label != IGNORE_INDEX for label in example["labels"])


def prompt_completion(record: dict) -> dict:
    """A record as TRL's conversational prompt/completion pair: the loss goes on the completion (assistant) turn."""
    return {"prompt": list(record["messages"][:-1]), "completion": [record["messages"][-1]]}


# ---------------------------------------------------------------------------------------------------------------
# The stage: one process, or several through accelerate launch


def run(
    dataset_path: str,
    model_spec: dict,
    settings: dict,
    out_dir: str,
    figure_path: str | None = None,
    log_path: str | None = None,
    accelerate_configs: str | Path | None = None,
) -> dict:
    """The train stage: one adapter on a curated table (docs/data.md §5 rows).

    Snakemake deletes a `directory()` output before rerunning its job, so checkpoints live next to it, in
    `.{name}.checkpoints`, where a killed run finds them again. With `gpus` > 1 the training runs in `gpus`
    processes started by `accelerate launch` (their output goes where this process's goes); `accelerate_configs` is
    the folder of the repository's accelerate configs (configs/accelerate), used unless `accelerate_config` is set.
    """
    settings = _with_defaults(settings)
    out = Path(out_dir)
    checkpoint_dir = out.parent / f".{out.name}.checkpoints"
    job = {
        "dataset_path": str(dataset_path),
        "model_spec": dict(model_spec),
        "settings": settings,
        "out_dir": str(out),
        "figure_path": str(figure_path) if figure_path else None,
        "log_path": str(log_path) if log_path else None,
        "checkpoint_dir": str(checkpoint_dir),
    }
    if settings["gpus"] <= 1:
        return run_job(job)
    _require_gpus(settings["gpus"])
    job_file = checkpoint_dir / LAUNCH_FILE
    io.write_json(job, job_file)
    command = launch_command(settings["gpus"], accelerate_config_file(settings, accelerate_configs), job_file)
    _note(log_path, "train: " + " ".join(command))
    finished = subprocess.run(command, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"accelerate launch of {settings['gpus']} training processes exited with {finished.returncode}")
    return json.loads((out / "train_summary.json").read_text())


def run_job(job: dict) -> dict:
    """Train as a job description says (what `run` hands each process of a launch)."""
    from .curate import sft_record

    records = [sft_record(row) for row in pd.read_parquet(job["dataset_path"]).to_dict("records")]
    return train_adapter(
        records,
        job["model_spec"],
        job["settings"],
        Path(job["out_dir"]),
        log_path=job.get("log_path"),
        checkpoint_dir=job.get("checkpoint_dir"),
        figure_path=job.get("figure_path"),
    )


def accelerate_config_file(settings: dict, configs_dir: str | Path | None) -> str:
    """`accelerate_config` when set, else the repository's config for `distributed` (ddp, fsdp, deepspeed_zero3)."""
    if settings.get("accelerate_config"):
        return str(settings["accelerate_config"])
    distributed = settings.get("distributed", DEFAULTS["distributed"])
    if distributed not in DISTRIBUTED:
        raise ValueError(f"train.distributed {distributed!r} is not one of {', '.join(DISTRIBUTED)}")
    if configs_dir is None:
        raise ValueError("the folder of the accelerate configs (configs/accelerate) was not given")
    return str(Path(configs_dir) / f"{distributed}.yaml")


def launch_command(gpus: int, accelerate_config: str, job_file: str | Path, port: int | None = None) -> list[str]:
    """`accelerate launch` of `gpus` processes on this node, each running `python -m concur.train job_file`.

    Started with this interpreter (the job's environment); a free port for the rendezvous unless one is given, so
    two training jobs on one node do not collide.
    """
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config),
        "--num_processes", str(int(gpus)),
        "--num_machines", "1",
        "--main_process_port", str(port if port is not None else _free_port()),
        "-m", "concur.train", str(job_file),
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _require_gpus(gpus: int) -> None:
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < gpus:
        raise RuntimeError(f"train.gpus is {gpus} but {visible} CUDA device(s) are visible to this job")


def main(argv: list[str] | None = None) -> None:
    """One process of a multi-GPU launch: `python -m concur.train <launch.json>`."""
    from .logs import logging_to

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m concur.train <launch.json written by concur.train.run>")
    with logging_to(None):
        run_job(json.loads(Path(argv[0]).read_text()))


# ---------------------------------------------------------------------------------------------------------------
# Training


def train_adapter(
    records: list[dict],
    model_spec: dict,
    settings: dict,
    out_dir: Path,
    log_path: Path | None = None,
    checkpoint_dir: Path | None = None,
    figure_path: Path | None = None,
) -> dict:
    """Train a LoRA adapter on `records` and write the adapter folder (docs/data.md §6) to out_dir.

    Resumes from the last complete checkpoint in `checkpoint_dir` (default out_dir/checkpoints) when it was made
    with the same records, model and settings (epochs aside: asking for more epochs continues). Returns the summary
    (an empty dict on the processes of a launch other than the main one, which write nothing).
    """
    started = time.time()
    settings = _with_defaults(settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else out_dir / CHECKPOINTS
    tokenizer = load_tokenizer(model_spec)
    kept, examples, n_dropped = select_records(records, tokenizer, settings["max_length"])
    if not kept:
        raise ValueError(
            f"no SFT record keeps an assistant token within max_length={settings['max_length']} "
            f"({len(records)} records, {n_dropped} dropped)"
        )
    device = _device(settings["gpus"])
    args = _sft_config(settings, checkpoint_dir, on_cuda=device == "cuda")  # first: starts the distributed state
    main_process = args.process_index == 0
    log_path = log_path if main_process else None
    with args.main_process_first(desc="checkpoints"):  # the main process clears stale checkpoints, then the others look
        resume = _usable_checkpoint(checkpoint_dir, _fingerprint(records, model_spec, settings), log_path, main_process)
    trainer = _build_trainer(kept, model_spec, settings, tokenizer, args, device, log_path)
    n_target = sum(n_target_tokens(e) for e in examples)
    _check_labels(trainer.train_dataset, n_target)
    if settings["packing"] and settings["batch_size"] > 1 and main_process and not _varlen_attention(model_spec):
        _note(log_path, "train: packing flattens the batch_size packed rows of a batch into one row; with sdpa or "
                        "eager attention its cost grows with the square of that row's length: prefer batch_size 1 "
                        "and gradient_accumulation_steps")
    rows = "packed rows" if settings["packing"] else "examples"
    note = _note if main_process else lambda *_: None  # one line per launch, not one per process
    note(log_path, f"train: {len(kept)} examples ({n_dropped} dropped) in {len(trainer.train_dataset)} {rows}, "
                    f"{n_target} target tokens per epoch, on {device} x{args.world_size}, resume from {resume}")
    with warnings.catch_warnings():
        # peft looks for the base model's config.json to check the vocabulary; a GGUF folder has none
        warnings.filterwarnings("ignore", message="Could not find a config file in")
        trainer.train(resume_from_checkpoint=resume)
        _save_adapter(trainer, out_dir, main_process)
    if not main_process:
        return {}

    log = step_log(trainer.state.log_history)
    summary = _summary(records, examples, n_dropped, trainer, log, model_spec, settings, device)
    io.write_jsonl(log, out_dir / "train_log.jsonl")
    write_loss_figure(log, out_dir / LOSS_FIGURE, title=_figure_title(model_spec, out_dir, summary))
    if figure_path:
        _copy_atomically(out_dir / LOSS_FIGURE, Path(figure_path))
    if settings["merge"]:
        _note(log_path, "train: merging the adapter into the base model (merged/)")
        merge_adapter(model_spec, out_dir, out_dir / "merged")
    summary["runtime_s"] = round(time.time() - started, 3)
    io.write_json(summary, out_dir / "train_summary.json")  # written last: marks a finished adapter
    _note(log_path, f"train: done, {summary['steps']} steps, final loss {summary['final_loss']}")
    return summary


def _varlen_attention(model_spec: dict) -> bool:
    """Whether the model's attention skips the blocks between the examples of a flattened packed batch."""
    return str(model_spec.get("attn_implementation", "")).startswith(("flash", "flex", "kernels-community/flash"))


def _summary(records, examples, n_dropped, trainer, log, model_spec, settings, device) -> dict:
    seconds = sum(entry.get("step_time_s") or 0 for entry in log)
    last = log[-1] if log else {}
    return {
        "n_records": len(records),
        "n_dropped": n_dropped,
        "n_examples": len(examples),
        "n_rows": len(trainer.train_dataset),  # packed rows with packing, else the examples
        "n_target_tokens": sum(n_target_tokens(e) for e in examples),  # per epoch
        "steps": trainer.state.global_step,
        "epochs": settings["epochs"],
        "final_loss": last.get("loss"),
        "tokens": last.get("tokens"),
        "input_tokens": last.get("input_tokens"),
        "padded_tokens": last.get("padded_tokens"),
        # all tokens over the summed wall time of the optimizer steps (a resumed run's earlier steps included)
        "train_seconds": round(seconds, 3),
        "tokens_per_s": round(last["tokens"] / seconds, 3) if seconds and last.get("tokens") else None,
        "input_tokens_per_s": round(last["input_tokens"] / seconds, 3) if seconds and last.get("input_tokens") else None,
        "device": device,
        "processes": trainer.args.world_size,
        "distributed": settings["distributed"] if trainer.args.world_size > 1 else None,
        "precision": "bf16" if trainer.args.bf16 else "fp32",
        "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "packing": settings["packing"],
        "max_length": settings["max_length"],
        "base_model": dict(model_spec),
        "lora": dict(settings["lora"]),
        "merged": bool(settings["merge"]),
        "trainer": _trainer_versions(),
    }


def _trainer_versions() -> dict:
    import peft
    import transformers
    import trl

    return {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "torch": torch.__version__}


def _with_defaults(settings: dict) -> dict:
    merged = {**DEFAULTS, **settings}
    merged["lora"] = {**DEFAULTS["lora"], **settings.get("lora", {})}
    return merged


def _device(gpus: int) -> str:
    return "cuda" if gpus and torch.cuda.is_available() else "cpu"


def _sft_config(settings: dict, checkpoint_dir: Path, on_cuda: bool) -> SFTConfig:
    saving = {"save_strategy": "steps", "save_steps": settings["save_steps"]} if settings["save_steps"] else {
        "save_strategy": "epoch"}
    return SFTConfig(
        output_dir=str(checkpoint_dir),
        max_length=settings["max_length"],
        packing=bool(settings["packing"]),
        packing_strategy="bfd",  # best-fit decreasing; an example longer than max_length keeps its start
        completion_only_loss=True,
        num_train_epochs=settings["epochs"],
        max_steps=settings["max_steps"] or -1,  # set: stop after that many optimizer steps, epochs notwithstanding
        learning_rate=settings["learning_rate"],
        lr_scheduler_type=settings["lr_scheduler"],
        per_device_train_batch_size=settings["batch_size"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"],
        seed=settings["seed"],
        bf16=on_cuda,
        use_cpu=not on_cuda,
        logging_strategy="steps",
        logging_steps=1,
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=on_cuda,
        **saving,
        **_version_kwargs(settings["warmup_ratio"], checkpointing=on_cuda, grouped=not settings["packing"]),
    )


def _version_kwargs(warmup_ratio: float, checkpointing: bool, grouped: bool) -> dict:
    """Length grouping, warmup and gradient checkpointing are spelled differently in transformers 4.x and 5.x."""
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kwargs: dict[str, Any] = {}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    kwargs[f"{prefix}_checkpointing"] = checkpointing
    if checkpointing:  # non-reentrant: works with a frozen base model (LoRA) without enable_input_require_grads
        kwargs[f"{prefix}_checkpointing_kwargs"] = {"use_reentrant": False}
    if "train_sampling_strategy" in fields:
        kwargs["train_sampling_strategy"] = "group_by_length" if grouped else "random"
    else:
        kwargs["group_by_length"] = grouped
    if "warmup_ratio" in fields:
        kwargs["warmup_ratio"] = warmup_ratio
    else:  # 5.x: a float below 1 is a ratio of the total steps; 1.0 would mean "1 step"
        kwargs["warmup_steps"] = min(float(warmup_ratio), 0.9999)
    return kwargs


def _build_trainer(records, model_spec, settings, tokenizer, args, device: str, log_path):
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()  # TRL's map() calls would fill the log with progress bars
    set_seed(settings["seed"])  # before LoRA init, so the adapter's starting weights are reproducible
    distributed = args.world_size > 1
    # a launch loads on the CPU (or the meta device) and lets accelerate place and shard the weights
    model = load_model(_resolved_dtype(model_spec, device), device=None if distributed else device)
    model.config.use_cache = False  # no KV cache while training (and required with gradient checkpointing)
    trainer = _ConcurSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([prompt_completion(r) for r in records]),
        processing_class=tokenizer,
        peft_config=_lora_config(settings["lora"]),
        callbacks=[_ProgressCallback(log_path)],
    )
    trainer.remove_callback(PrinterCallback)  # one JSON line per step goes to train_log.jsonl instead
    trainer.fused_loss = device == "cuda"
    return trainer


def _resolved_dtype(model_spec: dict, device: str) -> dict:
    """The spec with dtype "auto" made explicit for `device` (bfloat16 on CUDA), before a load that does not move."""
    if model_spec.get("dtype", "auto") != "auto":
        return model_spec
    return {**model_spec, "dtype": "bfloat16" if device == "cuda" else "float32"}


def _lora_config(lora: dict):
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]),
    )


def _check_labels(dataset, expected: int) -> None:
    """TRL's prepared rows must label exactly the target tokens our own masking counts (packed or not)."""
    import pyarrow.compute as pc

    labels = dataset.with_format("arrow")[:]["labels"]
    found = pc.sum(pc.not_equal(pc.list_flatten(labels), IGNORE_INDEX)).as_py() or 0
    if found != expected:
        raise RuntimeError(
            f"the trainer's tokenised records label {found} tokens where the assistant turns hold {expected}: "
            "the chat template renders the prompt differently alone and inside the conversation"
        )


def _fingerprint(records: list[dict], model_spec: dict, settings: dict) -> str:
    """What a checkpoint must have been trained on to be resumed (epochs, GPU count and the like aside)."""
    kept = {key: value for key, value in settings.items() if key not in RESUMABLE_ACROSS}
    material = {"records": records, "model": model_spec, "settings": kept}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _usable_checkpoint(checkpoint_dir: Path, fingerprint: str, log_path: Path | None, write: bool = True) -> str | None:
    """The checkpoint to resume from, or None; checkpoints of other data or settings are deleted, not resumed.

    `write` false (the other processes of a launch) only looks, after the main process has cleaned up.
    """
    stamp = checkpoint_dir / FINGERPRINT
    previous = stamp.read_text().strip() if stamp.is_file() else None
    resume = last_checkpoint(checkpoint_dir)
    if resume and previous != fingerprint:
        if write:
            _note(log_path, f"train: {checkpoint_dir} holds checkpoints of other records or settings; starting afresh")
            for folder in checkpoint_dir.glob("checkpoint-*"):
                shutil.rmtree(folder)
        resume = None
    if write:
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


LOG_KEYS = ("step", "epoch", "loss", "learning_rate", "grad_norm", "tokens", "input_tokens", "padded_tokens",
            "tokens_per_s", "input_tokens_per_s", "step_time_s")


def step_log(log_history: list[dict]) -> list[dict]:
    """One record per optimizer step from the Trainer's log history (the run-summary entry has no `loss`)."""
    return [{key: entry.get(key) for key in LOG_KEYS} for entry in log_history if "loss" in entry]


def _save_adapter(trainer, out_dir: Path, main_process: bool) -> None:
    """Save the adapter and tokenizer into a staging folder, then move each file in with an atomic rename.

    Every process takes part in the save (under FSDP or ZeRO-3 it gathers the adapter's shards); only the main one
    writes. adapter_config.json moves last, so a visible config always sits next to complete weights.
    """
    staging = out_dir / ".staging"
    if main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if not main_process:
        return
    try:
        (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle of the trainer's arguments: not kept
        files = sorted(staging.iterdir(), key=lambda p: p.name == "adapter_config.json")
        for path in files:
            if path.is_dir():
                raise RuntimeError(f"unexpected folder {path.name!r} in the saved adapter")
            os.replace(path, out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def merge_adapter(model_spec: dict, adapter_dir: Path, merged_dir: Path) -> None:
    """The base model with the adapter merged into its weights (peft merge_and_unload), saved as a full model.

    Loaded on the CPU (dtype "auto": bfloat16), whatever the training ran on; written to a staging folder that is
    renamed onto `merged_dir` when complete.
    """
    from peft import PeftModel

    spec = model_spec if model_spec.get("dtype", "auto") != "auto" else {**model_spec, "dtype": "bfloat16"}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Could not find a config file in")
        model = PeftModel.from_pretrained(load_model(spec, device="cpu"), str(adapter_dir)).merge_and_unload()
    merged_dir = Path(merged_dir)
    staging = merged_dir.parent / f".{merged_dir.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    load_tokenizer(model_spec).save_pretrained(staging)
    shutil.rmtree(merged_dir, ignore_errors=True)
    os.replace(staging, merged_dir)


def _copy_atomically(source: Path, target: Path) -> None:
    with io.atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def _note(log_path: Path | None, line: str) -> None:
    """Progress to the `concur.train` logger and, when given, appended to `log_path`."""
    LOGGER.info(line)
    if log_path is None:
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(line.rstrip("\n") + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Token counts and throughput


COUNTED = ("tokens", "input_tokens", "padded_tokens")  # target (assistant) tokens, all non-padding, all positions


class _ConcurSFTTrainer(SFTTrainer):
    """SFTTrainer that adds token counts and throughput to each step's log (summed over all processes).

    `tokens`: target tokens trained on so far; `input_tokens`: all tokens the model read, padding excluded;
    `padded_tokens`: positions processed, padding included; `*_per_s`: over the wall time of the step.

    `fused_loss` (set on CUDA): TRL's loss, through its fused LM head, which never builds the full logits of a long
    sequence (gigabytes for 20K tokens and a 150K vocabulary) but also computes entropy and top-1 accuracy for
    TRL's metrics in every step. Off (the CPU): the model's own cross-entropy, the same loss (tests/test_train.py)
    without that extra work, a quarter of a step's compute for SmolLM2-135M, whose LM head is a large share.
    """

    fused_loss = True
    _pending: torch.Tensor | None = None
    _totals: list[int] | None = None
    _clock: float | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self._count(inputs)
        if self.fused_loss:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def _count(self, inputs: dict) -> None:
        labels = inputs["labels"]
        if self._pending is None:
            self._pending = torch.zeros(3, dtype=torch.long, device=labels.device)
        if self._clock is None:  # the first batch of this run
            self._clock = time.perf_counter()
        mask = inputs.get("attention_mask")
        real = mask.sum() if mask is not None else torch.tensor(labels.numel(), device=labels.device)
        self._pending += torch.stack([(labels != IGNORE_INDEX).sum(), real, torch.tensor(labels.numel(),
                                                                                          device=labels.device)])

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "loss" in logs and self._pending is not None:  # every process logs each step: the reduce is collective
            step = self.accelerator.reduce(self._pending, reduction="sum").tolist()
            self._pending.zero_()
            if self._totals is None:  # continue a resumed run's counts
                self._totals = _last_logged(self.state.log_history)
            now = time.perf_counter()
            seconds = max(now - self._clock, 1e-9)
            self._clock = now
            for index, key in enumerate(COUNTED):
                self._totals[index] += step[index]
                logs[key] = self._totals[index]
            logs["tokens_per_s"] = round(step[0] / seconds, 3)
            logs["input_tokens_per_s"] = round(step[1] / seconds, 3)
            logs["step_time_s"] = round(seconds, 4)
        super().log(logs, start_time)


def _last_logged(log_history: list[dict]) -> list[int]:
    for entry in reversed(log_history):
        if "tokens" in entry:
            return [int(entry.get(key) or 0) for key in COUNTED]
    return [0, 0, 0]


class _ProgressCallback(TrainerCallback):
    """One short line per optimizer step (see _note)."""

    def __init__(self, log_path: Path | None):
        self.log_path = log_path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and state.is_world_process_zero:
            line = "step {} epoch {:.2f} loss {:.4f} lr {:.3g} tokens {} ({} tokens/s)".format(
                state.global_step, logs.get("epoch", 0), logs["loss"], logs.get("learning_rate", 0),
                logs.get("tokens"), logs.get("tokens_per_s"))
            _note(self.log_path, line)


# ---------------------------------------------------------------------------------------------------------------
# The loss figure


def loss_figure(log: list[dict], title: str = ""):
    """Training loss per optimizer step (top) and tokens per second (bottom), from train_log.jsonl records."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    steps = [entry["step"] for entry in log]
    figure = Figure(figsize=(7.5, 5.5), constrained_layout=True)
    loss_axes, speed_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    loss_axes.plot(steps, [entry["loss"] for entry in log], marker="o" if len(log) <= 50 else None,
                   markersize=3, color="tab:blue", label="loss")
    for boundary in _epoch_ends(log):
        loss_axes.axvline(boundary, color="grey", linestyle=":", linewidth=1)
    loss_axes.set_ylabel("training loss\n(nats per assistant token)")
    loss_axes.grid(alpha=0.3)
    if title:
        loss_axes.set_title(title, fontsize=10)
    for key, label, colour in (("tokens_per_s", "assistant (target) tokens/s", "tab:orange"),
                               ("input_tokens_per_s", "all input tokens/s", "tab:green")):
        points = [(entry["step"], entry[key]) for entry in log if entry.get(key) is not None]
        if points:
            speed_axes.plot(*zip(*points), color=colour, label=label)
    speed_axes.set_xlabel("optimizer step (dotted: end of an epoch)" if _epoch_ends(log) else "optimizer step")
    speed_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    speed_axes.set_ylabel("throughput (tokens/s)")
    speed_axes.grid(alpha=0.3)
    if speed_axes.lines:
        speed_axes.legend(fontsize=8, loc="best")
    return figure


def _epoch_ends(log: list[dict]) -> list[int]:
    """Steps at which an epoch ended, the last step aside (where the floor of the epoch counter went up)."""
    ends, previous = [], 0.0
    for entry in log[:-1]:
        epoch = entry.get("epoch")
        if epoch is not None:
            if int(epoch + 1e-6) > int(previous + 1e-6):
                ends.append(entry["step"])
            previous = epoch
    return ends


def write_loss_figure(log: list[dict], path: Path, title: str = "") -> None:
    """Save loss_figure as a PNG whose text chunk `concur:plotted` holds the numbers drawn (for checks)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = loss_figure(log, title)
    FigureCanvasAgg(figure)
    plotted = {line.get_label(): line.get_xydata().tolist() for axes in figure.axes for line in axes.lines
               if not line.get_label().startswith("_")}
    with io.atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=120, metadata={"concur:plotted": json.dumps(plotted)})


def _figure_title(model_spec: dict, out_dir: Path, summary: dict) -> str:
    base = model_spec.get("gguf_file") or str(model_spec.get("path", "")).rstrip("/").split("/")[-1]
    batches = "packed" if summary["packing"] else "padded, length-grouped"
    return f"adapter {out_dir.name}: LoRA SFT of {base}\n{summary['steps']} optimizer steps, {batches} batches"


if __name__ == "__main__":
    main()

"""One adapter trained by TRL's SFTTrainer in this process (or in each process of a launch): the LoRA, the
trainer's arguments, the label check, and the adapter folder with its summary and loss figure.

Batches. `packing: true` packs examples into rows of up to `max_length` tokens (TRL's best-fit decreasing) and
flattens a batch into one padding-free row whose position ids restart at 0 for every example. With no attention mask,
transformers derives a block-diagonal causal mask from those position ids (sdpa and eager attention;
flash-attention uses the sequence boundaries TRL passes), so no example attends to another: tests/test_train.py
checks an example's logits inside a packed row against the same example alone. `packing: false`: padded batches of
examples of similar length (length-grouped sampler).

Devices. The CPU (`gpus: 0`) or one GPU (bf16 autocast, non-reentrant gradient checkpointing); with `gpus` > 1 every
process of an `accelerate launch` (concur.train.launch) runs `train_adapter`, and only the main process writes.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, TrainerCallback, TrainingArguments, set_seed
from trl import SFTConfig

from .. import config, io
from ..figures import write_loss_figure
from ..models import load_model, load_tokenizer
from .checkpoints import (
    CHECKPOINTS,
    adapter_from_checkpoint,
    finished_at,
    merge_adapter,
    run_fingerprint,
    save_adapter,
    usable_checkpoint,
)
from .progress import ConcurSFTTrainer, ProgressCallback, note, step_log
from .records import IGNORE_INDEX, n_target_tokens, prompt_completion, select_records

LOSS_FIGURE = "loss.png"


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
    settings = config.with_defaults("train", settings)
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
    args = sft_config(settings, checkpoint_dir, on_cuda=device == "cuda")  # first: starts the distributed state
    if args.use_liger_kernel:
        require_liger()
    if args.world_size == 1 and args.n_gpu > 1:
        # one process on a node where it sees several GPUs: train on the first, never nn.DataParallel over all
        # (which TRL refuses); gpus > 1 is what spreads a job over GPUs
        args._n_gpu = 1
    main_process = args.process_index == 0
    log_path = log_path if main_process else None
    with args.main_process_first(desc="checkpoints"):  # the main process clears stale checkpoints, then the others look
        resume = usable_checkpoint(
            checkpoint_dir, run_fingerprint(records, model_spec, settings), log_path, main_process
        )
    trainer = build_trainer(kept, model_spec, settings, tokenizer, args, device, log_path)
    n_target = sum(n_target_tokens(e) for e in examples)
    check_labels(trainer.train_dataset, n_target)
    if settings["packing"] and settings["batch_size"] > 1 and main_process and not _varlen_attention(model_spec):
        note(
            log_path,
            "train: packing flattens the batch_size packed rows of a batch into one row; with sdpa or "
            "eager attention its cost grows with the square of that row's length: prefer batch_size 1 "
            "and gradient_accumulation_steps",
        )
    rows = "packed rows" if settings["packing"] else "examples"
    say = note if main_process else lambda *_: None  # one line per launch, not one per process
    say(
        log_path,
        f"train: {len(kept)} examples ({n_dropped} dropped) in {len(trainer.train_dataset)} {rows}, "
        f"{n_target} target tokens per epoch, on {device} x{args.world_size}, resume from {resume}",
    )
    with warnings.catch_warnings():
        # peft looks for the base model's config.json to check the vocabulary; a GGUF folder has none
        warnings.filterwarnings("ignore", message="Could not find a config file in")
        if finished_at(resume, settings["max_steps"]):  # killed after its last checkpoint: nothing left to train
            from transformers import TrainerState

            trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
            if main_process:
                adapter_from_checkpoint(resume, out_dir)
        else:
            trainer.train(resume_from_checkpoint=resume)
            save_adapter(trainer, out_dir, main_process)
    if not main_process:
        return {}

    log = step_log(trainer.state.log_history)
    summary = _summary(records, examples, n_dropped, trainer, log, model_spec, settings, device)
    io.write_jsonl(log, out_dir / "train_log.jsonl")
    write_loss_figure(log, out_dir / LOSS_FIGURE, title=_figure_title(model_spec, out_dir, summary))
    if figure_path:
        io.copy_file(out_dir / LOSS_FIGURE, figure_path)
    if settings["merge"]:
        note(log_path, "train: merging the adapter into the base model (merged/)")
        merge_adapter(model_spec, out_dir, out_dir / "merged")
    summary["runtime_s"] = round(time.time() - started, 3)
    io.write_json(summary, out_dir / "train_summary.json")  # written last: marks a finished adapter
    note(log_path, f"train: done, {summary['steps']} steps, final loss {summary['final_loss']}")
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
        "input_tokens_per_s": round(last["input_tokens"] / seconds, 3)
        if seconds and last.get("input_tokens")
        else None,
        "device": device,
        "processes": trainer.args.world_size,
        "distributed": settings["distributed"] if trainer.args.world_size > 1 else None,
        "precision": "bf16" if trainer.args.bf16 else "fp32",
        "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "checkpoint_layers": settings["checkpoint_layers"] if trainer.args.gradient_checkpointing else 0,
        "liger_kernels": bool(trainer.args.use_liger_kernel),
        "packing": settings["packing"],
        "max_length": settings["max_length"],
        "base_model": dict(model_spec),
        "lora": dict(settings["lora"]),
        "merged": bool(settings["merge"]),
        "trainer": trainer_versions(),
    }


def trainer_versions() -> dict:
    import peft
    import transformers
    import trl

    return {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "torch": torch.__version__,
    }


def _device(gpus: int) -> str:
    return "cuda" if gpus and torch.cuda.is_available() else "cpu"


def sft_config(settings: dict, checkpoint_dir: Path, on_cuda: bool) -> SFTConfig:
    saving = (
        {"save_strategy": "steps", "save_steps": settings["save_steps"]}
        if settings["save_steps"]
        else {"save_strategy": "epoch"}
    )
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
        use_liger_kernel=bool(settings["liger_kernels"]) and on_cuda,  # Triton kernels: GPUs only
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


def build_trainer(records, model_spec, settings, tokenizer, args, device: str, log_path):
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()  # TRL's map() calls would fill the log with progress bars
    set_seed(settings["seed"])  # before LoRA init, so the adapter's starting weights are reproducible
    distributed = args.world_size > 1
    # a launch loads on the CPU (or the meta device) and lets accelerate place and shard the weights
    model = load_model(_resolved_dtype(model_spec, device), device=None if distributed else device)
    model.config.use_cache = False  # no KV cache while training (and required with gradient checkpointing)
    trainer = ConcurSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([prompt_completion(r) for r in records]),
        processing_class=tokenizer,
        peft_config=_lora_config(settings["lora"]),
        callbacks=[ProgressCallback(log_path), CheckpointedLayers(settings["checkpoint_layers"])],
    )
    trainer.remove_callback(PrinterCallback)  # one JSON line per step goes to train_log.jsonl instead
    trainer.fused_loss = device == "cuda"
    return trainer


class CheckpointedLayers(TrainerCallback):
    """`train.checkpoint_layers`: as training begins (gradient checkpointing is on by then, on every layer), only the
    first `layers` decoder layers keep recomputing their activations in the backward pass; the others keep them,
    which costs memory and saves a forward pass of each. None: every layer recomputes."""

    def __init__(self, layers: int | None):
        self.layers = layers

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.layers is not None and model is not None and args.gradient_checkpointing:
            limit_checkpointing(model, self.layers)


def limit_checkpointing(model, layers: int) -> int:
    """Turn gradient checkpointing off on every checkpointed layer of `model` after the first `layers` (transformers'
    per-layer flag, kept through FSDP's and DeepSpeed's wrapping); how many layers still recompute."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    checkpointed = [
        m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]
    for module in checkpointed[layers:]:
        module.gradient_checkpointing = False
    return min(layers, len(checkpointed))


def require_liger() -> None:
    try:
        import liger_kernel  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            f"train.liger_kernels: true needs the liger-kernel package on the GPU node ({error}): "
            'pip install "concur[liger]", or set train.liger_kernels: false'
        ) from None


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


def check_labels(dataset, expected: int) -> None:
    """TRL's prepared rows must label exactly the target tokens our own masking counts (packed or not)."""
    import pyarrow.compute as pc

    labels = dataset.with_format("arrow")[:]["labels"]
    found = pc.sum(pc.not_equal(pc.list_flatten(labels), IGNORE_INDEX)).as_py() or 0
    if found != expected:
        raise RuntimeError(
            f"the trainer's tokenised records label {found} tokens where the assistant turns hold {expected}: "
            "the chat template renders the prompt differently alone and inside the conversation"
        )


def _figure_title(model_spec: dict, out_dir: Path, summary: dict) -> str:
    base = model_spec.get("gguf_file") or str(model_spec.get("path", "")).rstrip("/").split("/")[-1]
    batches = "packed" if summary["packing"] else "padded, length-grouped"
    return f"adapter {out_dir.name}: LoRA SFT of {base}\n{summary['steps']} optimizer steps, {batches} batches"

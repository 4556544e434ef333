"""Checkpoints a killed run resumes from, and the adapter folder's files, each moved in by an atomic rename."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

from .. import io
from ..models import load_model, load_tokenizer
from .progress import note

CHECKPOINTS = "checkpoints"
FINGERPRINT = "fingerprint.txt"  # in the checkpoint folder: sha256 of what its checkpoints were trained on
# Keys that do not change what a checkpoint holds: a run with other values may resume it.
RESUMABLE_ACROSS = (
    "epochs",
    "max_steps",
    "gpus",
    "adapters",
    "merge",
    "save_steps",
    "distributed",
    "accelerate_config",
    "checkpoint_layers",
    "liger_kernels",
)


def run_fingerprint(records: list[dict], model_spec: dict, settings: dict) -> str:
    """What a checkpoint must have been trained on to be resumed (epochs, GPU count and the like aside)."""
    kept = {key: value for key, value in settings.items() if key not in RESUMABLE_ACROSS}
    material = {"records": records, "model": model_spec, "settings": kept}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def usable_checkpoint(checkpoint_dir: Path, fingerprint: str, log_path: Path | None, write: bool = True) -> str | None:
    """The checkpoint to resume from, or None; checkpoints of other data or settings are deleted, not resumed.

    `write` false (the other processes of a launch) only looks, after the main process has cleaned up.
    """
    stamp = checkpoint_dir / FINGERPRINT
    previous = stamp.read_text().strip() if stamp.is_file() else None
    resume = last_checkpoint(checkpoint_dir)
    if resume and previous != fingerprint:
        if write:
            note(log_path, f"train: {checkpoint_dir} holds checkpoints of other records or settings; starting afresh")
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


def finished_at(checkpoint: str | None, max_steps: int | None) -> bool:
    """Whether `checkpoint` already holds the run's last step (`max_steps` set): resumed, transformers' Trainer would
    train one step more (it skips the epoch's steps done, then steps before it checks max_steps)."""
    if not checkpoint or not max_steps or max_steps <= 0:
        return False
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return int(state.get("global_step", 0)) >= max_steps


CHECKPOINT_ONLY = {"optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin"}  # and rng_state*


def adapter_from_checkpoint(checkpoint: str, out_dir: Path) -> None:
    """The adapter and tokenizer files of a finished run's last checkpoint into `out_dir`, as save_adapter moves
    them: copied into a staging folder, then each moved in by an atomic rename, adapter_config.json last."""
    staging = out_dir / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in Path(checkpoint).iterdir():
        if path.is_file() and path.name not in CHECKPOINT_ONLY and not path.name.startswith("rng_state"):
            shutil.copy2(path, staging / path.name)
    move_in(staging, out_dir)


def save_adapter(trainer, out_dir: Path, main_process: bool) -> None:
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
    (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle of the trainer's arguments: not kept
    move_in(staging, out_dir)


def move_in(staging: Path, out_dir: Path) -> None:
    """Every file of `staging` into `out_dir` by an atomic rename, adapter_config.json last (a visible config always
    sits next to complete weights); then `staging` is removed, whatever happened."""
    try:
        for path in sorted(staging.iterdir(), key=lambda p: p.name == "adapter_config.json"):
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

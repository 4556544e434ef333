"""Progress of a training run: token counts and throughput in each step's log (summed over all processes), one
line per step for people, and the per-step records of train_log.jsonl (docs/data.md §6)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from trl import SFTTrainer

from .records import IGNORE_INDEX

LOGGER = logging.getLogger("concur.train")
LOG_KEYS = (
    "step",
    "epoch",
    "loss",
    "learning_rate",
    "grad_norm",
    "tokens",
    "input_tokens",
    "padded_tokens",
    "tokens_per_s",
    "input_tokens_per_s",
    "step_time_s",
    "peak_memory_gib",
)


def step_log(log_history: list[dict]) -> list[dict]:
    """One record per optimizer step from the Trainer's log history (the run-summary entry has no `loss`)."""
    return [{key: entry.get(key) for key in LOG_KEYS} for entry in log_history if "loss" in entry]


def note(log_path: Path | None, line: str) -> None:
    """Progress to the `concur.train` logger and, when given, appended to `log_path`."""
    LOGGER.info(line)
    if log_path is None:
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(line.rstrip("\n") + "\n")


COUNTED = ("tokens", "input_tokens", "padded_tokens")  # target (assistant) tokens, all non-padding, all positions


class ConcurSFTTrainer(SFTTrainer):
    """SFTTrainer that adds token counts and throughput to each step's log (summed over all processes).

    `tokens`: target tokens trained on so far; `input_tokens`: all tokens the model read, padding excluded;
    `padded_tokens`: positions processed, padding included; `*_per_s`: over the wall time of the step;
    `peak_memory_gib`: the most GPU memory PyTorch's allocator held on any one process so far (CUDA only).

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
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        return Trainer.compute_loss(
            self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )

    def _count(self, inputs: dict) -> None:
        labels = inputs["labels"]
        if self._pending is None:
            self._pending = torch.zeros(3, dtype=torch.long, device=labels.device)
        if self._clock is None:  # the first batch of this run
            self._clock = time.perf_counter()
        mask = inputs.get("attention_mask")
        real = mask.sum() if mask is not None else torch.tensor(labels.numel(), device=labels.device)
        self._pending += torch.stack(
            [(labels != IGNORE_INDEX).sum(), real, torch.tensor(labels.numel(), device=labels.device)]
        )

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
            if self._pending.is_cuda:
                held = torch.tensor([torch.cuda.max_memory_reserved()], device=self._pending.device)
                logs["peak_memory_gib"] = round(self.accelerator.gather(held).max().item() / 2**30, 3)
        super().log(logs, start_time)


def _last_logged(log_history: list[dict]) -> list[int]:
    for entry in reversed(log_history):
        if "tokens" in entry:
            return [int(entry.get(key) or 0) for key in COUNTED]
    return [0, 0, 0]


class ProgressCallback(TrainerCallback):
    """One short line per optimizer step (see _note)."""

    def __init__(self, log_path: Path | None):
        self.log_path = log_path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and state.is_world_process_zero:
            line = "step {} epoch {:.2f} loss {:.4f} lr {:.3g} tokens {} ({} tokens/s)".format(
                state.global_step,
                logs.get("epoch", 0),
                logs["loss"],
                logs.get("learning_rate", 0),
                logs.get("tokens"),
                logs.get("tokens_per_s"),
            )
            note(self.log_path, line)

"""The train stage's entry point: one adapter in this process (the CPU or one GPU), or `accelerate launch` of
`gpus` processes on one node, each reading the job from a file (`python -m concur.train <launch.json>`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from .. import config, io
from .progress import note
from .trainer import train_adapter

LAUNCH_FILE = "launch.json"  # in the checkpoint folder: what the processes of a multi-GPU launch train
DISTRIBUTED = ("ddp", "fsdp", "deepspeed_zero3")


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
    settings = config.with_defaults("train", settings)
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
    require_gpus(settings["gpus"])
    job_file = checkpoint_dir / LAUNCH_FILE
    io.write_json(job, job_file)
    command = launch_command(settings["gpus"], accelerate_config_file(settings, accelerate_configs), job_file)
    note(log_path, "train: " + " ".join(command))
    finished = subprocess.run(command, check=False)
    if finished.returncode != 0:
        raise RuntimeError(
            f"accelerate launch of {settings['gpus']} training processes exited with {finished.returncode}"
        )
    return json.loads((out / "train_summary.json").read_text())


def run_job(job: dict) -> dict:
    """Train as a job description says (what `run` hands each process of a launch)."""
    from ..curate import sft_record

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
    settings = config.with_defaults("train", settings)
    if settings.get("accelerate_config"):
        return str(settings["accelerate_config"])
    distributed = settings["distributed"]
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
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(accelerate_config),
        "--num_processes",
        str(int(gpus)),
        "--num_machines",
        "1",
        "--main_process_port",
        str(port if port is not None else _free_port()),
        "-m",
        "concur.train",
        str(job_file),
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_gpus(gpus: int) -> None:
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < gpus:
        raise RuntimeError(f"train.gpus is {gpus} but {visible} CUDA device(s) are visible to this job")


def main(argv: list[str] | None = None) -> None:
    """One process of a multi-GPU launch: `python -m concur.train <launch.json>`."""
    from ..logs import logging_to

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m concur.train <launch.json written by concur.train.run>")
    with logging_to(None):
        run_job(json.loads(Path(argv[0]).read_text()))

"""Verify settings: the schema's `verify` section is the one place their defaults live."""

from __future__ import annotations

import os
import shutil

from concur import config


def defaults() -> dict:
    """The `verify` section's defaults, read from the packaged schema (its keys are flat: no validator needed)."""
    properties = config.load_schema()["properties"]["verify"]["properties"]
    return {key: spec.get("default") for key, spec in properties.items()}


def normalize(settings: dict | None, for_compile: bool = False) -> dict:
    merged = {**defaults(), **(settings or {})}
    if merged["mode"] not in ("kernelbench", "hardened"):
        raise ValueError(f"verify.mode must be kernelbench or hardened, got {merged['mode']!r}")
    if merged["device"] not in ("auto", "cpu", "cuda"):
        raise ValueError(f"verify.device must be auto, cpu or cuda, got {merged['device']!r}")
    if merged.get("sandbox", "auto") not in ("auto", "required", "off"):
        raise ValueError(f"verify.sandbox must be auto, required or off, got {merged['sandbox']!r}")
    if merged["sandbox"] == "required":
        from concur.verify.sandbox import landlock_abi

        if landlock_abi() < 1:
            raise ValueError(
                "verify.sandbox is required but this kernel has no Landlock (Linux >= 5.13 with it enabled)"
            )
    merged["device"] = resolve_device(merged["device"], for_compile)
    if int(merged["workers"]) < 1 or float(merged["timeout_s"]) <= 0:
        raise ValueError("verify.workers must be >= 1 and verify.timeout_s > 0")
    if merged["device"] == "cuda":
        merged["cuda_arch"] = merged["cuda_arch"] or detected_cuda_arch()
    merged["host_compiler"] = resolve_host_compiler(merged["host_compiler"])
    return merged


def resolve_host_compiler(name: str) -> str:
    """clang: clang++, gcc: CXX if set, else c++; both through concur.verify.pch_cxx's shared PCHs (clang's also
    instantiates the templates once: faster builds). auto picks clang when clang++ is on PATH and CXX is not set."""
    if name not in ("auto", "clang", "gcc"):
        raise ValueError(f"verify.host_compiler must be auto, clang or gcc, got {name!r}")
    if name == "auto":
        return "clang" if shutil.which("clang++") and not os.environ.get("CXX") else "gcc"
    if name == "clang" and not shutil.which("clang++"):
        raise ValueError("verify.host_compiler is clang but clang++ is not on PATH")
    return name


def resolve_device(name: str, for_compile: bool = False) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not for_compile and not torch.cuda.is_available():
        raise ValueError("verify.device is cuda but torch sees no CUDA device")
    return name


def detected_cuda_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "verify.cuda_arch must be set (e.g. '9.0') to compile CUDA candidates on a machine without a GPU"
        )
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

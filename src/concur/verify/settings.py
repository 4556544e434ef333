"""Verify settings: one typed object, `VerifySettings`, whose defaults and checks come from the schema's `verify`
section (the one place they live).

Each field says what its value changes (`reads`), and every list of keys is read off those marks, never kept by
hand: the compile rule's params (`BUILD`: a changed key reruns the compile jobs), the verify rule's params
(`VERDICT`), what crosses to a referee process in each job (`REFEREE`) and the key of the probe cache (`PROBE`). A
field that changes none of them says how a job runs (processes, cores, GPUs), not what it gives; a rule's script
reads those from the config itself. Across process boundaries and in the verifier's own modules, settings travel as
the plain dict `to_dict` makes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from concur import config

BUILD = "build"  # what a build compiles, how its candidate code is confined and limited, where it is cached
VERDICT = "verdict"  # what a verdict says: every build setting, the checks and the timing
REFEREE = "referee"  # what a referee process reads of a job (the rest stays in the job's own process)
PROBE = "probe"  # what the degenerate-output probe of a task finds (cached per reference program)
READERS = (BUILD, VERDICT, REFEREE, PROBE)


def _reads(*readers: str) -> Any:
    return field(metadata={"reads": frozenset(readers)})


@dataclass(frozen=True)
class VerifySettings:
    """The `verify` section, every key present (the schema's default where it was left out). Fields carry no
    defaults of their own: build one with `of` or `from_dict`. `resolved` turns `auto` values into what this machine
    gives; `to_dict` makes the plain data that crosses to a rule's params, a process or the verifier's modules."""

    device: str = _reads(BUILD, VERDICT, PROBE)
    mode: str = _reads(BUILD, VERDICT, REFEREE, PROBE)  # hardened builds reject what the static screen finds
    timeout_s: float = _reads(BUILD, VERDICT, REFEREE)
    workers: int = _reads()
    compile_workers: int | None = _reads()
    compile_threads: int = _reads()
    host_compiler: str = _reads(BUILD, VERDICT)
    light_cuda_headers: bool = _reads(BUILD, VERDICT)
    cuda_arch: str | None = _reads(BUILD, VERDICT)
    build_cache: str | None = _reads(BUILD, VERDICT)
    correctness_trials: int = _reads(VERDICT, REFEREE, PROBE)
    signed_trials: int = _reads(VERDICT, REFEREE)
    warmup: int = _reads(VERDICT, REFEREE)
    timing_trials: int = _reads(VERDICT, REFEREE)
    timing_min_s: float = _reads(VERDICT, REFEREE)
    baselines: list[str] = _reads(VERDICT, REFEREE)  # what the reference is timed under (concur.verify.baselines)
    atol: float | None = _reads(VERDICT, REFEREE, PROBE)
    rtol: float | None = _reads(VERDICT, REFEREE, PROBE)
    audit_speedup: float = _reads(VERDICT)  # flags are decided in the job's own process
    memory_limit_mb: int = _reads(BUILD, VERDICT, REFEREE)
    sandbox: str = _reads(BUILD, VERDICT)  # confinement of builds and runs alike
    max_processes: int = _reads(BUILD, VERDICT, REFEREE)
    gpus: int = _reads()

    @classmethod
    def keys(cls, *readers: str) -> tuple[str, ...]:
        """The fields any of `readers` reads, in the schema's order; none named: every field."""
        unknown = set(readers) - set(READERS)
        if unknown:
            raise ValueError(f"unknown settings reader(s) {sorted(unknown)}; known: {', '.join(READERS)}")
        return tuple(f.name for f in dataclasses.fields(cls) if not readers or f.metadata["reads"] & frozenset(readers))

    @classmethod
    def plan_keys(cls) -> tuple[str, ...]:
        """The fields nothing reads: how a job runs (processes, cores, GPUs), not what it gives."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata["reads"])

    @classmethod
    def from_dict(cls, settings: dict | None) -> VerifySettings:
        """`settings` (some keys of the `verify` section) with the rest from the schema, checked against it."""
        filled = config.with_defaults("verify", settings or {})
        unknown = sorted(set(filled) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"verify: unknown setting(s) {', '.join(unknown)}")
        errors = config.section_errors("verify", filled)
        if errors:
            raise ValueError(_describe(errors[0]))
        return cls(**filled)

    @classmethod
    def of(cls, settings: VerifySettings | dict | None) -> VerifySettings:
        return settings if isinstance(settings, VerifySettings) else cls.from_dict(settings)

    def to_dict(self, *readers: str, plan: bool = False) -> dict:
        """The fields any of `readers` reads (every field when none is named), as plain data in the schema's order:
        a rule's params (Snakemake compares their repr), a job sent to a referee, the verifier's modules. `plan`:
        with the plan's fields too."""
        names = self.keys(*readers) + (self.plan_keys() if plan and readers else ())
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in names}

    def replace(self, **changes) -> VerifySettings:
        """A copy with `changes`, checked again against the schema."""
        return VerifySettings.from_dict({**self.to_dict(), **changes})

    def resolved(self, for_compile: bool = False) -> VerifySettings:
        """`auto` and null values as this machine resolves them (device, CUDA architecture, host compiler); a
        `required` sandbox where the kernel has no Landlock is an error. `for_compile`: a CPU node compiling CUDA
        candidates needs no GPU."""
        if self.sandbox == "required":
            from concur.verify.sandbox import landlock_abi

            if landlock_abi() < 1:
                raise ValueError(
                    "verify.sandbox is required but this kernel has no Landlock (Linux >= 5.13 with it enabled)"
                )
        device = resolve_device(self.device, for_compile)
        cuda_arch = (self.cuda_arch or detected_cuda_arch()) if device == "cuda" else self.cuda_arch
        return dataclasses.replace(
            self, device=device, cuda_arch=cuda_arch, host_compiler=resolve_host_compiler(self.host_compiler)
        )


def _describe(error) -> str:
    where = "verify" + "".join(f".{p}" for p in error.absolute_path)
    if error.validator == "enum":
        *most, last = [str(v) for v in error.validator_value]
        return f"{where} must be {', '.join(most)} or {last}, got {error.instance!r}"
    return f"{where}: {error.message}"


def defaults() -> dict:
    """The `verify` section's defaults, read from the packaged schema."""
    return config.defaults("verify")


def normalize(settings: VerifySettings | dict | None, for_compile: bool = False) -> dict:
    """The plain dict the verifier's modules read: `settings` completed, checked and resolved (`resolved`)."""
    return VerifySettings.of(settings).resolved(for_compile).to_dict()


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

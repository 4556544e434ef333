"""Fixtures and helpers shared between test files (import the helpers with `from conftest import ...`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def load_benchmark(name: str):
    """A script of benchmarks/ imported as a module (its `main` not run), registered in sys.modules as an import
    would (dataclasses look their module up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def snakemake(*args, cwd=ROOT, check=True, timeout=600, env=None) -> subprocess.CompletedProcess:
    """`python -m snakemake ARGS` in `cwd`; `env`: variables set on top of this process's environment. With
    `check`, a failure is an assertion error that shows the end of Snakemake's output."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def job_counts(output: str) -> dict[str, int]:
    """Jobs per rule in the `Job stats:` table of a (dry) run; empty when there is nothing to do."""
    if "Job stats:" not in output:
        return {}
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def shards(results: Path, kind: str, generator: str = "demo-teacher", turn: int = 1) -> pd.DataFrame:
    """Every shard of a stage's output (`kind`: candidates, builds, verified) of one turn, sorted by candidate."""
    folder = results / kind / generator / (f"turn-{turn}" if turn > 1 else "")
    files = sorted(folder.glob("shard-*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return frame.sort_values("candidate_id").reset_index(drop=True)


@pytest.fixture(scope="session")
def demo_results(tmp_path_factory) -> Path:
    """The results folder of one run of the whole default workflow (`make demo`), made once per test session:
    the demo test checks every artifact in it, the SLURM test compares its own run with it and reuses its build
    cache (`<results>/build-cache`)."""
    out = tmp_path_factory.mktemp("demo") / "results"
    snakemake("--cores", "2", "--config", f"results={out}", timeout=1800)
    return out

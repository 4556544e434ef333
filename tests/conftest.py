"""Fixtures shared between test files."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def demo_results(tmp_path_factory) -> Path:
    """The results folder of one run of the whole default workflow (`make demo`), made once per test session:
    the demo test checks every artifact in it, the SLURM test compares its own run with it and reuses its build
    cache (`<results>/build-cache`)."""
    out = tmp_path_factory.mktemp("demo") / "results"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--config", f"results={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out

"""Lint and format: ruff, configured in pyproject.toml (which also lists the files it leaves out)."""

import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(command):
    proc = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

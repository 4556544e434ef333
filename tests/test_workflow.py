"""The workflow itself: dry-run job counts, lint, DAG rendering, config errors, and rerun triggers."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args, cwd=ROOT, check=True):
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def test_dry_run_lists_every_job_of_the_default_config(tmp_path):
    out = snakemake("-n", "--config", f"results={tmp_path}/results")
    assert job_counts(out.stdout) == {
        "all": 1, "tasks": 1, "synthesize": 2, "compile": 2, "verify": 2, "curate": 1, "train": 1,
        "eval_generate": 2, "eval_compile": 2, "eval_verify": 2, "eval_score": 1, "analyze": 1,
    }


def test_shard_count_comes_from_config(tmp_path):
    overlay = tmp_path / "shards.yaml"
    overlay.write_text("tasks:\n  shards: 5\n")
    out = snakemake("-n", "--configfile", str(overlay), "--config", f"results={tmp_path}/results")
    counts = job_counts(out.stdout)
    assert counts["synthesize"] == counts["compile"] == counts["verify"] == 5


def test_paper_config_plans_every_stage(tmp_path):
    out = snakemake("-n", "--configfile", "configs/paper.yaml", "--config", f"results={tmp_path}/paper")
    counts = job_counts(out.stdout)
    assert counts["synthesize"] == counts["compile"] == counts["verify"] == 64
    assert counts["train"] == 5 and counts["eval_generate"] == 6


def test_bad_config_stops_with_one_clear_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("verify:\n  device: tpu\n")
    out = snakemake("-n", "--configfile", str(bad), check=False)
    assert out.returncode != 0
    assert "config: verify.device: 'tpu' is not one of ['auto', 'cpu', 'cuda']" in out.stdout + out.stderr


def test_lint_is_clean():
    out = snakemake("--lint", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
@pytest.mark.parametrize("graph", ["--dag", "--rulegraph", "--filegraph"])
def test_graphs_render_to_svg(graph, tmp_path):
    dot = snakemake(graph, "--config", f"results={tmp_path}/results").stdout
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "curate" in svg and "verify" in svg


"""Operating the workflow: a run killed during verification and rerun, retries, --until/--omit-from, partial targets.

The kill test runs the real workflow on a few tiny programs of our own (a `folder` source, replayed candidates
whose forward sleeps, so that verifying a shard takes seconds), in a private working folder whose `.snakemake`
(locks, incomplete markers) belongs to the test alone.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, job_counts, snakemake

PROGRAM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * {k}


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
"""
ANSWER = """<think>
Scale by {k}; the sleep stands for a slow kernel.
</think>

```python
import time
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(0.5)
        return x * {k}
```
"""
N_PROGRAMS = 4


# ------------------------------------------------------------------------------------------ partial runs (dry)


def dry_counts(tmp_path, *args) -> dict[str, int]:
    return job_counts(snakemake("-n", *args, "--config", f"results={tmp_path}/results").stdout)


def test_until_stops_after_the_named_rule(tmp_path):
    assert dry_counts(tmp_path, "--until", "verify") == {"tasks": 1, "synthesize": 2, "compile": 2, "verify": 2}


def test_omit_from_leaves_out_the_rule_and_everything_after_it(tmp_path):
    counts = dry_counts(tmp_path, "--omit-from", "train")
    assert "train" not in counts and "analyze" not in counts and "eval_score" not in counts
    # the base model's evaluation does not depend on training
    assert counts["curate"] == counts["eval_generate"] == counts["eval_verify"] == 1


def test_partial_target_builds_only_what_it_needs(tmp_path):
    counts = dry_counts(tmp_path, f"{tmp_path}/results/dataset/concur.parquet")
    turn_2 = {"refine": 2, "refine_compile": 2, "refine_verify": 2}  # the demo synthesizes in 2 turns
    assert counts == {"tasks": 1, "synthesize": 2, "compile": 2, "verify": 2, **turn_2, "curate": 1}


# -------------------------------------------------------------------------------------------------- retries

FLAKY = """
rule flaky:
    output: "done.txt"
    resources: attempt_seen=lambda wc, attempt: attempt
    run:
        with open("attempts.txt", "a") as f:
            f.write(f"{resources.attempt_seen}\\n")
        if resources.attempt_seen == 1:
            raise RuntimeError("the first attempt fails")
        open(output[0], "w").write("ok")
"""


def profile_retries() -> int:
    return yaml.safe_load((ROOT / "slurm" / "config.yaml").read_text())["retries"]


@pytest.mark.parametrize("retries", [0, "profile"])
def test_a_job_that_fails_once_succeeds_with_the_profiles_retries(tmp_path, retries):
    retries = profile_retries() if retries == "profile" else retries
    (tmp_path / "Snakefile").write_text(FLAKY)
    proc = snakemake("--cores", "1", "--retries", str(retries), cwd=tmp_path, check=False)
    attempts = (tmp_path / "attempts.txt").read_text().split()
    if retries:
        assert proc.returncode == 0 and attempts == ["1", "2"], proc.stderr[-2000:]
        assert (tmp_path / "done.txt").read_text() == "ok"
    else:
        assert proc.returncode != 0 and attempts == ["1"] and not (tmp_path / "done.txt").exists()


# ------------------------------------------------------------------------------------- killed and rerun


@pytest.fixture
def workdir(tmp_path):
    """A working folder for the real workflow on N_PROGRAMS tiny programs, one slow candidate each."""
    for name in ("config.yaml", "resources"):
        (tmp_path / name).symlink_to(ROOT / name)
    programs = tmp_path / "programs"
    programs.mkdir()
    generations = []
    for k in range(N_PROGRAMS):
        (programs / f"p{k}.py").write_text(PROGRAM.format(k=k + 2))
        generations.append({"task_id": f"user/p{k}", "sample_idx": 0, "response": ANSWER.format(k=k + 2)})
    (tmp_path / "generations.jsonl").write_text("".join(json.dumps(g) + "\n" for g in generations))
    overlay = {
        "tasks": {"sources": [{"kind": "folder", "path": str(programs)}], "shards": 2, "validate_run": False},
        "generators": {
            "ops": {"backend": "replay", "path": str(tmp_path / "generations.jsonl"), "tokenizer": "smollm2-135m"}
        },
        "synthesize": {"generator": "ops", "samples_per_task": 1},
        "verify": {
            "mode": "kernelbench",
            "workers": 1,
            "compile_threads": 1,
            "correctness_trials": 2,
            "warmup": 1,
            "timing_trials": 2,
        },
    }
    (tmp_path / "ops.yaml").write_text(yaml.safe_dump(overlay))
    return tmp_path


def run_args(workdir: Path) -> list[str]:
    targets = [f"results/verified/ops/shard-{i}.parquet" for i in range(2)]
    return [*targets, "-s", str(ROOT / "Snakefile"), "--cores", "1", "--configfile", str(workdir / "ops.yaml")]


def kill_during_verification(workdir: Path, sig: int, timeout_s: float = 240) -> Path:
    """Start a run and kill its process group while one shard is verified and another is being verified;
    return the verified shard."""
    cmd = [sys.executable, "-m", "snakemake", *run_args(workdir)]
    proc = subprocess.Popen(
        cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    verified = workdir / "results" / "verified" / "ops"
    logs = workdir / "results" / "logs" / "verify" / "ops"
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            done = sorted(verified.glob("shard-*.parquet"))
            running = [log for log in logs.glob("shard-*.log") if not (verified / f"{log.stem}.parquet").exists()]
            if done and running:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=60)
                return done[0]
            time.sleep(0.1)
        raise AssertionError(f"no moment with one shard verified and one verifying (exit {proc.poll()})")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_run_killed_during_verification_resumes_without_redoing_finished_shards(workdir):
    finished = kill_during_verification(workdir, signal.SIGKILL)
    outputs = workdir / "results" / "verified" / "ops"
    assert sorted(p.name for p in outputs.iterdir()) == [finished.name], "a partial file was left behind"
    mtime = finished.stat().st_mtime_ns
    snakemake("--unlock", *run_args(workdir), cwd=workdir)  # a killed run leaves its lock
    plan = job_counts(snakemake("-n", "--rerun-incomplete", *run_args(workdir), cwd=workdir).stdout)
    assert plan == {"verify": 1}
    snakemake("--rerun-incomplete", *run_args(workdir), cwd=workdir)
    assert finished.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in outputs.iterdir()) == ["shard-0.parquet", "shard-1.parquet"]
    assert job_counts(snakemake("-n", *run_args(workdir), cwd=workdir).stdout) == {}

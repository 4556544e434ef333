"""`snakemake --profile slurm` on a real one-node SLURM cluster (Debian's slurmctld/slurmd, two fake GPUs).

The cluster is set up by tests/slurm/setup_cluster.sh (it installs SLURM with apt when missing, as root). The demo
is run through SLURM up to the curated dataset; SLURM's own job records must show the GPU rules submitted with a
GPU to the `gpu` partition and the CPU rules without one, and the run must agree with the session's local demo run
(tests/conftest.py), whose build cache it shares.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, shards, snakemake

pytestmark = pytest.mark.slurm

SETUP = ROOT / "tests" / "slurm" / "setup_cluster.sh"
SKIP_EXIT = 77
TARGET = "dataset/concur.parquet"
GPU_RULES = {"synthesize", "verify", "refine", "refine_verify"}  # the demo synthesizes in 2 turns
CPU_RULES = {"tasks", "compile", "refine_compile", "curate"}
DAEMON_PIDS = ["slurmd.pid", "slurmctld.pid", "munged.pid"]  # stopped in this order


def stop(pid_file: Path, grace_s: float = 10) -> None:
    """SIGTERM the daemon named in pid_file, SIGKILL it if it is still there after grace_s."""
    if not pid_file.is_file():
        return
    pid = int(pid_file.read_text().split()[0])
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def cancel_jobs(slurm_conf: Path, wait_s: float = 30) -> None:
    """Cancel the cluster's unfinished jobs (a failed or timed-out run leaves them) and wait until they are gone:
    stopping slurmd alone would leave their processes running."""
    env = {**os.environ, "SLURM_CONF": str(slurm_conf)}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            queue = subprocess.run(
                ["squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"], capture_output=True, text=True, env=env, timeout=10
            )
            if queue.returncode != 0 or not queue.stdout.split():
                return
            subprocess.run(["scancel", *queue.stdout.split()], capture_output=True, env=env, timeout=10)
        except subprocess.TimeoutExpired:
            return
        time.sleep(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """SLURM_CONF of a running one-node cluster; its daemons are stopped afterwards by their PIDs."""
    if sys.platform != "linux":
        pytest.skip("the SLURM test cluster needs Linux")
    state = tmp_path_factory.mktemp("slurm") / "concur-slurm-state"
    try:
        proc = subprocess.run(["bash", str(SETUP), str(state.parent)], capture_output=True, text=True, timeout=900)
        if proc.returncode == SKIP_EXIT:
            pytest.skip(f"no SLURM test cluster: {proc.stderr.strip()}")
        assert proc.returncode == 0, f"setup_cluster.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        yield state / "slurm.conf"
    finally:
        if (state / "slurmctld.pid").is_file():
            cancel_jobs(state / "slurm.conf")
        for name in DAEMON_PIDS:
            stop(state / name)
        created = state / "created"  # the config links in /etc/slurm, the fake GPU device files
        for path in created.read_text().split() if created.is_file() else []:
            Path(path).unlink(missing_ok=True)


def config_files(tmp: Path, results: Path, build_cache: Path) -> list[str]:
    """The GPU overlay plus this run's results folder and build cache."""
    paths = tmp / f"{results.name}.yaml"
    paths.write_text(yaml.safe_dump({"results": str(results), "verify": {"build_cache": str(build_cache)}}))
    return ["--configfile", "tests/slurm/gpus.yaml", str(paths)]


def rule_of(comment: str) -> str | None:
    """The rule in the plugin's job comment: rule_<rule>[_wildcards_...], or rule_<group id>_<rules> for a group."""
    name = re.sub(r"_wildcards_.*", "", comment.removeprefix("rule_"))
    if name in GPU_RULES | CPU_RULES:  # a rule of its own (refine_compile is not the compile group)
        return name
    return next((rule for rule in GPU_RULES | CPU_RULES if name.endswith(f"_{rule}")), name)


def slurm_jobs(slurm_conf: Path) -> list[dict]:
    """Every job slurmctld still holds (MinJobAge keeps finished ones): rule, partition, GPUs asked and given."""
    env = {**os.environ, "SLURM_CONF": str(slurm_conf)}
    out = subprocess.run(
        ["scontrol", "-d", "-o", "show", "job"], capture_output=True, text=True, env=env, check=True, timeout=60
    ).stdout
    jobs = []
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        jobs.append(
            {
                "rule": rule_of(fields.get("Comment", "")),
                "state": fields["JobState"],
                "partition": fields["Partition"],
                "asked": fields.get("TresPerJob", ""),
                "given": fields.get("JOB_GRES", "(null)"),
            }
        )
    return jobs


def build_outcomes(results: Path) -> pd.DataFrame:
    """Build statuses and keys; `cached` counts as `built` (the later run finds the earlier one's builds)."""
    builds = shards(results, "builds")[["candidate_id", "status", "cache_key"]]
    return builds.replace({"status": {"cached": "built"}}).reset_index(drop=True)


@pytest.fixture(scope="module")
def runs(cluster, request, tmp_path_factory):
    """The local demo run, the same workflow up to the curated dataset through the SLURM profile, and SLURM's job
    records of the latter. The SLURM run finds the local run's builds in its build cache (C++ builds are most of a
    run's time); its compile jobs still run, find them and report them as `cached`."""
    local = request.getfixturevalue("demo_results")  # only once the cluster is up: no demo run where it skips
    tmp = tmp_path_factory.mktemp("runs")
    remote = tmp / "slurm"
    env = {"SLURM_CONF": str(cluster)}
    args = ["--profile", "slurm", "--profile", "tests/slurm/ci", "--slurm-logdir", str(tmp / "slurm-logs")]
    started = time.monotonic()
    # targets first: --configfile takes a list
    snakemake(str(remote / TARGET), *args, *config_files(tmp, remote, local / "build-cache"), env=env, timeout=900)
    print(f"SLURM run {time.monotonic() - started:.0f} s")
    return local, remote, slurm_jobs(cluster)


def test_every_job_ran_on_slurm(runs):
    jobs = runs[2]
    assert {job["state"] for job in jobs} == {"COMPLETED"}
    assert {job["rule"] for job in jobs} == GPU_RULES | CPU_RULES


def test_gpu_rules_get_a_gpu_on_the_gpu_partition(runs):
    for job in (job for job in runs[2] if job["rule"] in GPU_RULES):
        assert job["partition"] == "gpu", job
        assert job["asked"] == "gres:gpu:1" and job["given"] == "gpu:1", job


def test_cpu_rules_get_no_gpu(runs):
    for job in (job for job in runs[2] if job["rule"] in CPU_RULES):
        assert job["partition"] == "cpu", job
        assert job["asked"] == "" and job["given"] == "(null)", job


def test_compile_shards_run_as_one_group_job(runs):
    assert [job["rule"] for job in runs[2]].count("compile") == 1


def test_artifacts_equal_the_local_run(runs):
    local, remote, _ = runs
    for split in ("tasks/train.parquet", "tasks/eval.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(local / split), pd.read_parquet(remote / split))
    pd.testing.assert_frame_equal(shards(local, "candidates"), shards(remote, "candidates"))
    pd.testing.assert_frame_equal(build_outcomes(local), build_outcomes(remote))
    verdicts = ["candidate_id", "status", "compiled", "correct"]  # timings, and so speedups, differ between runs
    pd.testing.assert_frame_equal(shards(local, "verified")[verdicts], shards(remote, "verified")[verdicts])


def test_curated_dataset_holds_correct_kernels_of_the_slurm_run(runs):
    remote = runs[1]
    dataset = pd.read_parquet(remote / TARGET)
    verified = pd.concat([shards(remote, "verified", turn=turn) for turn in (1, 2)], ignore_index=True)
    correct = verified.set_index("candidate_id")["correct"]
    assert len(dataset) > 0 and correct.loc[dataset["candidate_id"]].all()

"""The workflow itself: dry-run job counts, lint, DAG rendering, config errors, and rerun triggers."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, job_counts, load_benchmark, snakemake

DEFAULT_JOBS = {
    "all": 1,
    "tasks": 1,
    "synthesize": 2,
    "compile": 2,
    "verify": 2,
    "refine": 2,  # the demo's second turn: one refine, compile and verify job per shard
    "refine_compile": 2,
    "refine_verify": 2,
    "curate": 1,
    "train": 1,
    "eval_generate": 2,
    "eval_compile": 2,
    "eval_verify": 2,
    "eval_score": 1,
    "analyze": 1,
}
# the default config with one turn, as the prepared tables below have
SINGLE_TURN = "synthesize:\n  turns: 1\nevaluate:\n  turns: 1\n"


def test_dry_run_lists_every_job_of_the_default_config(tmp_path):
    out = snakemake("-n", "--config", f"results={tmp_path}/results")
    assert job_counts(out.stdout) == DEFAULT_JOBS


def test_shard_count_comes_from_config(tmp_path):
    overlay = tmp_path / "shards.yaml"
    overlay.write_text("tasks:\n  shards: 5\n")
    out = snakemake("-n", "--configfile", str(overlay), "--config", f"results={tmp_path}/results")
    counts = job_counts(out.stdout)
    assert counts["synthesize"] == counts["compile"] == counts["verify"] == 5


def test_turns_plan_one_job_per_shard_and_turn(tmp_path):
    """Turn k's refine job reads the shard's earlier turns and turn k-1's verdicts; curation reads every turn;
    eval_score every turn's verdicts and candidates; turn 1's jobs do not depend on the number of turns."""
    overlay = tmp_path / "turns.yaml"
    overlay.write_text("synthesize:\n  turns: 3\nevaluate:\n  turns: 3\n")
    res = f"{tmp_path}/results"
    out = snakemake("-n", "--configfile", str(overlay), "--config", f"results={res}").stdout
    counts = job_counts(out)
    assert counts["refine"] == counts["refine_compile"] == counts["refine_verify"] == 4
    assert counts["eval_refine"] == counts["eval_refine_verify"] == 4 and counts["synthesize"] == 2
    third = next(j for j in jobs(out, "refine") if j["wildcards"] == "generator=demo-teacher, turn=3, shard=0")
    assert third["input"].split(", ")[2:] == [
        f"{res}/candidates/demo-teacher/shard-0.parquet",
        f"{res}/candidates/demo-teacher/turn-2/shard-0.parquet",
        f"{res}/verified/demo-teacher/turn-2/shard-0.parquet",
    ]
    (curate,) = jobs(out, "curate")
    assert f"{res}/verified/demo-teacher/turn-3/shard-1.parquet" in curate["input"]
    (score,) = jobs(out, "eval_score")
    assert f"{res}/eval/concur/turn-3/verified.parquet" in score["input"]
    assert f"{res}/eval/concur/turn-2/candidates.parquet" in score["input"]
    from concur import config as config_mod
    from concur import workflow

    one, three = (config_mod.load(str(ROOT / "config.yaml")) for _ in range(2))
    three["synthesize"]["turns"] = 3
    assert workflow.synthesis_settings(one) == workflow.synthesis_settings(three)
    assert "stop_speedup" in workflow.refine_settings(three)


def jobs(output: str, rule: str) -> list[dict[str, str]]:
    """The dry run's job blocks of one rule (each starts after a `[date]` line): their `key: value` lines."""
    blocks = re.split(r"^\[.*\]$|\n\s*\n", output, flags=re.MULTILINE)
    found = []
    for block in blocks:
        lines = [line.strip() for line in block.strip().splitlines()]
        if lines and lines[0] in (f"rule {rule}:", f"localrule {rule}:"):
            found.append(dict(line.split(": ", 1) for line in lines[1:] if ": " in line))
    return found


# every adapter of the paper (ConCuR and the four ablation subsets) and two baseline generators, one behind an
# OpenAI-compatible endpoint and one replayed from a file
ABLATIONS_AND_BASELINES = """
train:
  adapters: [concur, min, max, speedup, random]
generators:
  served:
    backend: openai
    base_url: http://localhost:9/v1
    model: served-model
    api_key_env: CONCUR_TEST_BASELINE_KEY
  replayed:
    backend: replay
    path: resources/demo/generations.jsonl
    tokenizer: smollm2-135m
evaluate:
  baselines: [served, replayed]
"""
MODELS = {"base", "concur", "min", "max", "speedup", "random", "served", "replayed"}


def test_dry_run_with_every_adapter_and_baselines(tmp_path):
    overlay = tmp_path / "ablations.yaml"
    overlay.write_text(ABLATIONS_AND_BASELINES)
    out = snakemake(
        "-n",
        "--configfile",
        str(overlay),
        "--config",
        f"results={tmp_path}/results",
        env={"CONCUR_TEST_BASELINE_KEY": "not-a-key"},
    ).stdout
    counts = job_counts(out)
    assert counts["train"] == 5
    assert counts["eval_generate"] == counts["eval_compile"] == counts["eval_verify"] == 8  # base, 5 adapters, 2
    assert counts["eval_score"] == counts["analyze"] == 1
    assert {j["wildcards"] for j in jobs(out, "train")} == {
        f"adapter={a}" for a in ("concur", "min", "max", "speedup", "random")
    }
    generate = {j["wildcards"].removeprefix("model="): j for j in jobs(out, "eval_generate")}
    assert set(generate) == MODELS
    for adapter in ("concur", "min", "max", "speedup", "random"):  # an adapter model is trained first
        assert f"{tmp_path}/results/adapters/{adapter}" in generate[adapter]["input"]
    assert "adapters" not in generate["served"]["input"] and "adapters" not in generate["base"]["input"]
    assert "resources/demo/generations.jsonl" in generate["replayed"]["input"]
    (score,) = jobs(out, "eval_score")
    assert {m for m in MODELS if f"eval/{m}/verified.parquet" in score["input"]} == MODELS
    assert "eval/base/candidates.parquet" in score["input"]  # the difficulty model's generations
    assert all(f"eval/{name}" in score["output"] for name in ("scores.csv", "table.csv", "table.md", "difficulty.csv"))
    (analyze,) = jobs(out, "analyze")
    assert "eval/scores.csv" in analyze["input"]


def test_baseline_api_key_must_be_set(tmp_path):
    overlay = tmp_path / "ablations.yaml"
    overlay.write_text(ABLATIONS_AND_BASELINES)
    env = {k: v for k, v in os.environ.items() if k != "CONCUR_TEST_BASELINE_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(overlay)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode != 0 and "CONCUR_TEST_BASELINE_KEY" in proc.stdout + proc.stderr


def test_paper_config_plans_every_stage(tmp_path):
    # the paper's config with a served baseline (its commented example): GPUs for the local models only
    overlay = tmp_path / "baseline.yaml"
    overlay.write_text(
        "generators:\n  served:\n    backend: openai\n    base_url: http://localhost:9/v1\n"
        "    model: served-model\nevaluate:\n  baselines: [served]\n"
    )
    out = snakemake(
        "-n", "--configfile", "configs/paper.yaml", str(overlay), "--config", f"results={tmp_path}/paper"
    ).stdout
    counts = job_counts(out)
    assert counts["synthesize"] == counts["compile"] == counts["verify"] == 64
    assert counts["train"] == 5 and counts["eval_generate"] == counts["eval_verify"] == 7
    gpus = {j["wildcards"]: re.search(r"\bgpu=(\d+)", j["resources"])[1] for j in jobs(out, "eval_generate")}
    assert gpus == {
        "model=base": "4",
        "model=concur": "4",
        "model=min": "4",
        "model=max": "4",
        "model=speedup": "4",
        "model=random": "4",
        "model=served": "0",
    }


def test_bad_config_stops_with_one_clear_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("verify:\n  device: tpu\n")
    out = snakemake("-n", "--configfile", str(bad), check=False)
    assert out.returncode != 0
    assert "config: verify.device: 'tpu' is not one of ['auto', 'cpu', 'cuda']" in out.stdout + out.stderr


def test_lint_is_clean():
    out = snakemake("--lint", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# the commands of Debian's slurm-client, slurmctld, slurmd and munge packages
SLURM_COMMANDS = {
    "sacct",
    "sacctmgr",
    "salloc",
    "sattach",
    "sbatch",
    "sbcast",
    "scancel",
    "scontrol",
    "sdiag",
    "sinfo",
    "sprio",
    "squeue",
    "sreport",
    "srun",
    "sshare",
    "sstat",
    "strigger",
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "munge",
    "munged",
    "remunge",
    "unmunge",
}
GPU_RULES = {
    "synthesize",
    "verify",
    "refine",
    "refine_verify",
    "train",
    "eval_generate",
    "eval_verify",
    "eval_refine",
    "eval_refine_verify",
}


def path_without_slurm(folder: Path) -> str:
    """A PATH of one folder linking every command of this PATH but SLURM's: this machine as one without SLURM."""
    folder.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        for command in sorted(Path(entry).iterdir()) if Path(entry).is_dir() else []:
            link = folder / command.name
            if command.name not in SLURM_COMMANDS and not link.is_symlink() and os.access(command, os.X_OK):
                link.symlink_to(command)
    return str(folder)


def job_resources(output: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job of a dry run, the jobs inside group jobs included."""
    found, rule = [], None
    for line in map(str.strip, output.splitlines()):
        if match := re.fullmatch(r"(?:local)?rule (\w+):", line):
            rule = match[1]
        elif line.startswith("resources: ") and rule:
            found.append((rule, dict(item.split("=", 1) for item in line.removeprefix("resources: ").split(", "))))
            rule = None
    return found


def test_slurm_profile_plans_the_workflow_without_slurm(tmp_path):
    """Profile lint: `snakemake -n --profile slurm` from the repository root on a machine without SLURM. The
    profile parses, the plan is the default one, each job asks for the partition the profile gives its rule and
    for the GPUs of its config section (one each with the SLURM test's overlay), and the groups are formed."""
    path = path_without_slurm(tmp_path / "bin")
    assert not any(shutil.which(command, path=path) for command in ("sbatch", "sinfo", "squeue", "sacct"))
    proc = snakemake(
        "-n",
        "--profile",
        "slurm",
        "--configfile",
        "tests/slurm/gpus.yaml",
        "--config",
        f"results={tmp_path}/results",
        env={"PATH": path},
    )
    assert "Using profile slurm" in proc.stdout + proc.stderr
    assert job_counts(proc.stdout) == DEFAULT_JOBS
    resources = job_resources(proc.stdout)
    assert len(resources) == sum(DEFAULT_JOBS.values())
    for rule, asked in resources:
        if rule in GPU_RULES:
            assert asked["slurm_partition"] == "gpu" and asked["gpu"] == "1", (rule, asked)
        else:
            assert asked["slurm_partition"] == "cpu" and asked.get("gpu", "0") == "0", (rule, asked)
    # both compile shards in one group job (group-components: compile=4), eval_score and analyze in another
    assert proc.stdout.count("Group job compile") == 1 and proc.stdout.count("Group job report") == 1


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
@pytest.mark.parametrize("graph", ["--dag", "--rulegraph", "--filegraph"])
def test_graphs_render_to_svg(graph, tmp_path):
    dot = snakemake(graph, "--config", f"results={tmp_path}/results").stdout
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "curate" in svg and "verify" in svg


@pytest.fixture(scope="module")
def prepared_run(tmp_path_factory):
    """curate, eval_score and analyze run through Snakemake (scripts, params, outputs) on tables written here in the
    contracts' shapes: a synthetic synthesis run (benchmarks/curate_scale.py) and two models' eval verdicts."""

    from concur.io import write_parquet
    from concur.tasks import shard_of

    bench = load_benchmark("curate_scale")
    tmp_path = tmp_path_factory.mktemp("prepared")
    res = tmp_path / "results"
    candidates, verdicts, tasks = bench.synthetic_tables(60, 5)
    candidates["generator"] = "demo-teacher"
    for i in range(2):  # the default config's two shards of its teacher
        keep = (candidates["task_id"].map(lambda t: shard_of(t, 2)) == i).to_numpy()
        write_parquet(candidates[keep], res / "candidates" / "demo-teacher" / f"shard-{i}.parquet")
        write_parquet(verdicts[keep], res / "verified" / "demo-teacher" / f"shard-{i}.parquet")
    write_parquet(tasks, res / "tasks" / "train.parquet")
    eval_candidates, eval_verdicts, eval_tasks = bench.synthetic_tables(8, 2, seed=5)
    write_parquet(eval_tasks.assign(split="eval", level=[1, 1, 1, 2, 2, 2, 2, 3]), res / "tasks" / "eval.parquet")
    for model, flip in (("base", False), ("concur", True)):
        write_parquet(eval_candidates, res / "eval" / model / "candidates.parquet")
        write_parquet(
            eval_verdicts.assign(correct=eval_verdicts["correct"] ^ flip), res / "eval" / model / "verified.parquet"
        )

    single = tmp_path / "single_turn.yaml"
    single.write_text(SINGLE_TURN)
    snakemake(
        "-s",
        str(ROOT / "Snakefile"),
        "--configfile",
        str(ROOT / "config.yaml"),
        str(single),
        "--cores",
        "1",
        "--config",
        f"results={res}",
        "--allowed-rules",
        "curate",
        "eval_score",
        "analyze",
        "--",
        str(res / "dataset" / "concur.parquet"),
        str(res / "eval" / "table.md"),
        str(res / "analysis" / "summary.json"),
        cwd=tmp_path,
    )
    return res, verdicts, eval_verdicts


def test_scoring_and_analysis_rules_run_on_prepared_inputs(prepared_run):
    import pandas as pd

    res, verdicts, eval_verdicts = prepared_run
    table = pd.read_csv(res / "eval" / "table.csv")
    assert list(table["model"]) == ["base", "concur"] and list(table["kind"]) == ["base", "adapter"]
    assert [c for c in table.columns if c.startswith("L1_")] == ["L1_exec@1", "L1_exec@2", "L1_fast_1@1", "L1_fast_1@2"]
    scores = pd.read_csv(res / "eval" / "scores.csv", dtype={"group": str})
    overall = scores[scores["scope"] == "overall"].set_index("model")
    assert overall.loc["base", "exec"] == pytest.approx(eval_verdicts["correct"].mean())
    assert overall.loc["concur", "exec"] == pytest.approx(1 - eval_verdicts["correct"].mean())
    assert table.set_index("model").loc["base", "all_exec@1"] == pytest.approx(overall.loc["base", "pass@1"])
    difficulty = pd.read_csv(res / "eval" / "difficulty.csv")
    assert len(difficulty) == 8 and set(difficulty["model"]) == {"base"}
    assert set(scores.loc[scores["scope"] == "difficulty", "group"]) == set(difficulty["difficulty"])
    assert "## By difficulty" in (res / "eval" / "table.md").read_text()
    summary = json.loads((res / "analysis" / "summary.json").read_text())
    assert summary["n_candidates"] == 300 and summary["n_correct"] == int(verdicts["correct"].sum())
    assert len(summary["eval_scores"]) == 2 and len(list((res / "figures").glob("*.png"))) == 8


def test_the_command_line_writes_what_the_rules_write(prepared_run, tmp_path, capfd):
    """`concur curate`, `eval-score` and `analyze` on the same inputs write the same files as their rules, and log
    the summary lines the rules' logs hold."""
    import pandas as pd

    from concur.cli import main

    res, _, _ = prepared_run
    cli = tmp_path / "cli"
    shards = [
        str(res / kind / "demo-teacher" / f"shard-{i}.parquet") for kind in ("candidates", "verified") for i in range(2)
    ]
    import yaml

    single = yaml.safe_load((ROOT / "config.yaml").read_text())
    single["synthesize"]["turns"] = single["evaluate"]["turns"] = 1  # as the prepared run's
    (tmp_path / "single.yaml").write_text(yaml.safe_dump(single))
    config = ["--config", str(tmp_path / "single.yaml")]
    assert (
        main(
            [
                "curate",
                *config,
                "--candidates",
                *shards[:2],
                "--verified",
                *shards[2:],
                "--tasks",
                str(res / "tasks" / "train.parquet"),
                "--out-dir",
                str(cli / "dataset"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "eval-score",
                *config,
                "--verified",
                *(f"{m}={res / 'eval' / m / 'verified.parquet'}" for m in ("base", "concur")),
                "--tasks",
                str(res / "tasks" / "eval.parquet"),
                "--difficulty",
                str(res / "eval" / "base" / "candidates.parquet"),
                "--out-dir",
                str(cli / "eval"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "analyze",
                *config,
                "--candidates",
                *shards[:2],
                "--verified",
                *shards[2:],
                "--tasks",
                str(res / "tasks" / "train.parquet"),
                "--scores",
                str(res / "eval" / "scores.csv"),
                "--out-dir",
                str(cli),
            ]
        )
        == 0
    )
    stderr = capfd.readouterr().err

    written = sorted(p.relative_to(cli).as_posix() for p in cli.rglob("*") if p.is_file())
    assert written == sorted(
        p.relative_to(res).as_posix()
        for p in res.rglob("*")
        if p.is_file()
        and p.relative_to(res).parts[0] in ("dataset", "analysis", "figures")
        or p.relative_to(res).as_posix().startswith("eval/")
        and p.suffix in (".csv", ".md")
    )
    for name in written:
        if name.endswith(".parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(cli / name), pd.read_parquet(res / name))
        elif not name.endswith(".png"):
            assert (cli / name).read_text() == (res / name).read_text(), name
    for stage, log in (("curate", "curate"), ("eval scores", "eval/score"), ("analyze", "analyze")):
        line = next(line for line in (res / "logs" / f"{log}.log").read_text().splitlines() if f" {stage}" in line)
        assert line.split(": ", 1)[1].replace(str(res), str(cli)) in stderr, line


# a run of replayed generations only: synthesize -> verify -> curate -> analyze, no model-backed generator
# (`base_generator: null` turns off the evaluation config.yaml sets up; adapters: [] leaves out training)
REPLAY_ONLY = """
generators:
  demo-teacher:
    backend: replay
    path: resources/demo/generations.jsonl
    tokenizer: smollm2-135m
synthesize:
  generator: demo-teacher
  turns: 1
train:
  adapters: []
evaluate:
  base_generator: null
"""


def test_replay_only_config_plans_no_evaluation(tmp_path):
    overlay = tmp_path / "replay.yaml"
    overlay.write_text(REPLAY_ONLY)
    args = ("-n", "--configfile", str(overlay), "--config", f"results={tmp_path}/results")
    assert job_counts(snakemake(*args).stdout) == {
        "all": 1,
        "tasks": 1,
        "synthesize": 2,
        "compile": 2,
        "verify": 2,
        "curate": 1,
        "analyze": 1,
    }
    (analyze,) = jobs(snakemake(*args, "--", f"{tmp_path}/results/analysis/summary.json").stdout, "analyze")
    assert "eval/" not in analyze["input"]
    # an evaluation target stops the run (a dry run too) with the line that says why
    out = snakemake(*args, "--", f"{tmp_path}/results/eval/scores.csv", check=False)
    assert out.returncode != 0
    assert "eval/scores.csv: evaluation is off (no evaluate.base_generator in the config)" in out.stdout + out.stderr


def test_replay_only_curate_and_analyze_run(prepared_run, tmp_path):
    """curate and analyze through Snakemake with evaluation off, on the prepared synthesis tables: the analysis
    needs no eval/scores.csv and draws its evaluation figures as placeholders."""
    res_in, verdicts, _ = prepared_run
    res = tmp_path / "results"
    for part in ("candidates", "verified", "tasks"):
        shutil.copytree(res_in / part, res / part)
    overlay = tmp_path / "replay.yaml"
    overlay.write_text(REPLAY_ONLY)
    snakemake(
        "-s",
        str(ROOT / "Snakefile"),
        "--configfile",
        str(ROOT / "config.yaml"),
        str(overlay),
        "--cores",
        "1",
        "--config",
        f"results={res}",
        "--allowed-rules",
        "curate",
        "analyze",
        cwd=ROOT,
    )
    summary = json.loads((res / "analysis" / "summary.json").read_text())
    assert summary["n_candidates"] == 300 and summary["n_correct"] == int(verdicts["correct"].sum())
    assert summary["eval_scores"] is None and "No evaluation scores" in summary["figures"]["eval_scores.png"]
    assert (res / "dataset" / "card.md").exists() and not (res / "eval").exists()


def test_compile_jobs_get_every_setting_a_build_reads():
    """light_cuda_headers changes what a build compiles and sandbox how its candidate code is confined: both must
    reach the compile job (and rerun it when changed); timing and correctness settings must not."""
    from concur import config, workflow

    cfg = config.load("config.yaml")
    cfg["verify"].update(sandbox="required", light_cuda_headers=False, timing_trials=7)
    settings = workflow.compile_settings(cfg)
    assert settings["sandbox"] == "required" and settings["light_cuda_headers"] is False
    assert "timing_trials" not in settings and "correctness_trials" not in settings


def test_a_changed_verify_setting_reruns_the_jobs_that_read_it(tmp_path):
    """Through Snakemake itself: after a compile and a verify job have run, editing light_cuda_headers or sandbox
    reruns the compile job (its params changed), editing a timing setting reruns the verify job only, and editing
    how a job runs (cores, processes) reruns neither."""
    from verify_frames import candidates_frame, tasks_frame

    from concur.io import write_parquet

    res = tmp_path / "results"
    write_parquet(tasks_frame([("t", "x = 1")]), res / "tasks" / "train.parquet")
    write_parquet(candidates_frame([("c-1", "t", "")]), res / "candidates" / "demo-teacher" / "shard-0.parquet")
    target = str(res / "verified" / "demo-teacher" / "shard-0.parquet")

    def run(*args: str, overlay: str = "") -> str:
        (tmp_path / "overlay.yaml").write_text(f"verify:\n  {overlay}\n" if overlay else "{}\n")
        files = ("--configfile", str(ROOT / "config.yaml"), str(tmp_path / "overlay.yaml"))
        rules = ("--allowed-rules", "compile", "verify")
        return snakemake(*args, "-s", str(ROOT / "Snakefile"), *files, "--cores", "1", "--config", f"results={res}",
                         *rules, "--", target, cwd=tmp_path).stdout  # fmt: skip

    run()
    for overlay, rerun in (
        ("light_cuda_headers: false", {"compile", "verify"}),
        ("sandbox: required", {"compile", "verify"}),
        ("timing_trials: 7", {"verify"}),
        ("compile_threads: 3", set()),
        ("workers: 3", set()),
    ):
        planned = {rule for rule in ("compile", "verify") if jobs(run("-n", overlay=overlay), rule)}
        assert planned == rerun, overlay

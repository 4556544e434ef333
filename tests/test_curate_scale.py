"""The scale benchmark (benchmarks/curate_scale.py): its synthetic run has the documented shape, and a reduced run
of the benchmark itself goes through curation and analysis."""

import json

import numpy as np
import pandas as pd
import pytest

from concur import contracts
from concur.analyze import FIGURES
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("curate_scale")


def test_synthetic_tables_have_the_documented_shape(bench):
    candidates, verdicts, tasks = bench.synthetic_tables(n_tasks=2000, per_task=5, seed=3)
    assert list(candidates.columns) == list(contracts.CANDIDATES)
    assert list(verdicts.columns) == list(contracts.VERDICTS) and list(tasks.columns) == list(contracts.TASKS)
    assert len(candidates) == len(verdicts) == 10000 and candidates["candidate_id"].is_unique
    assert (candidates.groupby("task_id").size() == 5).all() and set(candidates["task_id"]) == set(tasks["task_id"])
    assert (candidates["candidate_id"] == verdicts["candidate_id"]).all()
    tokens = candidates["reasoning_tokens"]
    assert tokens.min() >= 64 and tokens.max() == bench.MAX_TOKENS and 3000 < tokens.median() < 7000
    assert 0.28 < verdicts["correct"].mean() < 0.40  # about one in three correct
    ok = verdicts["correct"]
    assert (verdicts.loc[ok, "speedup"] > 0).all() and (verdicts.loc[~ok, "speedup"] == 0).all()
    log_speed = np.log(verdicts.loc[ok, "speedup"])
    assert -0.4 < log_speed.median() < 0 and 0.5 < log_speed.std() < 0.9  # lognormal, median about 0.8
    assert (verdicts["status"] == "correct").equals(ok)
    shares = tasks["category"].value_counts(normalize=True)
    assert set(shares.index) == set(contracts.CATEGORIES) and abs(shares["fused"] - 0.5) < 0.05
    # accuracy falls with reasoning length, as in the paper's data
    short = verdicts.loc[tokens.to_numpy() < 3000, "correct"].mean()
    long = verdicts.loc[tokens.to_numpy() > 9000, "correct"].mean()
    assert short > 2 * long


def test_synthetic_tables_are_seeded(bench):
    first, second = bench.synthetic_tables(50, seed=1), bench.synthetic_tables(50, seed=1)
    for a, b in zip(first, second):
        pd.testing.assert_frame_equal(a, b)


def test_reduced_run(bench, tmp_path, capsys):
    seconds = bench.main(["--tasks", "200", "--shards", "4", "--keep", str(tmp_path)])
    assert seconds["n_candidates"] == 1000
    assert all(seconds[stage] > 0 for stage in ("curate", "analyze", "together"))
    out = capsys.readouterr().out
    assert "curate + analyze, one after the other" in out and "1000" in out and "20" in out
    for run in ("alone", "together"):
        summary = json.loads((tmp_path / "outputs" / run / "analysis" / "summary.json").read_text())
        assert summary["n_candidates"] == 1000 and summary["n_correct"] == seconds["n_correct"]
        assert len(list((tmp_path / "outputs" / run / "figures").glob("*.png"))) == len(FIGURES)
        dataset = pd.read_parquet(tmp_path / "outputs" / run / "dataset" / "concur.parquet")
        assert len(dataset) > 0 and dataset["candidate_id"].is_unique
    assert len(list((tmp_path / "inputs" / "candidates").glob("shard-*.parquet"))) == 4

"""The GPU benchmarks' own inputs, built on the CPU: a benchmark that only runs on the device must not find out
there that its tables no longer follow the contracts (docs/data.md)."""

import importlib.util
from pathlib import Path

from concur import contracts

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_throughput_benchmarks_tables_follow_the_contracts():
    bench = load("verify_throughput")
    candidates, tasks = bench.candidates_frame(9, ["fast", "late_handoff"]), bench.tasks_frame()
    contracts.require_columns(candidates, contracts.CANDIDATES, "candidates")
    contracts.require_columns(tasks, contracts.TASKS, "tasks")
    assert len(candidates) == 10 and candidates["candidate_id"].is_unique
    assert set(candidates["task_id"]) <= set(tasks["task_id"])
    assert candidates["code"].str.contains("load_inline").all()

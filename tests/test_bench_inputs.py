"""The GPU benchmarks' own inputs, built on the CPU: a benchmark that only runs on the device must not find out
there that its tables no longer follow the contracts (docs/data.md)."""

from concur import contracts
from conftest import load_benchmark


def test_the_throughput_benchmarks_tables_follow_the_contracts():
    bench = load_benchmark("verify_throughput")
    candidates, tasks = bench.candidates_frame(9, ["fast", "late_handoff"]), bench.tasks_frame()
    contracts.require_columns(candidates, contracts.CANDIDATES, "candidates")
    contracts.require_columns(tasks, contracts.TASKS, "tasks")
    assert len(candidates) == 10 and candidates["candidate_id"].is_unique
    assert set(candidates["task_id"]) <= set(tasks["task_id"])
    assert candidates["code"].str.contains("load_inline").all()

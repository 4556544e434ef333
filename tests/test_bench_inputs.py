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


def test_the_gpu_scaling_table_bounds_each_count_by_its_fixed_part_and_longest_candidate(tmp_path, capsys):
    """1 GPU: 100 s, of which the candidates took 80 on the referee (fixed part 20 s). 2 GPUs: at best 20 + 40 s,
    a bound of 1.67x; measured 62.5 s, 1.60x. With one candidate of 50 s, 2 GPUs cannot beat 20 + 50 s."""
    import pandas as pd

    bench = load_benchmark("verify_gpus")
    for count, times in ((1, [20.0] * 4), (2, [20.0] * 4), (4, [50.0, 10.0, 10.0, 10.0])):
        frame = pd.DataFrame({"candidate_id": list("abcd"), "status": "correct", "correct": True, "eval_s": times})
        frame.to_parquet(tmp_path / f"verified_{count}.parquet")
    bench.table(tmp_path, {"1": 100.0, "2": 62.5, "4": 80.0})
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[7].strip() for r in rows] == ["1.00x", "1.67x", "1.43x"]
    assert [r[6].strip() for r in rows] == ["1.00x", "1.60x", "1.25x"] and all(r[8].strip() == "4/4" for r in rows)

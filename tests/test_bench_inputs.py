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


PARITYBENCH_STYLE = """
import sys
_module = sys.modules[__name__]
models = _module
from torch.nn import Module
import math, numpy, torch
import numpy as np


def scale_of(x):
    return math.sqrt(x)


class Unused(Module):
    pass


class Scaled(Module):
    def __init__(self, cfg):
        super().__init__()
        self.scale = scale_of(cfg.dim)

    def forward(self, x):
        return torch.relu(x) * self.scale


class KeywordOnly(Module):
    def forward(self, x, mask=None):
        return x


class Wrapped(Module):
    def __init__(self, layer, loss):
        super().__init__()
        self.layer, self.loss = layer, loss

    def forward(self, x):
        return self.loss(self.layer(x), x[:, :2])


from torch.nn import MSELoss
from _paritybench_helpers import _mock_config, _mock_layer


TESTCASES = [
    # (nn.Module, init_args, forward_args, jit_compiles)
    (Scaled,
     lambda: ([], {'cfg': _mock_config(dim=4)}),
     lambda: ([torch.rand([4, 4])], {}),
     True),
    (KeywordOnly,
     lambda: ([], {}),
     lambda: ([torch.rand([4])], {'mask': torch.rand([4])}),
     False),
    (Wrapped,
     lambda: ([_mock_layer(4, 2), MSELoss()], {}),
     lambda: ([torch.rand([3, 4])], {}),
     True),
]
"""


def test_paritybench_test_cases_become_kernelbook_rows_the_loader_takes(tmp_path):
    """A module, the definitions it reaches (not the others), the imports it names, its test case's inputs; a test
    case with keyword forward inputs has no KernelBook shape and is counted, not built."""
    from concur.tasks import adapt_kernelbook

    bench = load_benchmark("kernelbook_programs")
    (tmp_path / "test_someone_repo.py").write_text(PARITYBENCH_STYLE)
    rows, skipped = bench.rows_of(tmp_path, 10)
    assert [r["entry_point"] for r in rows] == ["Scaled", "Wrapped"] and sum(skipped.values()) == 1
    # names only the test case uses: the file's own import, and paritybench's layer stand-in (a Linear here)
    namespace: dict = {}
    exec(adapt_kernelbook(rows[1]["python_code"], "Wrapped"), namespace)
    wrapped = namespace["Model"](*namespace["get_init_inputs"]())
    assert type(wrapped.layer).__name__ == "Linear" and wrapped(*namespace["get_inputs"]()).shape == ()
    code = rows[0]["python_code"]
    assert "def scale_of" in code and "Unused" not in code and "import math" in code and "_module" not in code
    namespace: dict = {}
    exec(adapt_kernelbook(code, "Scaled"), namespace)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    assert model(*namespace["get_inputs"]()).shape == (4, 4) and model.scale == 2.0


def test_a_kernelbook_program_as_its_own_hardened_candidate_passes_the_static_screen(tmp_path):
    """`--verify --mode hardened` wraps a task's own program so that the static screen lets it through (a kernel
    whose result forward returns, no subclass of Model); as KernelBench's `ModelNew = Model` it would not."""
    from concur.tasks import adapt_kernelbook
    from concur.verify.screen import screen

    bench = load_benchmark("kernelbook_programs")
    (tmp_path / "test_someone_repo.py").write_text(PARITYBENCH_STYLE)
    rows, _ = bench.rows_of(tmp_path, 10)
    code = adapt_kernelbook(rows[0]["python_code"], "Scaled")
    assert [f.rule for f in screen(bench.own_candidate(code, "kernelbench"))] == ["no_custom_kernel"]
    assert screen(bench.own_candidate(code, "hardened")) == []


def test_the_contestant_loop_probe_reports_through_the_verifier(tmp_path):
    """The probe candidate of loop_in_contestant passes the static screen, runs its loops inside a hardened CPU
    contestant, and its three readings come back through its verdict's reason (the CPU's honest C++ relu_add)."""
    from concur.verify.screen import screen

    bench = load_benchmark("loop_in_contestant")
    assert screen(bench.probe_program("fast", "256x1024")) == []
    found = bench.readings(["cpp"], ["8x16"], tmp_path, "cpu", loops=2, calls=100)["8x16:cpp"]
    assert isinstance(found, dict) and list(found) == list(bench.READINGS), found
    assert all(eager > 0 and kernel > 0 for eager, kernel in found.values()), found
    assert bench.parse("RuntimeError: no reading") is None


def test_the_core_interference_table_times_the_launch_core_beside_each_other_core(capsys):
    """Every other core of this process gets a row (busy alone), then all of them at once; each row's pace is a
    positive time; the process's own cores are given back afterwards."""
    import os

    bench = load_benchmark("core_interference")
    cores = sorted(os.sched_getaffinity(0))
    bench.LOOP_STEPS, bench.BEST_OF, bench.SETTLE_S = 20_000, 2, 0.01
    bench.main(["--core", str(cores[-1])])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[3:]]
    busy = ["nothing", *(f"core {c}" for c in cores[:-1]), f"all {len(cores) - 1} others"]
    assert [r[1].strip() for r in rows] == busy
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert sorted(os.sched_getaffinity(0)) == cores


def test_the_small_speedups_table_gives_each_row_its_median_and_range_over_rounds(capsys):
    """Three rounds: the plain loop read 2.0, 2.5 and 2.4 (median 2.4), the verifier 2.2, 1.8 and 2.3 (median 2.2):
    the row shows 2.20 1.80-2.30 and 2.2 / 2.4 against the plain loop, not one round's ratio."""
    bench = load_benchmark("small_speedups")

    def loop(eager, kernel):
        return {"256x1024": {"eager_ms": eager, "kernel_ms": kernel, "median_ratio": eager / kernel}}

    plain = {"plain": {"fast": [loop(0.020, 0.010), loop(0.025, 0.010), loop(0.024, 0.010)]}}
    judged = {"verifier": [{"256x1024:fast": ("correct", r, 0.011 * r, 0.011)} for r in (2.2, 1.8, 2.3)]}
    bench.print_table(["256x1024"], ["fast"], plain, judged)
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[4].strip() for r in rows] == ["2.40 2.00-2.50 (medians' 2.40)", "2.20 1.80-2.30 (correct)"]
    assert [r[5].strip() for r in rows] == ["1.000", f"{2.2 / 2.4:.3f}"]
    assert rows[1][3].strip() == f"{0.011 * 2.2:.4f} / 0.0110"
    bench.print_table(["256x1024"], ["fast"], {"plain": {"fast": plain["plain"]["fast"][:1]}}, {})
    assert "2.00 (medians' 2.00)" in capsys.readouterr().out  # one round: no range

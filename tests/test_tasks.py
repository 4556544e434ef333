import logging

import pandas as pd
import pytest

from concur import contracts
from concur.tasks import (
    TaskError,
    adapt_kernelbook,
    build_tasks,
    categorise,
    check_program,
    count_ops,
    load_builtin,
    select_shard,
    shard_of,
)
from conftest import ROOT

PROGRAM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return torch.relu((x + y) * self.scale).sum(dim=-1)

def get_inputs():
    return [torch.rand(4, 8), torch.rand(4, 8)]

def get_init_inputs():
    return [2.0]
"""


def test_count_ops_counts_calls_and_arithmetic_in_forward_only():
    # x + y, * scale, torch.relu, .sum  -> 4; super().__init__ and get_inputs' calls do not count
    assert count_ops(PROGRAM) == 4


def test_check_program_names_missing_definitions():
    with pytest.raises(TaskError, match=r"t.py: missing get_inputs, get_init_inputs"):
        check_program("class Model: pass\n", "t.py")
    with pytest.raises(TaskError, match=r"t.py: not valid Python \(line 1"):
        check_program("def (:\n", "t.py")


def test_shards_are_stable_and_cover_every_task_once():
    ids = [f"suite/task{i}" for i in range(50)]
    tasks = pd.DataFrame({"task_id": ids})
    parts = [select_shard(tasks, i, 3)["task_id"].tolist() for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(ids)
    assert shard_of("suite/task7", 3) == shard_of("suite/task7", 3)
    # the shard of a task does not depend on which other tasks exist
    assert select_shard(tasks.iloc[:5], shard_of("suite/task3", 3), 3)["task_id"].str.contains("task3").any()


def test_builtin_suite_meets_the_contract():
    splits = build_tasks([{"kind": "builtin", "path": str(ROOT / "resources" / "suite")}], {"validate_run": False})
    train, eval_ = splits["train"], splits["eval"]
    assert len(train) >= 12 and len(eval_) >= 8
    assert list(train.columns) == list(contracts.TASKS)
    assert set(train["category"]) >= {"single_op", "fused"}
    assert not set(train["name"]) & set(eval_["name"])
    assert (train["n_ops"] >= 1).all()
    assert (train.loc[train["category"] == "fused", "n_ops"] >= 2).all()
    assert train["task_id"].is_unique


def test_manifest_and_programs_must_agree(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.py").write_text(PROGRAM)
    (tmp_path / "suite.yaml").write_text("train:\n  b: {category: fused, level: 2}\n")
    with pytest.raises(TaskError, match="task train/b has no program"):
        load_builtin(tmp_path)
    (tmp_path / "suite.yaml").write_text("train:\n  a: {category: blended, level: 2}\n")
    with pytest.raises(TaskError, match="train/a: category must be one of"):
        load_builtin(tmp_path)
    (tmp_path / "train" / "b.py").write_text(PROGRAM)
    (tmp_path / "suite.yaml").write_text("train:\n  a: {category: fused, level: 2}\n")
    with pytest.raises(TaskError, match="programs not in the manifest: train/b.py"):
        load_builtin(tmp_path)


def test_builtin_suite_passes_validation_and_has_no_contamination():
    splits = build_tasks([{"kind": "builtin", "path": str(ROOT / "resources" / "suite")}])
    assert len(splits["train"]) == 12 and len(splits["eval"]) == 8
    assert splits["rejected"].empty and splits["unchecked"].empty and splits["contamination"].empty


@pytest.mark.parametrize(
    "forward, category, n_ops",
    [
        ("return torch.relu(x)", "single_op", 1),
        ("return torch.relu(x) * 2 + x", "fused", 3),
        ("return self.c(self.b(self.a(x)))", "model", 3),
        ("for _ in range(3):\n            x = x * 2\n        return x", "model", 1),
        ("return " + " + ".join(["x"] * 26), "model", 25),
    ],
)
def test_category_follows_the_documented_rule(forward, category, n_ops):
    code = PROGRAM.replace("return torch.relu((x + y) * self.scale).sum(dim=-1)", forward)
    assert categorise(code) == (category, n_ops)


def test_containers_and_program_defined_submodules_make_a_model():
    code = PROGRAM.replace("self.scale = scale", "self.scale = scale\n        self.net = nn.Sequential()")
    assert categorise(code)[0] == "model"


def test_kernelbook_adapter_keeps_model_when_the_entry_point_is_model():
    code = PROGRAM.replace("def __init__(self, scale):", "def __init__(self, scale=1.0):")
    code = code.replace("return [2.0]", "return [[], {'scale': 3.0}]")
    adapted = adapt_kernelbook(code, "Model")
    assert adapted.rstrip().endswith("return [3.0]") and "Model = " not in adapted
    with pytest.raises(TaskError, match="does not end in `return \\[\\[args\\], \\{kwargs\\}\\]`"):
        adapt_kernelbook(PROGRAM, "Model")


@pytest.mark.parametrize("odd", ["\f", "\x0b", "\x1c", "\x85", "\u2028"])
def test_kernelbook_adapter_splices_at_the_parsers_lines(odd):
    """ast numbers lines at \\n, \\r\\n and \\r; str.splitlines also breaks at form feeds and other separators.
    Spliced at those, a KernelBook-style program (one of 5,407 rebuilt from paritybench has a form feed in a
    docstring) lost its get_inputs body; a splice shifted elsewhere can keep valid Python that computes something
    else."""
    code = PROGRAM.replace("def __init__(self, scale):", "def __init__(self, scale=1.0):")
    code = code.replace("class Model(nn.Module):", f'class Model(nn.Module):\n    """odd{odd}line"""  # {odd}x')
    code = code.replace("return [2.0]", "return [[], {'scale': 3.0}]")
    namespace: dict = {}
    exec(adapt_kernelbook(code, "Model"), namespace)
    assert namespace["get_init_inputs"]() == [3.0] and len(namespace["get_inputs"]()) == 2
    assert namespace["Model"].__doc__ == f"odd{odd}line"


def test_a_reference_whose_calls_change_its_state_is_rejected():
    """A forward that updates what later calls compute with (as the observers of paritybench's quantization modules
    do: 11 of 125 KernelBook-format tasks) cannot be matched, since the verifier calls the reference more often than
    a candidate; random draws (dropout, seeded alike before each call) and a forward that writes into its own inputs
    (each call gets copies) are kept."""
    from concur.tasks.reference import STATEFUL, validate_programs

    forward = "return torch.relu((x + y) * self.scale).sum(dim=-1)"
    init = "self.scale = scale"
    programs = {
        "stateful": PROGRAM.replace(init, init + "\n        self.register_buffer('peak', torch.zeros(()))").replace(
            forward, "self.peak.copy_(torch.maximum(self.peak, x.abs().max()))\n        return x / self.peak"
        ),
        "dropout": PROGRAM.replace(forward, "return torch.nn.functional.dropout(x + y, 0.5, training=True)"),
        "in_place": PROGRAM.replace(forward, "x.add_(1)\n        return x * y"),
        "plain": PROGRAM,
    }
    verdicts = validate_programs(list(programs.values()), 30, 64, 10, workers=1)
    found = {name: (v["status"], v["reason"]) for name, v in zip(programs, verdicts)}
    assert found["stateful"] == ("rejected", STATEFUL)
    assert all(found[name] == ("ok", "") for name in ("dropout", "in_place", "plain")), found


def test_references_are_sized_on_meta_and_only_small_ones_run_and_are_probed(tmp_path, caplog):
    """One stage over four programs: the checks on the meta device decide what runs on the CPU, only a real run
    rejects, and only programs run for real are probed."""
    forward = "return torch.relu((x + y) * self.scale).sum(dim=-1)"
    programs = {
        # 2000 products of 2048 x 2048 matrices: 34 TFLOP, minutes on a core (past validate_timeout_s), 32 MB
        "huge": PROGRAM.replace(forward, "for _ in range(2000):\n            x = x @ y\n        return x").replace(
            "torch.rand(4, 8), torch.rand(4, 8)", "torch.rand(2048, 2048), torch.rand(2048, 2048)"
        ),
        "small": PROGRAM,
        # meta tensors cannot run nonzero or .item(): the meta check fails and the real run decides
        "data_dependent": PROGRAM.replace(forward, "return x[torch.nonzero(x > 0.5, as_tuple=True)] * y.max().item()"),
        "broken": PROGRAM.replace(forward, "return x @ y  # (4, 8) @ (4, 8)"),
    }
    for name, code in programs.items():
        (tmp_path / f"{name}.py").write_text(code)
    caplog.set_level(logging.INFO, logger="concur.tasks")
    settings = {"validate_run": True, "validate_timeout_s": 20}
    out = build_tasks([{"kind": "folder", "path": str(tmp_path)}], settings, workers=2)

    unchecked = dict(zip(out["unchecked"]["task_id"], out["unchecked"]["reason"]))
    assert unchecked == {
        "user/huge": "checked on the meta device only: 34360 GFLOP, 32 MB (over validate_max_gflop); "
        "the verify job runs it on the GPU"
    }
    rejected = dict(zip(out["rejected"]["task_id"], out["rejected"]["reason"]))
    assert rejected == {
        "user/broken": "reference does not run: RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 4x8)"
    }
    train = out["train"].set_index("task_id")
    assert sorted(train.index) == ["user/data_dependent", "user/huge", "user/small"]
    # probed (a bool) only where the reference ran for real; unknown (<NA>) for the meta-only one
    assert str(train["degenerate"].dtype) == "boolean"
    assert train.loc["user/huge", "degenerate"] is pd.NA and train.loc["user/huge", "degenerate_outputs"] == ""
    assert train.loc[["user/small", "user/data_dependent"], "degenerate"].tolist() == [False, False]
    assert "validated 4/4 programs (2 run, 1 meta only, 0 cut short, 1 rejected)" in caplog.text
    assert "probed 2/2 tasks (0 degenerate, 2 not degenerate)" in caplog.text


SCRIPTED = """
import torch
import torch.nn as nn


@torch.jit.script
def mish(x):
    return x * torch.tanh(nn.functional.softplus(x))


class Model(nn.Module):
    def forward(self, x):
        return mish(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("head", ["", '"""\\frac, not a raw string: a form feed (\f)"""\n'])
def test_a_program_that_reads_its_own_source_runs(tmp_path, head):
    """TorchScript compiles a @torch.jit.script function from its source lines, which a program run from a string has
    no file for: 31 of 1,675 KernelBook-style programs (benchmarks/kernelbook_programs.py) were rejected for it. The
    lines are the parser's: with a form feed above the function, str.splitlines' lines put it elsewhere."""
    (tmp_path / "scripted.py").write_text(head + SCRIPTED)
    out = build_tasks([{"kind": "folder", "path": str(tmp_path)}], {"validate_run": True}, workers=1)
    assert out["rejected"].empty, out["rejected"]["reason"].tolist()
    assert out["train"]["task_id"].tolist() == ["user/scripted"]

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

"""Task sources on small fixtures in each source's format, validation reports, dedupe, contamination, plan time."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from concur import contracts
from concur.contamination import contamination_report, lsh_bands, normalise_code
from concur.tasks import (
    TaskError,
    build_tasks,
    drop_duplicate_code,
    input_files,
    load_folder,
    load_kernelbench,
    load_kernelbook,
    run,
)
from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "tasks"
KERNELBOOK = FIXTURES / "kernelbook.jsonl"
KERNELBENCH = FIXTURES / "kernelbench"
USER = FIXTURES / "user"


def instantiate(code: str):
    """The reference model built the way the verifier builds it: Model(*get_init_inputs())."""
    namespace = {"__name__": "task_under_test"}
    exec(compile(code, "<task>", "exec"), namespace)
    return namespace["Model"](*namespace["get_init_inputs"]())


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {row["task_id"]: row for row in rows}


def test_kernelbook_entry_points_become_model_with_keyword_init_arguments_honoured():
    rows, rejected = load_kernelbook({"kind": "kernelbook", "path": str(KERNELBOOK)})
    tasks = by_id(rows)
    assert set(tasks) == {f"kernelbook/{i}" for i in (101, 102, 103, 105, 106, 107)}
    assert all(t["split"] == "train" and t["suite"] == "kernelbook" for t in rows)
    # keywords moved to their positional slots: temperature=0.5 arrives
    softmax = instantiate(tasks["kernelbook/101"]["code"])
    assert type(softmax).__name__ == "ScaledSoftmax" and softmax.dim == 1 and softmax.temperature == 0.5
    # a skipped parameter with a literal default is filled in: hidden=16 between channels and act
    assert "return [4, 16, 'relu']" in tasks["kernelbook/106"]["code"]
    assert instantiate(tasks["kernelbook/106"]["code"]).act == "relu"
    # keyword-only and non-literal-default cases are bound by an adapter subclass instead
    assert instantiate(tasks["kernelbook/102"]["code"]).proj.bias is None
    normalise = instantiate(tasks["kernelbook/107"]["code"])
    assert normalise.scale == 2.0 and normalise.n == 4
    assert instantiate(tasks["kernelbook/103"]["code"]) is not None
    assert rejected == [
        {
            "task_id": "kernelbook/104",
            "source": "kernelbook",
            "origin": rejected[0]["origin"],
            "reason": "entry point class 'Missing' is not defined",
        }
    ]
    assert tasks["kernelbook/106"]["category"] == "model" and tasks["kernelbook/103"]["category"] == "single_op"


def test_kernelbook_parquet_export_loads_like_the_jsonl(tmp_path):
    parquet = tmp_path / "export" / "part-0.parquet"
    parquet.parent.mkdir()
    pd.read_json(KERNELBOOK, lines=True).to_parquet(parquet)
    from_jsonl, _ = load_kernelbook({"kind": "kernelbook", "path": str(KERNELBOOK)})
    from_folder, _ = load_kernelbook({"kind": "kernelbook", "path": str(parquet.parent), "split": "eval"})
    assert [r["code"] for r in from_jsonl] == [r["code"] for r in from_folder]
    assert {r["split"] for r in from_folder} == {"eval"}


def test_kernelbook_export_without_its_columns_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"code": "x = 1"}\n')
    with pytest.raises(
        TaskError, match=r"bad.jsonl: not a KernelBook export: missing column\(s\) python_code, entry_point"
    ):
        load_kernelbook({"kind": "kernelbook", "path": str(bad)})
    with pytest.raises(TaskError, match=r"nowhere/at/all: no such file or folder"):
        load_kernelbook({"kind": "kernelbook", "path": "nowhere/at/all"})


def test_kernelbench_folder_and_dataset_export_give_the_same_tasks():
    folder, _ = load_kernelbench({"kind": "kernelbench", "path": str(KERNELBENCH), "levels": [1, 2]})
    export, _ = load_kernelbench(
        {"kind": "kernelbench", "path": str(FIXTURES / "kernelbench_export.jsonl"), "levels": [1, 2]}
    )
    expected = ["kernelbench/L1/2_Huge_Matmul", "kernelbench/L1/19_ReLU", "kernelbench/L2/7_Linear_GELU_Scale"]
    assert [r["task_id"] for r in folder] == expected
    assert sorted(r["task_id"] for r in export) == sorted(expected)
    assert by_id(folder)["kernelbench/L1/19_ReLU"]["code"] == by_id(export)["kernelbench/L1/19_ReLU"]["code"]
    relu = by_id(folder)["kernelbench/L1/19_ReLU"]
    assert (relu["split"], relu["level"], relu["name"], relu["category"]) == ("eval", 1, "ReLU", "single_op")
    assert by_id(folder)["kernelbench/L2/7_Linear_GELU_Scale"]["category"] == "fused"
    every_level, _ = load_kernelbench({"kind": "kernelbench", "path": str(KERNELBENCH / "KernelBench")})
    assert by_id(every_level)["kernelbench/L3/1_Stack"]["category"] == "model"


def test_kernelbench_missing_level_names_the_folder():
    with pytest.raises(TaskError, match="KernelBench level 4 has no folder level4/"):
        load_kernelbench({"kind": "kernelbench", "path": str(KERNELBENCH), "levels": [4]})


def test_user_folder_rejects_unparsable_and_incomplete_programs():
    rows, rejected = load_folder({"kind": "folder", "path": str(USER)})
    assert {r["task_id"] for r in rows} == {
        "user/good_scale",
        "user/fails_at_run",
        "user/relu_copy",
        "user/gelu_scale_near",
        "user/sleeps",
        "user/exits",
    }
    reasons = {r["task_id"]: r["reason"] for r in rejected}
    assert reasons["user/nested/broken_syntax"].startswith("program: not valid Python (line 5")
    assert reasons["user/no_inputs"] == "program: missing get_inputs"


def test_normalised_code_ignores_comments_docstrings_and_layout():
    a = 'def f(x):\n    """Doc."""\n    # note\n    return (x +\n            1)\n'
    b = "def f(x):\n    return x + 1  # other note\n"
    assert normalise_code(a) == normalise_code(b)
    assert normalise_code(a) != normalise_code(b.replace("+ 1", "+ 2"))


def test_duplicates_keep_the_first_id_of_each_split():
    code = "import torch\nclass Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
    tasks = pd.DataFrame(
        [
            {"task_id": "s/a", "split": "train", "suite": "s", "origin": "a", "code": code},
            {"task_id": "s/b", "split": "train", "suite": "s", "origin": "b", "code": code + "# trailing comment\n"},
            {"task_id": "s/c", "split": "eval", "suite": "s", "origin": "c", "code": code},
        ]
    )
    kept, duplicates = drop_duplicate_code(tasks)
    assert kept["task_id"].tolist() == ["s/a", "s/c"]
    assert duplicates == [
        {"task_id": "s/b", "source": "s", "origin": "b", "reason": "duplicate of s/a (same normalised code)"}
    ]


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """One tasks stage over every fixture source, references run (the only test that pays for the checker)."""
    out = tmp_path_factory.mktemp("tasks")
    paths = {
        name: str(out / f"{name}.{'parquet' if name in ('train', 'eval') else 'csv'}")
        for name in ("train", "eval", "rejected", "unchecked", "contamination")
    }
    sources = [
        {"kind": "builtin", "path": str(ROOT / "resources" / "suite")},
        {"kind": "kernelbook", "path": str(KERNELBOOK), "split": "train"},
        {"kind": "folder", "path": str(USER), "split": "train"},
        {"kind": "kernelbench", "path": str(KERNELBENCH), "split": "eval", "levels": [1, 2]},
    ]
    run(sources, paths, {"validate_run": True, "validate_timeout_s": 4, "max_input_mb": 256}, workers=2)
    return {
        name: (pd.read_parquet(p) if p.endswith(".parquet") else pd.read_csv(p, keep_default_na=False))
        for name, p in paths.items()
    }


def test_stage_writes_the_contract_and_reports_every_rejection(stage):
    train, eval_ = stage["train"], stage["eval"]
    flags = ["degenerate", "degenerate_outputs"]  # the probe's columns, after the contract's
    assert list(train.columns) == list(contracts.TASKS) + flags and list(eval_.columns) == list(contracts.TASKS) + flags
    reasons = dict(zip(stage["rejected"]["task_id"], stage["rejected"]["reason"]))
    assert list(stage["rejected"].columns) == ["task_id", "source", "origin", "reason"]
    assert reasons["kernelbook/105"] == "duplicate of kernelbook/101 (same normalised code)"
    assert reasons["kernelbook/104"] == "entry point class 'Missing' is not defined"
    assert reasons["user/nested/broken_syntax"].startswith("program: not valid Python")
    assert reasons["user/fails_at_run"].startswith("reference does not run: RuntimeError")
    assert (
        reasons["user/exits"] == "reference does not run: the reference process ended without a verdict (exit code 3)"
    )
    assert set(reasons) == {
        "kernelbook/104",
        "kernelbook/105",
        "user/nested/broken_syntax",
        "user/no_inputs",
        "user/fails_at_run",
        "user/exits",
    }
    # the 2 x 64 GiB matmul is sized on the meta device, kept for evaluation, and listed as not run
    assert "kernelbench/L1/2_Huge_Matmul" in set(eval_["task_id"])
    unchecked = dict(zip(stage["unchecked"]["task_id"], stage["unchecked"]["reason"]))
    assert unchecked["kernelbench/L1/2_Huge_Matmul"] == (
        "checked on the meta device only: 4503600 GFLOP, 131072 MB (over max_input_mb and validate_max_gflop); "
        "the verify job runs it on the GPU"
    )
    # a reference slower than validate_timeout_s is killed, kept and listed
    assert unchecked["user/sleeps"] == "not run to the end: ran longer than 4 s on the CPU"
    assert {"builtin/relu", "kernelbook/102", "kernelbook/107", "user/good_scale"} <= set(train["task_id"])


def test_stage_reports_and_drops_contaminated_train_tasks(stage):
    report = stage["contamination"]
    assert list(report.columns) == ["train_task_id", "eval_task_id", "similarity", "kind"]
    pairs = {(r.train_task_id, r.eval_task_id): (r.kind, r.similarity) for r in report.itertuples()}
    assert pairs[("user/relu_copy", "kernelbench/L1/19_ReLU")] == ("exact", 1.0)
    kind, similarity = pairs[("user/gelu_scale_near", "kernelbench/L2/7_Linear_GELU_Scale")]
    assert kind == "near" and 0.8 <= similarity < 1
    assert not {"user/relu_copy", "user/gelu_scale_near"} & set(stage["train"]["task_id"])


def test_contaminated_train_tasks_stay_when_not_dropped():
    sources = [
        {"kind": "folder", "path": str(USER), "split": "train"},
        {"kind": "kernelbench", "path": str(KERNELBENCH), "split": "eval", "levels": [1, 2]},
    ]
    kept = build_tasks(sources, {"validate_run": False, "drop_contaminated": False})
    assert {"user/relu_copy", "user/gelu_scale_near"} <= set(kept["train"]["task_id"])
    assert len(kept["contamination"]) == 2
    assert set(kept["unchecked"]["reason"]) == {"not run: validate_run is false"}
    strict = build_tasks(sources, {"validate_run": False, "drop_contaminated": False, "similarity_threshold": 0.99})
    assert strict["contamination"]["kind"].tolist() == ["exact"]


def test_contamination_finds_planted_near_copies_among_many_tasks():
    def program(i: int) -> str:
        ops = " + ".join(f"torch.{op}(x * {i + k})" for k, op in enumerate(["sin", "cos", "exp", "tanh"][: 1 + i % 4]))
        return f"class Model:\n    def forward(self, x):\n        return {ops} - {i}\n"

    eval_ = pd.DataFrame({"task_id": [f"e/{i}" for i in range(50)], "code": [program(i) for i in range(50)]})
    train_codes = [program(1000 + i) for i in range(3000)]
    planted = program(7).replace("- 7", "- 7 + 0")
    train = pd.DataFrame({"task_id": [f"t/{i}" for i in range(3001)], "code": train_codes + [planted]})
    report = contamination_report(train, eval_, threshold=0.7, ngram=4)
    assert report[["train_task_id", "eval_task_id", "kind"]].values.tolist() == [["t/3000", "e/7", "near"]]


def test_lsh_bands_find_pairs_at_the_threshold():
    for threshold in (0.5, 0.7, 0.8, 0.95):
        bands, rows = lsh_bands(threshold)
        assert bands * rows <= 128 and 1 - (1 - threshold**rows) ** bands >= 0.995


def test_plan_time_benchmark_runs_at_small_scale():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plan_time.py"),
            "--tasks",
            "300",
            "--eval-per-level",
            "5",
            "--repeats",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "configs/paper.yaml (synthetic KernelBook + KernelBench)" in proc.stdout


def test_hub_ids_go_through_datasets_load_dataset(monkeypatch):
    export = pd.read_json(FIXTURES / "kernelbench_export.jsonl", lines=True)
    calls = []

    class Split:
        def __init__(self, frame):
            self.frame = frame

        def to_pandas(self):
            return self.frame

    def load_dataset(hub_id, revision=None):
        calls.append((hub_id, revision))
        return {f"level_{n}": Split(export[export["level"] == n]) for n in (1, 2, 3)}

    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    monkeypatch.setattr(sys.modules["datasets"], "load_dataset", load_dataset, raising=False)
    rows, _ = load_kernelbench(
        {"kind": "kernelbench", "path": "SomeOrg/KernelBench", "revision": "abc123", "levels": [2]}
    )
    assert calls == [("SomeOrg/KernelBench", "abc123")]
    assert [r["task_id"] for r in rows] == ["kernelbench/L2/7_Linear_GELU_Scale"]


def test_hub_ids_without_datasets_installed_say_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(
        TaskError,
        match=r"GPUMODE/KernelBook: no such local path; loading it from the Hugging Face hub "
        r"needs the `datasets` package",
    ):
        load_kernelbook({"kind": "kernelbook", "path": "GPUMODE/KernelBook"})


def test_degenerate_tasks_are_flagged():

    from concur.tasks import flag_degenerate

    fixtures = Path(__file__).parent / "fixtures" / "verify"
    frame = pd.DataFrame(
        {
            "task_id": ["relu_rand", "relu_add"],
            "code": [(fixtures / f"task_{n}.py").read_text() for n in ("relu_rand", "relu_add")],
        }
    )
    (flagged,) = flag_degenerate([frame], set(), {"validate_timeout_s": 60}, workers=2)
    # relu of inputs drawn from [0, 1) is the identity: returning the input passes its check
    assert flagged["degenerate"].tolist() == [True, False]
    assert flagged["degenerate_outputs"].tolist() == ["identity", ""]


def test_input_files_are_what_each_source_reads(tmp_path):
    """The tasks rule's inputs (concur.tasks.input_files): the local files each source reads, nothing for a hub id
    or a missing path, so that editing a program reruns the stage and planning never reads a large source."""
    suite = ROOT / "resources" / "suite"
    builtin = input_files([{"kind": "builtin", "path": str(suite)}])
    assert builtin[0] == (suite / "suite.yaml").as_posix()
    assert sorted(builtin[1:]) == sorted(p.as_posix() for p in suite.glob("*/*.py"))
    assert input_files([{"kind": "folder", "path": str(USER)}]) == sorted(
        p.as_posix() for p in USER.rglob("*.py") if not p.name.startswith(".")
    )
    levels = input_files([{"kind": "kernelbench", "path": str(KERNELBENCH), "levels": [1, 2, 9]}])
    assert [p.split("KernelBench/")[1] for p in levels] == [
        "level1/2_Huge_Matmul.py",
        "level1/19_ReLU.py",
        "level2/7_Linear_GELU_Scale.py",
    ]
    export = FIXTURES / "kernelbench_export.jsonl"
    assert input_files([{"kind": "kernelbench", "path": str(export)}]) == [export.as_posix()]
    (tmp_path / "part-1.parquet").touch()
    (tmp_path / "notes.txt").touch()
    assert input_files([{"kind": "kernelbook", "path": str(tmp_path)}]) == [(tmp_path / "part-1.parquet").as_posix()]
    assert input_files([{"kind": "kernelbook", "path": "GPUMODE/KernelBook"}]) == []
    assert input_files([{"kind": "folder", "path": str(tmp_path / "missing")}]) == []

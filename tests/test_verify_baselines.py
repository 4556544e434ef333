"""Baselines besides eager (verify.baselines: the reference under torch.compile) and task precision (fp16/bf16
inputs and weights, KernelBench's tolerance for them): the arithmetic on the CPU, one CPU verify run through
verify_frame, and a `gpu` test that would compare kernelbench mode with KernelBench's own eval_kernel_against_ref."""

import math
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from verify_frames import candidates_frame, tasks_frame

from concur import contracts
from concur.curate import curate
from concur.verify import comparisons, verify_frame
from concur.verify.api import task_precisions
from concur.verify.report import Baseline, Report, Times
from concur.verify.verdict import baseline_speedups, blank, decide, precision_flag
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "verify"
REFERENCE = (FIXTURES / "task_relu_add.py").read_text()
TORCH_ONLY = (FIXTURES / "solution_torch_only.py").read_text()


def test_speedup_columns_name_their_baseline():
    assert contracts.speedup_column("eager") == "speedup"
    assert contracts.speedup_column("compile-max-autotune") == "speedup_compile_max_autotune"
    assert all(contracts.speedup_column(b) in contracts.VERDICTS for b in contracts.BASELINES)
    with pytest.raises(ValueError, match="unknown baseline"):
        contracts.speedup_column("jit")
    old = contracts.conform(pd.DataFrame({c: [] for c in contracts.VERDICTS if not c.startswith("speedup_")}),
                            contracts.VERDICTS)  # fmt: skip
    assert "speedup_compile" in old.columns  # verdicts made before baselines read as NaN columns


def test_tolerance_follows_the_tasks_precision_as_kernelbench():
    assert comparisons.tolerance("torch.float32", {}) == (1e-4, 1e-4)
    assert comparisons.tolerance("torch.float16", {}) == (1e-2, 1e-2)
    assert comparisons.tolerance("torch.float32", {"precision": "fp32"}) == (1e-4, 1e-4)
    assert comparisons.tolerance("torch.float16", {"precision": "fp16"}) == (1e-2, 1e-2)
    assert comparisons.tolerance("torch.float32", {"precision": "bf16"}) == (1e-2, 1e-2)  # by precision, not dtype
    assert comparisons.tolerance("torch.int64", {"precision": "bf16"}) == (0.0, 0.0)  # integers stay exact
    assert comparisons.tolerance("torch.bfloat16", {"precision": "bf16", "atol": 0.5, "rtol": None}) == (0.5, 1e-2)


def test_reduced_precision_is_judged_against_the_tasks_own():
    reduced = Report.from_data({"precision": {"e_ref": 1e-3, "e_new": 1.0}})
    half_source = "__half x; float16"
    assert precision_flag(reduced, half_source) == "precision:fp16"
    assert precision_flag(reduced, half_source, "fp16") == "precision:reduced"  # below the task's own
    close = Report.from_data({"precision": {"e_ref": 1e-3, "e_new": 2e-3}})  # an fp16 task's reference errs as much
    assert precision_flag(close, half_source, "fp16") is None


def test_a_verdict_carries_a_speedup_per_baseline():
    settings = {"mode": "kernelbench", "baselines": ["eager", "compile", "compile-max-autotune"], "audit_speedup": 10.0,
                "device": "cpu"}  # fmt: skip
    summary = lambda ms: {"mean_ms": ms, "median_ms": ms, "best_ms": ms, "resolved": True}  # noqa: E731
    found = Report.from_data(
        {
            "trials": [{"number": 1, "kind": "random", "comparison": {"ok_shape": True, "ok_dtype": True,
                        "ok_finite": True, "allclose": True, "max_abs_err": 0.0}}],
            "load": {"ok": True, "has_class": True},
            "timing": {"ref": summary(4.0), "new": summary(2.0)},
            "baselines": {
                "compile": {"ref": summary(3.0), "compile_s": 12.0},
                "compile-max-autotune": {"ref": None, "error": "compiled outputs differ"},
            },
        }
    )  # fmt: skip
    verdict = decide(found, settings, "", 0.0, "cpu")
    assert verdict["status"] == "correct", verdict["reason"]
    assert verdict["speedup"] == 2.0 and verdict["speedup_compile"] == 1.5
    assert math.isnan(verdict["speedup_compile_max_autotune"])
    assert baseline_speedups(found.baselines, Times(**summary(2.0)), "best_ms")["compile"] == 1.5
    unresolved = Baseline(Times(**{**summary(3.0), "resolved": False}))
    assert math.isnan(baseline_speedups({"compile": unresolved}, Times(**summary(2.0)), "best_ms")["compile"])
    failed = blank("incorrect", "", settings, "cpu")
    assert failed["speedup_compile"] == 0.0 and failed["speedup_compile_max_autotune"] == 0.0
    assert "speedup_compile_reduce_overhead" not in failed  # not timed: NaN in the table


def test_tasks_carry_their_precision():
    tasks = tasks_frame([("a", REFERENCE)])
    assert tasks["precision"].tolist() == ["fp32"]  # a table made without it
    assert task_precisions(tasks.assign(precision=["bf16"])) == {"a": "bf16"}


def test_verify_frame_times_the_compiled_reference_and_casts_to_the_tasks_precision(tmp_path):
    """kernelbench mode on the CPU: a pure-PyTorch ModelNew is correct; its speedup over the reference compiled
    by inductor is measured beside eager's; a bf16 task runs both models in bfloat16 with KernelBench's 1e-2."""
    settings = {"device": "cpu", "mode": "kernelbench", "workers": 1, "correctness_trials": 2, "warmup": 1,
                "timing_trials": 5, "baselines": ["eager", "compile"],
                "build_cache": str(tmp_path / "cache")}  # fmt: skip
    tasks = tasks_frame([("relu_add", REFERENCE), ("relu_add_bf16", REFERENCE)])
    tasks["precision"] = ["fp32", "bf16"]
    candidates = candidates_frame([("c", "relu_add", TORCH_ONLY), ("c16", "relu_add_bf16", TORCH_ONLY)])
    verdicts = verify_frame(candidates, tasks, settings, tmp_path / "work", progress=False).set_index("candidate_id")
    for cid in ("c", "c16"):
        row = verdicts.loc[cid]
        assert row.status == "correct", row.reason
        assert row.speedup > 0 and row.speedup_compile > 0, (row.speedup, row.speedup_compile)
        assert math.isnan(row.speedup_compile_max_autotune)  # not asked for
    assert verdicts.loc["c16"].max_abs_err <= 1e-2


# candidates for the comparison with KernelBench, each with a verdict that depends on the task's precision
AGREEMENT_CANDIDATES = {
    "correct": TORCH_ONLY,
    "wrong": TORCH_ONLY.replace("* self.scale", "* self.scale * 1.1"),
    # float32 out: correct in fp32; in fp16/bf16 its dtype differs from the reference's
    "float_out": TORCH_ONLY.replace("return torch.clamp(x + y, min=0.0) * self.scale",
                                    "return (torch.clamp(x + y, min=0.0) * self.scale).float()"),
    # rounded through float16: past fp32's 1e-4, within fp16's and bf16's 1e-2
    "via_half": TORCH_ONLY.replace("return torch.clamp(x + y, min=0.0) * self.scale",
                                   "return (torch.clamp(x + y, min=0.0) * self.scale).half().to(x.dtype)"),
}  # fmt: skip


@pytest.fixture
def kb_eval(monkeypatch):
    """On a GPU: KernelBench's eval module from the checkout KERNELBENCH_DIR names (its src/kernelbench/ package),
    imported as benchmarks/kernelbench_harness.py imports it, with stand-ins for the clients it never uses here
    (openai, litellm, dotenv, tqdm, requests where missing; pydantic must be installed)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    checkout = os.environ.get("KERNELBENCH_DIR")
    if not checkout:
        pytest.skip("set KERNELBENCH_DIR to a KernelBench checkout (src/kernelbench/, KernelBench/) to compare")
    checkout = Path(checkout).resolve()
    if not (checkout / "src" / "kernelbench" / "eval.py").is_file():
        pytest.skip(f"KERNELBENCH_DIR={checkout}: no src/kernelbench/eval.py (KernelBench at 423217d or later)")
    harness = load_benchmark("kernelbench_harness")
    monkeypatch.setattr(sys, "path", list(sys.path))  # import_kernelbench puts <checkout>/src first
    for name in ("TORCH_EXTENSIONS_DIR", "TORCH_USE_CUDA_DSA"):  # eval_kernel_against_ref sets them in this process
        monkeypatch.delenv(name, raising=False)
    before = set(sys.modules)
    try:
        stubbed = harness.import_kernelbench(checkout)
    except Exception as err:  # a dependency missing here (pydantic, ...): say which
        pytest.skip(f"KernelBench from {checkout / 'src'} does not import: {type(err).__name__}: {err}")
    yield sys.modules["kernelbench.eval"]
    for name in set(sys.modules) - before:  # KernelBench and its stand-ins leave with the test
        if name.split(".")[0] == "kernelbench" or name in stubbed:
            del sys.modules[name]


@pytest.mark.gpu
def test_kernelbench_mode_agrees_with_kernelbenchs_own_eval_per_precision(tmp_path, kb_eval):
    """On a GPU with KernelBench (KERNELBENCH_DIR): kernelbench mode's correct/not on the same candidates as
    KernelBench's eval_kernel_against_ref(precision=...) for fp32, fp16 and bf16 (its times are its own). The
    candidates' verdicts change with the precision (a float32 output, a result rounded through float16, a CUDA
    kernel written for float32 only), so each precision has correct and failing candidates on both sides."""
    import torch
    from verify_cuda_solutions import solution

    candidates = {**AGREEMENT_CANDIDATES, "cuda_fp32_only": solution("fast")}
    tasks = tasks_frame([(f"relu_add_{p}", REFERENCE) for p in contracts.PRECISIONS])
    tasks["precision"] = list(contracts.PRECISIONS)
    frame = candidates_frame([(f"{name}@{p}", f"relu_add_{p}", code) for p in contracts.PRECISIONS
                              for name, code in candidates.items()])  # fmt: skip
    settings = {"device": "cuda", "mode": "kernelbench", "build_cache": str(tmp_path / "cache")}
    ours = verify_frame(frame, tasks, settings, tmp_path / "work", progress=False).set_index("candidate_id")
    rows = []
    for precision in contracts.PRECISIONS:
        for name, code in candidates.items():
            theirs = kb_eval.eval_kernel_against_ref(
                REFERENCE, code, num_correct_trials=5, measure_performance=False, verbose=False,
                build_dir=str(tmp_path / "kb-build" / name), device=torch.device("cuda:0"), backend="cuda",
                precision=kb_eval.get_torch_dtype_from_string(precision),
            )  # fmt: skip
            meta = {} if theirs is None else theirs.metadata
            why = next((str(meta[k]) for k in ("correctness_issue", "runtime_error", "compilation_error") if k in meta),
                       "" if theirs is not None else "returned None (lock file)")  # fmt: skip
            mine = ours.loc[f"{name}@{precision}"]
            rows.append({"precision": precision, "candidate": name, "ours": mine.status, "ours_reason": mine.reason,
                         "ours_correct": bool(mine.correct), "kb_reason": why[:200],
                         "kb_correct": theirs is not None and bool(theirs.correctness)})  # fmt: skip
    table = pd.DataFrame(rows)
    if os.environ.get("CONCUR_GPU_REPORT"):
        table.to_csv(Path(os.environ["CONCUR_GPU_REPORT"]) / "kernelbench_agreement.csv", index=False)
    shown = table.to_string(index=False, max_colwidth=80)
    assert (table["ours_correct"] == table["kb_correct"]).all(), f"kernelbench mode and KernelBench differ:\n{shown}"
    for precision, part in table.groupby("precision"):  # agreement on both outcomes, not on one
        assert part["kb_correct"].any() and not part["kb_correct"].all(), f"{precision}: one outcome only\n{shown}"


def test_eval_scores_fast_p_over_each_baseline_and_the_table_shows_them():
    from concur.evaluate import results_table, score, table_markdown

    tasks = pd.DataFrame({"task_id": ["x", "y"], "level": [1, 3], "category": ["single_op", "model"]})
    frame = pd.DataFrame(
        {"task_id": ["x", "x", "y"], "correct": [True, True, False], "speedup": [2.0, 1.2, 0.0],
         "speedup_compile": [1.5, 0.9, 0.0], "speedup_compile_max_autotune": math.nan}
    )  # fmt: skip
    settings = {"pass_k": [1], "fast_p": [0, 1]}
    scores = score({"base": frame}, tasks, settings)
    overall = scores[(scores["scope"] == "overall")].iloc[0]
    assert overall["fast_1"] == pytest.approx(2 / 3) and overall["fast_1_compile"] == pytest.approx(1 / 3)
    assert "fast_1_compile_max_autotune" not in scores.columns  # never timed
    assert overall["fast_1_compile@1"] == pytest.approx(0.25)  # x: 1 of 2, y: 0
    assert "L3_fast_1_compile@1" in results_table(scores, [1]).columns  # level 3 is one more level
    assert "fast_1_compile@1" in table_markdown(scores, settings)
    eager_only = score({"base": frame.drop(columns=["speedup_compile", "speedup_compile_max_autotune"])}, tasks,
                       settings)  # fmt: skip
    assert not any("compile" in c for c in eager_only.columns)


def test_curation_ranks_by_the_baseline_it_names():
    from test_curate import make_tables, settings

    cands, verdicts, tasks = make_tables()
    over_compile = verdicts.assign(speedup_compile=verdicts["speedup"] / 10)
    eager = curate(cands, over_compile, tasks, settings())
    compiled = curate(cands, over_compile, tasks, settings(baseline="compile"))
    assert (eager.dataset["criterion"] == "high_speedup").any()
    assert not (compiled.dataset["criterion"] == "high_speedup").any()  # none is 5x faster than compiled
    assert "`baseline`: compile" in compiled.card
    with pytest.raises(ValueError, match="verify.baselines"):
        curate(cands, verdicts, tasks, settings(baseline="compile-max-autotune"))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["hardened", "kernelbench"])
def test_compiled_baselines_are_timed_on_the_gpu(mode, tmp_path):
    """An H100/H200: the honest CUDA relu_add against eager and the reference compiled in two inductor modes, each
    timed once per task; the speedups over eager and over each baseline are consistent with the times."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from verify_cuda_solutions import solution

    reference = (Path(__file__).parent / "fixtures" / "verify_cuda" / "task_relu_add.py").read_text()
    settings = {"device": "cuda", "mode": mode, "build_cache": str(tmp_path / "cache"),
                "baselines": ["eager", "compile", "compile-max-autotune"]}  # fmt: skip
    tasks = tasks_frame([("relu_add", reference)])
    frame = candidates_frame([("fast", "relu_add", solution("fast")), ("wrong", "relu_add", solution("wrong"))])
    verdicts = verify_frame(frame, tasks, settings, tmp_path / "work", progress=False).set_index("candidate_id")
    fast = verdicts.loc["fast"]
    assert fast.status == "correct", fast.reason
    for column in ("speedup", "speedup_compile", "speedup_compile_max_autotune"):
        assert fast[column] > 0, (column, fast[column])
    assert math.isnan(fast.speedup_compile_reduce_overhead)
    assert verdicts.loc["wrong"].speedup_compile == 0.0


def test_cuda_graph_baselines_give_every_call_outputs_of_its_own():
    """Under CUDA graphs a replay writes the last one's outputs again: a batch, which keeps every call's outputs
    until its hand-off, gets them cloned, each call a new graph step."""
    torch = pytest.importorskip("torch")
    from concur.verify import contestant

    shared = torch.zeros(4)

    def replay(x):  # what a graph replay does: the same output memory, written again
        return shared.copy_(x), 7

    calls = contestant.GraphCalls(replay)
    first, _ = calls(torch.ones(4))
    second, value = calls(torch.full((4,), 2.0))
    assert first.tolist() == [1.0] * 4 and second.tolist() == [2.0] * 4 and value == 7
    model = torch.nn.Linear(2, 2)
    assert not isinstance(contestant.compiled(model, "max-autotune"), contestant.GraphCalls)  # on the CPU: as it is


def test_the_degenerate_probe_takes_the_tasks_precision(tmp_path):
    """A task whose outputs are all under fp16's tolerance passes its check with zeros in fp16, not in fp32: the
    probe runs each task in its own precision, and caches the two apart."""
    from concur.verify import api

    tiny = (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return x * 1e-3\n\ndef get_inputs():\n    return [torch.rand(64, 64)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    settings = {"device": "cpu", "workers": 1, "build_cache": str(tmp_path / "cache")}
    references = {"half": tiny, "single": tiny}
    found = api.probe_tasks(references, settings, tmp_path / "work", precisions={"half": "fp16"})
    assert "zeros" in found["half"] and found["single"] == [], found
    settings = api.normalize_settings(settings)
    assert api.probe_key(tiny, settings, "fp16") != api.probe_key(tiny, settings)

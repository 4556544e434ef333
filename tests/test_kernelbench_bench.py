"""The KernelBench comparison inputs on the CPU: the candidate collector on a small git repository in the layouts it
reads, and the KernelBench harness's plan, candidate matching, outcome mapping, process accounting and the stand-ins
for KernelBench's unused imports (with a stand-in `kernelbench` package; KernelBench itself is not needed)."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT, load_benchmark

cands_mod = load_benchmark("kernelbench_candidates")
harness = load_benchmark("kernelbench_harness")

CUDA_PROGRAM = textwrap.dedent('''
    import torch
    from torch.utils.cpp_extension import load_inline
    src = """
    __global__ void k(float* x) {{ x[0] = {value}; }}
    torch::Tensor f(torch::Tensor x) {{ return x; }}
    """
    mod = load_inline(name="m{value}", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources=src,
                      functions=["f"])
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return mod.f(x)
''')
TRITON_PROGRAM = "import triton\nfrom torch.utils.cpp_extension import load_inline\nclass ModelNew: pass\n__global__\n"


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    for level, name in ((1, "19_ReLU.py"), (2, "7_Conv3d_ReLU.py")):
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        (folder / name).write_text(f"# reference {level}/{name}\n")
    return root


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_collector_reads_run_dumps_dedupes_and_records_outcomes(tmp_path, monkeypatch):
    work = tmp_path / "src"
    run = work / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "level_1_problem_19_sample_0_kernel.py").write_text(CUDA_PROGRAM.format(value=1))
    (run / "level_1_problem_19_sample_1_kernel.py").write_text(CUDA_PROGRAM.format(value=1) + "\n\n")  # same
    (run / "level_2_problem_7_sample_0_kernel.py").write_text(CUDA_PROGRAM.format(value=2))
    (run / "level_1_problem_20_sample_0_kernel.py").write_text(CUDA_PROGRAM.format(value=3))  # not in checkout
    (run / "level_2_problem_8_sample_0_kernel.py").write_text(TRITON_PROGRAM)
    (run / "eval_results.json").write_text(json.dumps({
        "19": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 2.5, "metadata": {}}],
        "7": {"sample_id": 0, "compiled": False, "correctness": False,
              "metadata": {"compilation_error": "Error building extension 'm2'"}}}))  # fmt: skip
    (work / "KernelBench" / "level1").mkdir(parents=True)
    (work / "KernelBench" / "level1" / "19_ReLU.py").write_text("# reference 1/19_ReLU.py\n")
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    commit = git(work, "rev-parse", "HEAD").strip()
    mirrors = tmp_path / "mirrors"
    (mirrors / "someone+dump").mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirrors / "someone+dump" / "repo")], check=True)
    source = {"tag": "t", "repo": "someone/dump", "commit": commit, "kind": "kb_runs", "what": "test",
              "problems": "KernelBench/level{level}/{problem_name}",
              "runs": [{"dir": "runs/r1", "levels": [1, 2], "model": "m"}]}  # fmt: skip
    monkeypatch.setattr(cands_mod, "SOURCES", [source])
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["x", str(out), "--kernelbench", str(checkout(tmp_path)), "--mirrors",
                                      str(mirrors), "--problems", "0"])  # fmt: skip
    cands_mod.main()
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(r["level"], r["problem_id"], r["problem_name"]) for r in rows] == [
        (1, 19, "19_ReLU.py"),
        (2, 7, "7_Conv3d_ReLU.py"),
    ]
    first, second = rows
    assert first["recorded"]["status"] == "correct" and first["recorded"]["runtime"] == 2.5
    assert len(first["duplicates"]) == 1 and first["ref_matches_checkout"] is True
    assert second["recorded"]["status"] == "compile_error" and second["ref_matches_checkout"] is None
    assert (out / f"{first['id']}.py").read_text() == CUDA_PROGRAM.format(value=1)
    assert first["repo"] == "someone/dump" and first["commit"] == commit and first["path"].startswith("runs/r1/")


def test_outcome_mapping_and_eligibility():
    kb = cands_mod.outcome_from_kb_result
    assert kb(None)["status"] == "unknown"
    assert kb({"compiled": True, "correctness": False, "metadata": {"runtime_error": "CUDA error: x"}})["status"] \
        == "runtime_error"  # fmt: skip
    assert kb({"compiled": True, "correctness": False, "metadata": {"correctness_issue": "Output mismatch"}}
              )["status"] == "incorrect"  # fmt: skip
    assert kb({"compiled": False, "metadata": {"error": "Evaluation timed out"}})["status"] == "timeout"
    assert cands_mod.eligible(CUDA_PROGRAM.format(value=1)) is None
    assert cands_mod.eligible(TRITON_PROGRAM) == "other DSL"
    assert cands_mod.eligible("class ModelNew: pass") == "no load_inline"


def test_balanced_subset_covers_problems_and_mixes_outcomes():
    statuses = ["correct", "incorrect", "compile_error", "runtime_error"]
    pool = [{"id": f"c{level}-{p}-{i}", "level": level, "problem_id": p, "source": "ab"[i % 2],
             "recorded": {"status": statuses[(p + i) % 4]}}
            for level in (1, 2) for p in range(10) for i in range(4)]  # fmt: skip
    chosen = cands_mod.select(pool, 6, 2)
    assert len(chosen) == 12
    assert sum(c["level"] == 1 for c in chosen) == 6
    by_problem = {}
    for c in chosen:
        by_problem.setdefault((c["level"], c["problem_id"]), set()).add(c["recorded"]["status"])
    assert len(by_problem) == 6 and all(len(s) == 2 for s in by_problem.values())
    assert chosen == cands_mod.select(pool, 6, 2)  # deterministic


def write_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "cands"
    folder.mkdir(parents=True)
    rows = [
        {"id": "a", "level": 1, "problem_id": 19, "problem_name": "19_ReLU.py", "recorded": {"status": "correct"}},
        {"id": "b", "level": 2, "problem_id": 7, "problem_name": "renamed.py"},  # found by its number
        {"id": "c", "level": 2, "problem_id": 99, "problem_name": "99_x.py"},  # no such problem
        {"id": "d", "level": 1, "problem_id": 19, "problem_name": "19_ReLU.py"},
    ]  # no program file
    (folder / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for cid in "abc":
        (folder / f"{cid}.py").write_text(CUDA_PROGRAM.format(value=1))
    return folder


def test_harness_matches_candidates_to_references(tmp_path):
    kb = checkout(tmp_path)
    cands, problems = harness.load_candidates(write_folder(tmp_path), kb)
    assert [(c["id"], c["problem_name"]) for c in cands] == [("a", "19_ReLU.py"), ("b", "7_Conv3d_ReLU.py")]
    assert cands[1]["reference"] == str(kb / "KernelBench" / "level2" / "7_Conv3d_ReLU.py")
    assert len(problems) == 2 and problems[0].startswith("c:") and problems[1].startswith("d:")
    assert [c["id"] for c in harness.load_candidates(write_folder(tmp_path / "x"), kb, ids=["b"])[0]] == ["b"]


def test_harness_dry_run_prints_the_plan_and_child_commands(tmp_path, capsys):
    kb = checkout(tmp_path)
    harness.main([str(write_folder(tmp_path)), "--kernelbench", str(kb), "--out", str(tmp_path / "kb.jsonl"),
                  "--gpus", "2", "--dry-run", "--fp32-tolerance", "0.01"])  # fmt: skip
    text = capsys.readouterr().out
    assert "plan: 2 candidates (level 1: 1, level 2: 1; 2 problems)" in text
    evals = [line for line in text.splitlines() if line.strip().startswith("eval:")]
    assert len(evals) == 2 and "--device 1" in evals[1] and "--fp32-tolerance 0.01" in evals[0]
    assert "--num-correct-trials 5 --num-perf-trials 100 --timing-method cuda_event" in evals[0]
    assert "--child-build" in text and not (tmp_path / "kb.jsonl").exists()


def test_harness_maps_kernelbench_results_to_statuses():
    c = harness.classify
    assert c(None, True, False)[0] == "timeout"
    assert c(None, False, False)[0] == "crash"
    assert c(None, False, True)[0] == "no_result"
    assert c({"compiled": True, "correctness": True, "metadata": {}}, False, True)[0] == "correct"
    assert c({"compiled": True, "correctness": False, "metadata": {"correctness_issue": "Output mismatch"}},
             False, True)[:2] == ("incorrect", "correctness_issue")  # fmt: skip
    assert c({"compiled": True, "correctness": False,
              "metadata": {"runtime_error": "x", "runtime_error_name": "torch.AcceleratorError"}},
             False, True)[:2] == ("runtime_error", "torch.AcceleratorError")  # fmt: skip
    assert c({"compiled": False, "correctness": False,
              "metadata": {"compilation_error_name": "RuntimeError", "compilation_error": "Error building"}},
             False, True)[:2] == ("compile_error", "RuntimeError")  # fmt: skip
    assert c({"compiled": False, "metadata": {"cuda_error": "CUDA Error: x", "cuda_error_name": "E"}}, False, True
             )[0] == "runtime_error"  # fmt: skip


def test_harness_process_accounting_counts_children_and_kills_on_timeout(tmp_path):
    busy = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'x = sum(range(30_000_000))'])"
    m = harness.run_measured([sys.executable, "-c", busy], tmp_path / "a.log", timeout=60)
    assert m["returncode"] == 0 and not m["timed_out"] and m["cpu_s"] > 0.3  # the grandchild's work counts
    start = time.perf_counter()
    m = harness.run_measured([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "b.log", timeout=1)
    assert m["timed_out"] and time.perf_counter() - start < 10


def test_harness_gives_unused_kernelbench_imports_stand_ins(tmp_path):
    pkg = tmp_path / "fakekb" / "src" / "kernelbench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import utils\n")
    (pkg / "utils.py").write_text(
        "from openai import OpenAI\nfrom litellm import completion\n"
        "from dotenv import load_dotenv\nload_dotenv()\nfrom tqdm import tqdm\n"
    )
    (pkg / "eval.py").write_text("X = 1\n")
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import kernelbench_harness as h;"
        f"from pathlib import Path; print(h.import_kernelbench(Path({str(tmp_path / 'fakekb')!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    stubbed = eval(proc.stdout.strip())
    assert {"openai", "litellm"} <= set(stubbed)


def test_harness_stops_before_building_when_kernelbench_does_not_import(tmp_path):
    # with a KernelBench dependency missing, every build and evaluation child would crash and each candidate would
    # read as a crash: one line before any build says what is missing instead
    kb = checkout(tmp_path)
    pkg = kb / "src" / "kernelbench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "eval.py").write_text("import pydantic_not_installed_here\n")
    out = tmp_path / "kb.jsonl"
    with pytest.raises(SystemExit) as stop:
        harness.main([str(write_folder(tmp_path)), "--kernelbench", str(kb), "--out", str(out)])
    assert "does not import here" in str(stop.value) and "pydantic_not_installed_here" in str(stop.value)
    assert not out.exists() and not (tmp_path / "kb.jsonl.work").exists()
    (pkg / "eval.py").write_text("X = 1\n")
    harness.check_importable(kb)  # the same checkout, importable: no error


@pytest.mark.parametrize("arch, expected", [("9.0", "9.0"), ("8.9;9.0", "8.9;9.0")])
def test_harness_numeric_arch_sets_the_torch_list(arch, expected, monkeypatch):
    # setenv, not delenv: delenv of an absent variable records nothing, and set_arch's value would outlive the test
    # (it reached the SLURM test's build cache keys)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "")
    harness.set_arch(arch)
    import os

    assert os.environ["TORCH_CUDA_ARCH_LIST"] == expected


def test_side_by_side_spreads_problems_and_counts_disagreements(tmp_path, capsys):
    side = load_benchmark("kernelbench_side_by_side")
    cands = [{"id": f"c{p}{s}", "level": 1 + p // 5, "problem_id": p, "program": "", "reference": ""}
             for p in range(10) for s in "ab"]  # fmt: skip
    picked = side.spread_problems(cands, 3)
    assert [c["problem_id"] for c in picked] == [0, 0, 3, 3, 6, 6]
    assert side.spread_problems(cands, 0) == cands
    out = tmp_path / "side"
    out.mkdir()
    ours = [("c0a", "correct"), ("c0b", "incorrect"), ("c3a", "rejected"), ("c3b", "correct")]
    lines = [{"mode": m, "candidate_id": c, "task_id": "t", "status": s, "reason": f"why {c}", "speedup": 1.0,
              "eval_s": 2.0, "flags": ""} for m in side.MODES for c, s in ours]  # fmt: skip
    (out / "ours.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (out / "ours.json").write_text(json.dumps({"candidates": 4, "build_cpu_s": 400.0, "kernelbench_wall_s": 8.0,
                                                "hardened_wall_s": 12.0}))  # fmt: skip
    kb = {"c0a": "correct", "c0b": "incorrect", "c3a": "correct", "c3b": "runtime_error"}
    (out / "kernelbench.jsonl").write_text("".join(
        json.dumps({"id": c, "status": s, "gpu_s": 8.0, "build_cpu_s": 90.0, "error": "boom"}) + "\n"
        for c, s in kb.items()))  # fmt: skip
    args = type("Args", (), {"out": out, "node_cores": 16})()
    result = side.report(picked[:4], args)
    rows = {r["verifier"]: r for r in result["table"]}
    assert rows["ours, hardened"]["GPU-s/cand mean"] == 3.0 and rows["ours, kernelbench"]["CPU-s/build"] == 100.0
    assert rows["KernelBench harness"]["GPU-s/cand mean"] == 8.0
    assert rows["ours, hardened"]["cand/h/node"] == 3600.0 / max(3.0, 100.0 / 16)
    assert result["per_job"]["hardened"] == {"in_jobs_s_per_cand": 2.0, "once_s": 4.0}  # 12 s wall, 4 jobs of 2 s
    assert result["agreement"]["agree"] == 2
    assert {d["id"] for d in result["agreement"]["disagreements"]} == {"c3a", "c3b"}
    assert "c3a: ours rejected" in capsys.readouterr().out
    log = tmp_path / "cache" / "entry" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v5\n0\t22000\t0\tmain.o\th\n0\t60000\t0\tcuda.cuda.o\th\n60000\t60400\t0\tm.so\th\n")
    assert side.build_steps(tmp_path / "cache") == {"cuda.cuda.o": 60.0, "link": 0.4, "main.o": 22.0}
    shards = tmp_path / "sharded"
    for k, ids in ((1, ("c0a", "c0b")), (2, ("c3a", "c3b"))):
        assert {c["id"] for c in side.shard_of(picked[:4], f"{k}/2")} == set(ids)
        folder = shards / f"shard-{k}-of-2"
        folder.mkdir(parents=True)
        (folder / "ours.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines if x["candidate_id"] in ids))
        (folder / "ours.json").write_text(json.dumps({"candidates": 2, "build_cpu_s": 200.0, "hardened_wall_s": 6.0,
                                                      "kernelbench_wall_s": 4.0, "build_steps_s": {}}))  # fmt: skip
    args.out = shards
    merged = side.report(picked[:4], args)
    assert [r["GPU-s/cand mean"] for r in merged["table"]] == [2.0, 3.0]  # 8 and 12 s over 4 candidates
    assert merged["per_job"]["hardened"] == {"in_jobs_s_per_cand": 2.0, "once_s": 4.0}  # 2 s once in each shard
    assert "2 shards, 4 candidates" in capsys.readouterr().out
    (tmp_path / "ref.py").write_text("class Model: pass\n")
    (tmp_path / "new.py").write_text("class ModelNew: pass\n")
    same_problem = [{"id": i, "level": 2, "reference": str(tmp_path / "ref.py"), "program": str(tmp_path / "new.py")}
                    for i in "xy"]  # fmt: skip
    candidates, tasks = side.frames(same_problem)
    assert list(candidates["task_id"]) == ["L2/ref", "L2/ref"] and list(tasks["task_id"]) == ["L2/ref"]


FAKE_KB_EVAL = """
import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Result:
    def __init__(self, **fields):
        self.fields = fields

    def model_dump(self):
        return dict(self.fields)


def get_torch_dtype_from_string(precision):
    return DTYPES[precision]


def get_tolerance_for_precision(precision):
    return 1e-4 if DTYPES.get(precision, precision) == torch.float32 else 1e-2


def get_error_name(e):
    return type(e).__name__


def check_metadata_serializable_all_types(metadata):
    return metadata


def build_compile_cache(custom_model_src, verbose=False, build_dir=None):
    return True, "", None


def eval_kernel_against_ref(original_model_src, custom_model_src, precision=torch.float32, **_):
    # a stand-in for KernelBench's evaluation: correct in float16 only, and it says which dtype it was given
    return Result(compiled=True, correctness=precision == torch.float16, runtime=1.0, ref_runtime=2.0,
                  metadata={"precision": str(precision)})
"""


def test_side_by_side_precision_reaches_both_parts_and_its_own_folder(tmp_path, monkeypatch, capsys):
    """--precision fp16: our part's tasks carry it (what the verifier reads as each task's precision), KernelBench's
    harness passes it to eval_kernel_against_ref (a stand-in KernelBench, in the harness's own child processes), and
    the files go to --out/fp16, where the report shows it and agrees; a report for another precision stops."""
    import concur.verify
    from concur.verify.api import task_precisions

    side = load_benchmark("kernelbench_side_by_side")
    kb = checkout(tmp_path)
    (kb / "src" / "kernelbench").mkdir(parents=True)
    (kb / "src" / "kernelbench" / "__init__.py").write_text("")
    (kb / "src" / "kernelbench" / "utils.py").write_text("def set_gpu_arch(arches):\n    pass\n")
    (kb / "src" / "kernelbench" / "eval.py").write_text(FAKE_KB_EVAL)
    seen = {}

    def fake_compile(candidates, settings, workdir, progress=False, tasks=None):
        return candidates[["candidate_id", "task_id"]].assign(status="built")

    def fake_verify(candidates, tasks, settings, workdir, progress=False, builds=None):
        seen.update(task_precisions(tasks))  # as verify_frame reads them
        precision = candidates["task_id"].map(task_precisions(tasks))
        return candidates[["candidate_id", "task_id"]].assign(
            status=["correct" if p == "fp16" else "incorrect" for p in precision], reason="", speedup=1.0,
            eval_s=1.0, flags="")  # fmt: skip

    monkeypatch.setattr(concur.verify, "compile_frame", fake_compile)
    monkeypatch.setattr(concur.verify, "verify_frame", fake_verify)
    monkeypatch.setattr(side, "shared_pchs", lambda *a: 0)
    out = tmp_path / "side"
    side.main([str(write_folder(tmp_path)), "--kernelbench", str(kb), "--out", str(out), "--precision", "fp16",
               "--modes", "kernelbench", "--build-workers", "2"])  # fmt: skip
    assert set(seen.values()) == {"fp16"} and len(seen) == 2
    assert not (out / "ours.json").exists() and not (out / "kernelbench.jsonl").exists()  # fp32's place stays empty
    assert json.loads((out / "fp16" / "ours.json").read_text())["precision"] == "fp16"
    theirs = [json.loads(x) for x in (out / "fp16" / "kernelbench.jsonl").read_text().splitlines()]
    assert [(r["precision"], r["metadata"]["precision"], r["status"]) for r in theirs] == [
        ("fp16", "torch.float16", "correct")
    ] * 2
    assert all(r["tolerance"] == 1e-2 for r in theirs)
    report = json.loads((out / "fp16" / "report.json").read_text())
    assert report["precision"] == "fp16" and report["agreement"]["agree"] == report["agreement"]["compared"] == 2
    assert f"precision: fp16 ({out / 'fp16'})" in capsys.readouterr().out
    args = type("Args", (), {"out": out / "fp16", "node_cores": 16, "precision": "bf16"})()
    with pytest.raises(SystemExit, match="results in fp16, report asked for bf16"):
        side.report(harness.load_candidates(write_folder(tmp_path / "again"), kb)[0], args)

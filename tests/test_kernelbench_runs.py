"""Importing KernelBench run folders into replay's format; the run's recorded verdicts kept apart and compared with
ours. The run folders are written here, shaped like what KernelBench's scripts (current and older) and its forks
write."""

import json
import math

import pandas as pd
import pytest

from concur.backends.base import Request
from concur.backends.replay import ReplayBackend
from concur.cli import main
from concur.kernelbench_runs import TaskIndex, compare_recorded, import_run, read_run, recorded_path
from concur.synthesize import candidate_id

PROGRAMS = {1: ["1_Square_matrix_multiplication_", "2_ReLU"], 2: ["1_Conv2D_ReLU_BiasAdd"]}
KERNEL = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"
HW = {"hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0"}


def write(folder, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "KernelBench-repo"
    for level, stems in PROGRAMS.items():
        write(root / "KernelBench" / f"level{level}", {f"{stem}.py": "# reference\n" for stem in stems})
    return root


@pytest.fixture
def tasks(tmp_path):
    rows = [
        {
            "task_id": f"kernelbench/L{level}/{stem}",
            "suite": "kernelbench",
            "level": level,
            "origin": f"level{level}/{stem}.py",
            "name": stem.split("_", 1)[1],
            "code": "# reference\n",
        }
        for level, stems in PROGRAMS.items()
        for stem in stems
    ]
    rows.append({"task_id": "builtin/relu", "suite": "builtin", "level": 1, "origin": "", "name": "relu", "code": ""})
    path = tmp_path / "tasks.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def verdict(correct: bool, runtime: float = -1.0, compiled: bool = True, **extra) -> dict:
    stats = {"mean": runtime, "std": 0.01, "min": runtime, "max": runtime, "num_trials": 100, **HW}
    metadata = {**HW, "correctness_trials": "(5 / 5)"} if correct else {**HW, "runtime_error": "CUDA error:\nboom"}
    return {
        "compiled": compiled,
        "correctness": correct,
        "metadata": metadata,
        "runtime": runtime,
        "runtime_stats": stats if runtime > 0 else {},
        **extra,
    }


@pytest.fixture
def current_run(tmp_path):
    """generate_samples.py with log_prompt, then eval_from_generations.py (problem → list of verdicts)."""
    run = tmp_path / "runs" / "current"
    write(
        run,
        {
            "generation_config.yaml": "level: 1\n",
            "level_1_problem_1_sample_0_prompt.txt": "prompt 1/0",
            "level_1_problem_1_sample_0_kernel.py": KERNEL,
            "level_1_problem_1_sample_1_prompt.txt": "prompt 1/1",
            "level_1_problem_1_sample_1_kernel.py": KERNEL + "# second\n",
            "level_1_problem_01_sample_0_kernel.py": "# the same sample again\n",  # duplicate (1, 1, 0)
            "level_1_problem_2_sample_0_prompt.txt": "prompt 2/0",
            "level_1_problem_2_sample_0_kernel.py": KERNEL,
            "level_1_problem_2_sample_1_prompt.txt": "prompt 2/1",  # the model's answer had no code: no kernel
            "level_1_problem_999_sample_0_kernel.py": KERNEL,  # no such KernelBench problem
            "notes.md": "my notes\n",
            "eval_results.json": {
                "1": [
                    {"sample_id": 0, **verdict(False)},
                    {"sample_id": 1, **verdict(True, 2.0, ref_runtime=3.0)},
                    {"sample_id": 0, **verdict(True, 4.0)},  # evaluated again: appended, the later one kept
                ],
                "2": [{"sample_id": 0, **verdict(False, compiled=False)}],
                "999": [{"sample_id": 0, **verdict(True, 1.0)}],
            },
            "pass_at_k_results.json": {"averages": {}},
        },
    )
    return run


def test_current_layout_maps_samples_keeps_prompts_and_counts_every_skip(current_run, checkout, tmp_path, caplog):
    out = tmp_path / "out" / "generations.jsonl"
    report = import_run(current_run, out, kernelbench=checkout)

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["sample_idx"]) for r in records] == [
        ("kernelbench/L1/1_Square_matrix_multiplication_", 0),
        ("kernelbench/L1/1_Square_matrix_multiplication_", 1),
        ("kernelbench/L1/2_ReLU", 0),
    ]
    first = records[0]
    assert first["response"] == f"```python\n{KERNEL.rstrip()}\n```\n"  # no raw answer saved: the kernel, fenced
    assert first["response_kind"] == "kernel" and first["prompt"] == "prompt 1/0"
    assert "reasoning" not in first and "finish_reason" not in first  # never recorded by KernelBench

    assert report.samples == 3 and report.response_kinds == {"kernel": 3} and report.with_prompt == 3
    assert report.unmatched_files == ["notes.md"]
    assert report.unmapped_problems == [(1, 999)] and report.unmapped_samples == 1
    assert report.empty_samples == [(1, 2, 1)]
    assert report.duplicate_samples == [(1, 1, 0)]
    assert report.duplicate_verdicts == [(1, 1, 0)]
    assert report.verdicts == 3 and report.verdicts_without_sample == 1  # problem 999's
    assert "level 1 problem 999" in caplog.text and "notes.md" in caplog.text

    recorded = pd.read_csv(recorded_path(out)).set_index(["task_id", "sample_idx"])
    assert recorded_path(out).name == "generations.recorded.csv"
    mm = "kernelbench/L1/1_Square_matrix_multiplication_"
    assert recorded.loc[(mm, 0), "correct"] and recorded.loc[(mm, 0), "runtime_ms"] == 4.0  # the later verdict
    assert math.isnan(recorded.loc[(mm, 0), "speedup"])  # no reference runtime recorded
    assert recorded.loc[(mm, 1), "speedup"] == pytest.approx(1.5)  # ref_runtime / runtime
    relu = recorded.loc[("kernelbench/L1/2_ReLU", 0)]
    assert not relu["compiled"] and not relu["correct"] and math.isnan(relu["runtime_ms"])
    assert relu["hardware"] == "NVIDIA H100 80GB HBM3" and relu["source"] == "eval_results.json"
    assert "runtime_error=CUDA error: boom" in relu["metadata"] and "\n" not in relu["metadata"]


def test_a_tasks_table_maps_like_a_checkout_and_replay_reads_the_file(current_run, tasks, tmp_path):
    out = tmp_path / "generations.jsonl"
    import_run(current_run, out, tasks=tasks)
    backend = ReplayBackend(out)
    generations = list(backend.generate([Request("kernelbench/L1/2_ReLU", "")], samples=4))
    assert [(g.task_id, g.sample_idx) for g in generations] == [("kernelbench/L1/2_ReLU", 0)]
    assert generations[0].response.startswith("```python\n")


def test_older_layout_one_verdict_per_problem_and_no_prompts(tmp_path, checkout):
    """Early KernelBench (and public dumps of it): eval_results.json maps a problem to one verdict dict."""
    run = tmp_path / "old"
    write(
        run,
        {
            "level_1_problem_1_sample_0_kernel.py": KERNEL,
            "level_1_problem_2_sample_0_kernel.py": KERNEL,
            "eval_results.json": {"1": {"sample_id": 0, **verdict(True, 2.5)}, "2": verdict(False)},
        },
    )
    result = read_run(run, TaskIndex.from_kernelbench(checkout))
    assert [s.prompt for s in result.samples] == [None, None]
    frame = result.recorded_frame()
    assert frame["correct"].tolist() == [True, False] and frame["runtime_ms"].iloc[0] == 2.5


def test_fork_layout_raw_responses_reasoning_and_per_sample_verdicts(tmp_path, checkout):
    """Forks that save the raw answer (`_response.txt`, with or without a REASONING TRACE block, `_raw.txt`), the
    reasoning separately, verdicts per sample, and eval_results.json as level → problem → sample → verdict."""
    run = tmp_path / "fork"
    answer = "Here it is.\n```python\n" + KERNEL + "```\n"
    write(
        run,
        {
            "level_1_problem_1_sample_0_kernel.py": KERNEL,
            "level_1_problem_1_sample_0_response.txt": f"REASONING TRACE:\nthink hard\n\nANSWER:\n{answer}\n\nUsage:\n"
            "CompletionUsage(completion_tokens=9)",
            "level_1_problem_1_sample_1_kernel.py": KERNEL,
            "level_1_problem_1_sample_1_response.txt": "REASONING TRACE:\nNone\n\nANSWER:\nplain\n\nUsage:\nNone",
            "level_1_problem_2_sample_0_kernel.py": KERNEL,
            "level_1_problem_2_sample_0_raw.txt": answer,
            "level_1_problem_2_sample_0_reasoning.txt": "separate thoughts",
            "level_1_problem_2_sample_0_eval_result.json": {
                "level": 1,
                "problem_id": 2,
                "sample_id": 0,
                **verdict(True, 1.0, ref_runtime=2.0),
            },
            "eval_results.json": {"1": {"1": {"0": verdict(True, 3.0), "1": verdict(False)}}},
        },
    )
    result = read_run(run, TaskIndex.from_kernelbench(checkout))
    by_key = {(s.problem_id, s.sample_idx): s for s in result.samples}
    assert by_key[(1, 0)].response == answer and by_key[(1, 0)].reasoning == "think hard"
    assert by_key[(1, 1)].response == "plain" and by_key[(1, 1)].reasoning is None
    assert by_key[(2, 0)].response == answer and by_key[(2, 0)].reasoning == "separate thoughts"
    assert result.report.response_kinds == {"raw": 3} and result.report.with_reasoning == 2
    frame = result.recorded_frame().set_index(["problem_id", "sample_idx"])
    assert frame.loc[(1, 0), "runtime_ms"] == 3.0 and not frame.loc[(1, 1), "correct"]
    assert frame.loc[(2, 0), "speedup"] == 2.0 and frame.loc[(2, 0), "source"].endswith("_eval_result.json")


def test_single_sample_log_folder(tmp_path, checkout):
    """generate_and_eval_single_sample.py's logdir: one sample per problem, the verdict as printed text."""
    run = tmp_path / "single"
    write(
        run,
        {
            "prompt_level_2_problem_1.txt": "the prompt",
            "generated_kernel_level_2_problem_1.py": KERNEL,
            "eval_result_level_2_problem_1.txt": "Problem Name: 1_Conv2D_ReLU_BiasAdd.py\ncompiled=True "
            "correctness=True metadata={'hardware': 'NVIDIA L40S', 'device': 'cuda:0'} runtime=0.5 "
            "runtime_stats={'mean': 0.5} ref_runtime=1.5 ref_runtime_stats={}",
        },
    )
    result = read_run(run, TaskIndex.from_kernelbench(checkout))
    (sample,) = result.samples
    assert (sample.task_id, sample.sample_idx, sample.prompt) == (
        "kernelbench/L2/1_Conv2D_ReLU_BiasAdd",
        0,
        "the prompt",
    )
    (recorded,) = result.verdicts
    assert recorded.correct and recorded.runtime_ms == 0.5 and recorded.speedup == 3.0
    assert recorded.hardware == "NVIDIA L40S"


def test_levels_strictness_and_baseline(tmp_path, checkout):
    run = tmp_path / "mixed"
    write(
        run,
        {
            "level_1_problem_2_sample_0_kernel.py": KERNEL,
            "level_2_problem_1_sample_0_kernel.py": KERNEL,
            "level_2_problem_7_sample_0_kernel.py": KERNEL,
            "eval_results.json": {"2": [{"sample_id": 0, **verdict(True, 2.0)}]},
        },
    )
    index = TaskIndex.from_kernelbench(checkout)
    with pytest.raises(ValueError, match="records no level .* levels 1, 2: pass --level"):
        read_run(run, index)
    with pytest.raises(ValueError, match="^level 2 problem 7: no KernelBench task"):
        read_run(run, index, strict=True)

    baseline = tmp_path / "baseline_time_torch.json"
    baseline.write_text(json.dumps({"level1": {"2_ReLU.py": {"mean": 5.0, "hardware": "NVIDIA A100-SXM4-40GB"}}}))
    result = read_run(run, index, level=1, baseline=baseline)
    assert [s.task_id for s in result.samples] == ["kernelbench/L1/2_ReLU"]
    assert result.report.other_level_files == 2 and result.report.unmapped_problems == []
    (recorded,) = result.verdicts  # eval_results.json is level 1's here
    assert recorded.ref_runtime_ms == 5.0 and recorded.speedup == 2.5
    assert result.report.baseline_other_hardware == 1  # the run's kernel was timed on an H100


def test_nothing_mapping_is_one_line_naming_the_problem(tmp_path, checkout, capfd):
    run = tmp_path / "other"
    write(run, {"level_3_problem_4_sample_0_kernel.py": KERNEL})
    code = main(["import-kernelbench", str(run), "--out", str(tmp_path / "g.jsonl"), "--kernelbench", str(checkout)])
    err = capfd.readouterr().err
    assert code == 2 and "level 3 problem 4: no KernelBench task" in err and "Traceback" not in err
    assert not (tmp_path / "g.jsonl").exists()


def test_cli_import_then_compare_with_our_verdicts(current_run, tasks, tmp_path, capfd):
    out = tmp_path / "generations.jsonl"
    assert main(["import-kernelbench", str(current_run), "--out", str(out), "--tasks", str(tasks)]) == 0
    err = capfd.readouterr().err
    assert "3 samples (response: 3 kernel; 3 with prompt" in err and "1 unmapped problems" in err

    recorded = pd.read_csv(recorded_path(out))
    candidates = pd.DataFrame(
        [
            {"task_id": t, "sample_idx": i, "candidate_id": candidate_id("kb", t, i)}
            for t, i in zip(recorded["task_id"], recorded["sample_idx"])
        ]
    )
    statuses = {0: ("correct", ""), 1: ("incorrect", "trial 0: value_mismatch"), 2: ("compile_error", "nvcc: x")}
    verified = pd.DataFrame(
        [
            {
                "candidate_id": c,
                "status": statuses[n][0],
                "correct": statuses[n][0] == "correct",
                "reason": statuses[n][1],
            }
            for n, c in enumerate(candidates["candidate_id"])
        ]
    )
    agreement = compare_recorded(recorded_path(out), candidates, verified)
    # recorded: matmul 0 correct, matmul 1 correct, relu 0 not compiled; ours: correct, incorrect, compile_error
    assert (agreement.recorded, agreement.joined, agreement.agree, agreement.disagree) == (3, 3, 2, 1)
    (d,) = agreement.disagreements
    assert (d.sample_idx, d.recorded, d.ours, d.our_reason) == (1, "correct", "incorrect", "trial 0: value_mismatch")
    assert agreement.crosstab.loc["correct", "correct"] == 1 and agreement.crosstab.loc["not_compiled", "compile_error"]

    candidates.to_parquet(tmp_path / "c.parquet")
    verified.to_parquet(tmp_path / "v.parquet")
    args = ["--recorded", str(recorded_path(out)), "--candidates", str(tmp_path / "c.parquet")]
    assert main(["compare-recorded", *args, "--verified", str(tmp_path / "v.parquet")]) == 0
    printed = capfd.readouterr().out
    assert "joined with ours: 3; correctness agrees on 2, disagrees on 1" in printed
    assert d.candidate_id in printed


def test_compare_refuses_candidates_of_several_generators(tmp_path):
    recorded = pd.DataFrame([{"task_id": "t", "sample_idx": 0, "compiled": True, "correct": True}])
    candidates = pd.DataFrame([{"task_id": "t", "sample_idx": 0, "candidate_id": c} for c in ("a", "b")])
    verified = pd.DataFrame([{"candidate_id": c, "status": "correct", "correct": True} for c in ("a", "b")])
    with pytest.raises(ValueError, match="t sample 0 appears more than once"):
        compare_recorded(recorded, candidates, verified)


def solution(level: int, problem: int, sample: int, epoch: int = 0, **record) -> dict:
    """A verdict record of a fork that runs epochs: a list element naming its sample by strings."""
    sid = f"level_{level}_problem_{problem}_epoch_{epoch}_sample_{sample}"
    return {"evaluation_id": sid, "task_id": f"level_{level}_problem_{problem}", "solution_id": sid, **record}


@pytest.fixture
def epoch_run(tmp_path):
    """A fork's run folder: `..._epoch_{E}_sample_{S}_` files with the raw completion (reasoning and answer in one
    text) as `_response.txt`, eval_results.json a list of records keyed by task_id/solution_id strings, a config
    naming max_tokens, and side files and a subfolder of the fork's own (rule extraction) that are no samples."""
    run = tmp_path / "runs" / "epochs_level1"
    raw = "The code should be compatible with...\nLet me think.\n</think>\n\n```python\n" + KERNEL + "```\n"
    cut = "Okay, so I need to write a kernel. First, the tiling"  # cut at the token cap: no code at all
    files = {
        "config.yaml": "level: 1\nmax_tokens: 32768\nnum_epochs: 1\nmodel_name: some/model\n",
        "metrics.json": {"by_sample": {}},
        "llm_usage.json": {"usage_aggregate": {"total_tokens": 0}},
        "usage.log": "request 1 took 3.2s\n",
        "eval_results.json": [
            solution(1, 1, 0, **verdict(True, 2.0)),
            solution(1, 1, 1, **verdict(False)),
            solution(1, 2, 0, **verdict(False, compiled=False)),
            solution(1, 2, 1, **verdict(False, compiled=False)),  # the slot without a response
            {"task_id": "level_1_problem_2", **verdict(True, 1.0)},  # names no sample: counted, not guessed
        ],
    }
    for problem, sample, response in ((1, 0, raw), (1, 1, cut), (2, 0, raw), (2, 1, None)):
        stem = f"level_1_problem_{problem}_epoch_0_sample_{sample}"
        files[f"{stem}_prompt.txt"] = f"prompt {problem}"
        files[f"{stem}_kernel.py"] = KERNEL if response == raw else ""
        if response is not None:
            files[f"{stem}_response.txt"] = response
    write(run, files)
    write(
        run / "epoch_0_batch_0",
        {
            "level_1_problem_1_comparative_analysis.txt": "sample 0 is faster because",
            "level_1_problem_1_rules.json": ["use shared memory"],
            "level_1_problem_1_sample_0_kernel.py": "# not a sample of the run\n",
        },
    )
    (run / "epoch_0_batch_0" / "alignment").mkdir()
    return run, raw, cut


def test_epoch_layout_raw_completions_and_solution_id_verdicts(epoch_run, checkout, tmp_path, caplog):
    run, raw, cut = epoch_run
    out = tmp_path / "qwq" / "level1.jsonl"
    caplog.set_level("INFO", logger="concur.kernelbench_runs")
    report = import_run(run, out, kernelbench=checkout)

    records = [json.loads(line) for line in out.read_text().splitlines()]
    mm = "kernelbench/L1/1_Square_matrix_multiplication_"
    assert [(r["task_id"], r["sample_idx"]) for r in records] == [(mm, 0), (mm, 1), ("kernelbench/L1/2_ReLU", 0)]
    assert records[0] == {"task_id": mm, "sample_idx": 0, "response": raw, "prompt": "prompt 1", "response_kind": "raw"}
    assert records[1]["response"] == cut and "reasoning" not in records[1]  # the whole text, whatever it holds

    assert report.samples == 3 and report.response_kinds == {"raw": 3} and report.with_prompt == 3
    assert report.with_reasoning == 0 and report.epochs == 1 and report.sample_stride == 0
    assert report.unmatched_files == []  # the run's side files are known; its subfolder is never read
    assert report.empty_samples == [(1, 2, 1)] and report.unmapped_problems == []
    assert report.verdicts == 3 and report.verdicts_without_sample == 1 and report.unkeyed_verdicts == 1
    assert (report.config_file, report.config_max_tokens) == ("config.yaml", 32768)
    assert "config.yaml says max_tokens 32768" in caplog.text
    assert "1 verdicts naming no sample" in report.summary()

    recorded = pd.read_csv(recorded_path(out)).set_index(["task_id", "sample_idx"])
    assert recorded.index.tolist() == [(mm, 0), (mm, 1), ("kernelbench/L1/2_ReLU", 0)]
    assert recorded.loc[(mm, 0), "correct"] and recorded.loc[(mm, 0), "runtime_ms"] == 2.0
    assert not recorded.loc[(mm, 1), "correct"] and not recorded.loc[("kernelbench/L1/2_ReLU", 0), "compiled"]
    assert set(recorded["source"]) == {"eval_results.json"}
    assert "compiled" not in records[0] and "correct" not in records[0]  # verdicts only in the CSV


def test_several_epochs_number_samples_epoch_major(tmp_path, checkout):
    run = tmp_path / "epochs"
    files = {"eval_results.json": []}
    for epoch in (0, 1):
        for sample in (0, 1, 2):
            stem = f"level_1_problem_2_epoch_{epoch}_sample_{sample}"
            files[f"{stem}_response.txt"] = f"answer e{epoch} s{sample}"
            files["eval_results.json"].append(solution(1, 2, sample, epoch, **verdict(epoch == 1 and sample == 2)))
    files["level_1_problem_1_sample_0_response.txt"] = "no epoch in the name: epoch 0"
    write(run, files)
    result = read_run(run, TaskIndex.from_kernelbench(checkout))

    by_idx = {(s.problem_id, s.sample_idx): s.response for s in result.samples}
    assert by_idx == {
        (1, 0): "no epoch in the name: epoch 0",
        **{(2, e * 3 + s): f"answer e{e} s{s}" for e in (0, 1) for s in (0, 1, 2)},
    }
    assert result.report.epochs == 2 and result.report.sample_stride == 3
    assert "2 epochs, sample_idx = epoch * 3 + sample" in result.report.summary()
    frame = result.recorded_frame()
    assert frame[frame["correct"]]["sample_idx"].tolist() == [5]  # epoch 1 sample 2
    assert len(frame) == 6 and result.report.verdicts_without_sample == 0


def test_max_tokens_reported_as_configured_or_not_set(current_run, checkout, tmp_path):
    index = TaskIndex.from_kernelbench(checkout)
    report = read_run(current_run, index).report  # KernelBench's generation_config.yaml here names no max_tokens
    assert (report.config_file, report.config_max_tokens) == ("generation_config.yaml", None)
    (current_run / "generation_config.yaml").unlink()
    assert read_run(current_run, index).report.config_file is None
    (current_run / "generation_config.yaml").write_text("max_tokens: [unclosed\n")
    assert read_run(current_run, index).report.config_max_tokens is None  # unreadable: warned, not fatal

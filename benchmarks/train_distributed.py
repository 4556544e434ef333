"""Paper-scale LoRA training on one node's GPUs, through the train stage's own entry point (concur.train.launch.run).

    # a model folder of the Qwen2.5-32B architecture with random bf16 weights (a step costs what it costs with the
    # real weights), the tokenizer taken from TOKENIZER_DIR (tokenizer.json), a ChatML chat template added
    python benchmarks/train_distributed.py build-model --arch qwen2.5-32b --tokenizer TOKENIZER_DIR --out M32
    python benchmarks/train_distributed.py peak                     # measured bf16 matmul peak of each GPU
    python benchmarks/train_distributed.py layers                   # where a layer's time goes (one GPU)
    python benchmarks/train_distributed.py run --model M32 --gpus 2 --liger --checkpoint-layers 60 --out runs.jsonl
    python benchmarks/train_distributed.py run --model M32 --gpus 2 --recipe plain --out runs.jsonl
    python benchmarks/train_distributed.py table runs.jsonl --peak-tflops 780
    python benchmarks/train_distributed.py correctness --model SMALL --gpus 2 --out check.json

`run` trains on synthetic records of the paper's lengths (`--min-tokens`..`--max-tokens`, uniform, 8K-16K by default)
for `--warmup` + `--steps` optimizer steps and appends one JSON line: tokens/s per GPU, s/step, the peak GPU memory
of any process, and the model FLOPs per token, from which `table` computes MFU against `--peak-tflops`.

Recipes. `ours`: `concur.train.launch.run` with the job's settings (packing, TRL's fused LM-head loss, non-reentrant
checkpointing; `--liger`: train.liger_kernels, `--checkpoint-layers`: train.checkpoint_layers). `plain`: the same
records, LoRA, model, launch and examples per step through TRL's SFTTrainer with TRL's defaults for everything else
(no packing, the model's own loss, TRL's default checkpointing, random order); only the micro-batch is 1 (TRL's
default of 8 rows of 16K tokens does not fit a GPU).

MFU counts the model FLOPs a step needs, not the recomputation of checkpointing: per token 2 (forward) + 2 (gradient
of the inputs; the frozen weights get none) times the base model's matmul parameters, 6 times the LoRA parameters,
and causal attention within each example (forward 4 x layers x width x position, backward twice that).

`correctness`: the same small job on 1 GPU and on `--gpus` GPUs from the same seed (LoRA dropout 0, so the runs
differ only by reduction order): per-step losses side by side; then the multi-GPU job killed after its first
checkpoint and run again, resuming to its final loss; then the adapter served by the eval_generate stage's code.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from train_throughput import WORDS  # noqa: E402  (the synthetic records' vocabulary)

from concur.train.trainer import _lora_config as lora_config  # noqa: E402
from concur.verify import procs  # noqa: E402

# Published architecture numbers (config.json of the Hugging Face releases); the weights are random.
ARCHS = {
    "qwen2.5-32b": dict(
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(  # for a quick check on the CPU
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
}
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHARD_BYTES = 4 << 30


# ----------------------------------------------------------------------------------------------------- the model
def build_model(arch: str, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A Hugging Face folder: the architecture's config, random bf16 weights in safetensors shards, the tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.for_model("qwen2", **ARCHS[arch], torch_dtype="bfloat16")
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device).manual_seed(seed)
    plan, shard, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if shard and size + nbytes > SHARD_BYTES:
            plan.append(shard)
            shard, size = [], 0
        shard.append(name)
        size += nbytes
    plan.append(shard)
    weight_map, total = {}, 0
    for index, names in enumerate(plan, 1):
        file = f"model-{index:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                value = torch.ones(shapes[name], device=device)
            elif name.endswith(".bias"):
                value = torch.zeros(shapes[name], device=device)
            else:
                value = torch.randn(shapes[name], device=device, generator=generator).mul_(0.02)
            tensors[name] = value.to(torch.bfloat16).cpu()
            weight_map[name] = file
            total += 2 * value.numel()
        save_file(tensors, str(out / file), metadata={"format": "pt"})
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1))
    config.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(out)
    return out


def peak_tflops(size: int = 8192, repeats: int = 20) -> list[float]:
    """Each visible GPU's bf16 matmul rate on random data (TFLOP/s, the mean of `repeats` after warm-up)."""
    import torch

    rates = []
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                a @ b
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                a @ b
            end.record()
            end.synchronize()
            rates.append(2 * size**3 * repeats / (start.elapsed_time(end) / 1e3) / 1e12)
    return rates


# --------------------------------------------------------------------------------------------------- the records
def dataset(tokenizer, n: int, min_tokens: int, max_tokens: int, seed: int, out: Path) -> list[int]:
    """n curated-table rows (docs/data.md §5: prompt, reasoning, answer) whose training record is min..max tokens
    long (uniform), written to `out` (parquet); returns the records' token counts."""
    import pandas as pd

    from concur.curate import sft_record
    from concur.train.records import chat_ids

    rng = random.Random(seed)
    rows, lengths = [], []
    for index in range(n):
        target = rng.randint(min_tokens, max_tokens)
        row = {
            "candidate_id": f"synthetic-{index}",
            "task_id": f"synthetic/{index}",
            "prompt": f"Write a fused CUDA kernel for program {index}: out = relu(x @ w + b). Return ModelNew.",
            "reasoning": "",
            "answer": "```python\nclass ModelNew(Model):\n    pass\n```",
        }
        words = target
        for _ in range(3):  # a few corrections: words are not exactly tokens
            row["reasoning"] = " ".join(rng.choice(WORDS) for _ in range(max(1, words)))
            length = len(chat_ids(tokenizer, sft_record(row)["messages"], False))
            words += target - length
            if abs(target - length) <= 8:
                break
        rows.append(row)
        lengths.append(length)
    pd.DataFrame(rows).to_parquet(out)
    return lengths


def model_flops_per_token(config: dict, lengths: list[int], lora_r: int) -> float:
    """Model FLOPs per trained token (module docstring), averaged over records of these lengths."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = h * config["num_key_value_heads"] // config["num_attention_heads"]
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * i  # q, o; k, v; gate, up, down
    base = layers * per_layer + h * config["vocab_size"]  # the LM head is a matmul; the embedding is a lookup
    lora = layers * lora_r * (2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h))
    tokens = sum(lengths)
    attention = sum(4 * layers * h * n * (n + 1) / 2 * 3 for n in lengths) / tokens  # causal, forward + backward
    return 4 * base + 6 * lora + attention


# ---------------------------------------------------------------------------------------------------- the runs
class MemoryPoller:
    """The most memory each GPU used (nvidia-smi, every second): CUDA context and NCCL buffers included."""

    def __init__(self):
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _poll(self):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(1.0):
            try:
                lines = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.splitlines()
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in lines:
                gpu, used = (part.strip() for part in line.split(","))
                if visible is None or gpu in visible.split(","):
                    self.peak[gpu] = max(self.peak.get(gpu, 0.0), float(used) / 1024)


def settings_for(args, gpus: int, distributed: str, **overrides) -> dict:
    return {
        "lora": {"r": args.lora_r, "alpha": args.lora_r, "dropout": 0.05, "target_modules": PROJECTIONS},
        "epochs": 1000,  # max_steps decides
        "max_steps": args.warmup + args.steps,
        "save_steps": 10**9,
        "learning_rate": 1e-4,
        "lr_scheduler": "constant",
        "warmup_ratio": 0.0,
        "max_length": args.max_tokens,
        "batch_size": 1,
        "gradient_accumulation_steps": args.accumulation,
        "packing": True,
        "seed": args.seed,
        "gpus": gpus,
        "distributed": distributed,
        **overrides,
    }


def measure(args) -> dict:
    """One configuration, trained through the recipe's entry point; its throughput after the warm-up steps."""
    from concur import models

    work = Path(args.workdir or tempfile.mkdtemp(prefix="concur-train-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = {"path": str(args.model), "dtype": "bfloat16"}
    if args.attn_implementation:
        spec["attn_implementation"] = args.attn_implementation
    tokenizer = models.load_tokenizer(spec)
    n = args.records or max(8, args.gpus * args.accumulation * (args.warmup + args.steps))
    lengths = dataset(tokenizer, n, args.min_tokens, args.max_tokens, args.seed, work / "rows.parquet")
    settings = settings_for(
        args,
        args.gpus,
        args.distributed,
        checkpoint_layers=args.checkpoint_layers,
        liger_kernels=args.liger,
    )
    name = f"{args.recipe}-{args.distributed}-{args.gpus}"
    out = work / name
    started = time.perf_counter()
    with MemoryPoller() as poller:
        if args.recipe == "ours":
            from concur.train import launch

            launch.run(
                str(work / "rows.parquet"), spec, settings, str(out), accelerate_configs=ROOT / "configs/accelerate"
            )
        else:
            plain_launch(work / "rows.parquet", spec, settings, out)
    wall = time.perf_counter() - started
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    before, timed = log[args.warmup - 1] if args.warmup else None, log[args.warmup :]
    seconds = sum(entry["step_time_s"] for entry in timed)
    tokens = timed[-1]["input_tokens"] - (before["input_tokens"] if before else 0)
    config = json.loads((Path(args.model) / "config.json").read_text())
    return {
        "recipe": args.recipe,
        "distributed": args.distributed,
        "gpus": args.gpus,
        "attn": args.attn_implementation or "sdpa",
        "recomputed": "all" if args.checkpoint_layers is None or args.recipe != "ours" else args.checkpoint_layers,
        "liger": bool(args.liger and args.recipe == "ours"),
        "records": f"{args.min_tokens}-{args.max_tokens}",
        "tokens_per_step": tokens / len(timed),
        "step_s": seconds / len(timed),
        "tokens_per_s_per_gpu": tokens / seconds / args.gpus,
        "model_flops_per_token": model_flops_per_token(config, lengths, args.lora_r),
        "peak_allocator_gib": max((e.get("peak_memory_gib") or 0) for e in log) or None,
        "peak_gpu_gib": max(poller.peak.values()) if poller.peak else None,
        "losses": [e["loss"] for e in log],
        "steps_timed": len(timed),
        "wall_s": round(wall, 1),
    }


def plain_launch(rows: Path, spec: dict, settings: dict, out: Path) -> None:
    """The plain recipe in `gpus` processes, launched the way the train stage launches (same accelerate config)."""
    from concur.train import launch

    out.mkdir(parents=True, exist_ok=True)
    job = out / "plain.json"
    job.write_text(json.dumps({"rows": str(rows), "spec": spec, "settings": settings, "out": str(out)}))
    if settings["gpus"] <= 1:
        plain_worker(job)
        return
    config_file = launch.accelerate_config_file(settings, ROOT / "configs/accelerate")
    command = launch.launch_command(settings["gpus"], config_file, job)
    command[command.index("-m", 3) :] = [str(Path(__file__).resolve()), "plain-worker", str(job)]
    subprocess.run(command, check=True)


def plain_worker(job_file: Path) -> None:
    """One process of the plain recipe: TRL's SFTTrainer and SFTConfig defaults, the job's LoRA and step shape."""
    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from concur.curate import sft_record
    from concur.train.progress import ConcurSFTTrainer, step_log
    from concur.train.records import prompt_completion

    job = json.loads(Path(job_file).read_text())
    settings, out = job["settings"], Path(job["out"])
    records = [sft_record(r) for r in pd.read_parquet(job["rows"]).to_dict("records")]
    on_cpu = {} if torch.cuda.is_available() else {"use_cpu": True, "bf16": False}  # TRL's bf16 default needs a GPU
    args = SFTConfig(
        output_dir=str(out / "checkpoints"),
        max_length=settings["max_length"],
        max_steps=settings["max_steps"],
        per_device_train_batch_size=settings["batch_size"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"],
        learning_rate=settings["learning_rate"],
        lr_scheduler_type=settings["lr_scheduler"],
        seed=settings["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        **on_cpu,
    )
    trainer = ConcurSFTTrainer(  # TRL's trainer; the subclass only counts tokens and memory for the step log
        model=AutoModelForCausalLM.from_pretrained(job["spec"]["path"], dtype="bfloat16"),
        args=args,
        train_dataset=Dataset.from_list([prompt_completion(r) for r in records]),
        processing_class=AutoTokenizer.from_pretrained(job["spec"]["path"]),
        peft_config=lora_config(settings["lora"]),  # the same LoRA as ours
    )
    trainer.fused_loss = False
    trainer.train()
    if args.process_index == 0:
        lines = [json.dumps(entry) for entry in step_log(trainer.state.log_history)]
        (out / "train_log.jsonl").write_text("\n".join(lines) + "\n")


def layers_table(rows: list[dict]) -> str:
    """`layers`' rows: each setting's time a layer beside the plain setting's (no Liger, every layer recomputed) and
    what a layer that keeps its activations costs over one that recomputes them; then the LM heads."""
    parts = [r for r in rows if r["part"] == "layers"]
    plain = next(r["ms_per_layer"] for r in parts if r["recompute"] and not r["liger"])

    def kept(r: dict) -> str:
        twin = [t for t in parts if t["liger"] == r["liger"] and t["recompute"]]
        return "-" if r["recompute"] or not twin else f"{r['gib_per_layer'] - twin[0]['gib_per_layer']:.2f}"

    lines = [
        "| Liger | recompute | ms a layer | vs plain | GiB a layer kept |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if r["part"] == "layers":
            lines.append(
                f"| {'yes' if r['liger'] else 'no'} | {'yes' if r['recompute'] else 'no'} | "
                f"{r['ms_per_layer']:.1f} | {plain / r['ms_per_layer']:.2f}x | {kept(r)} |"
            )
    lines += ["", "| LM head and loss | ms | GiB |", "|---|---:|---:|"]
    lines += [f"| {r['loss']} | {r['ms']:.1f} | {r['gib']:.2f} |" for r in rows if r["part"] == "head"]
    return "\n".join(lines)


def table(results: list[dict], peak: float | None) -> str:
    columns = [
        "recipe",
        "distributed",
        "GPUs",
        "attn",
        "Liger",
        "recomputed",
        "tok/step",
        "s/step",
        "tok/s/GPU",
        "MFU",
        "peak GiB",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] * 6 + ["---:"] * 5) + "|"]
    for r in results:
        mfu = r["tokens_per_s_per_gpu"] * r["model_flops_per_token"] / (peak * 1e12) if peak else None
        gib = r.get("peak_gpu_gib") or r.get("peak_allocator_gib")
        cells = [
            r["recipe"],
            r["distributed"] if r["gpus"] > 1 else "-",
            str(r["gpus"]),
            r["attn"],
            "yes" if r.get("liger") else "no",
            str(r.get("recomputed", "all")),
            f"{r['tokens_per_step']:,.0f}",
            f"{r['step_s']:.2f}",
            f"{r['tokens_per_s_per_gpu']:,.0f}",
            f"{mfu:.1%}" if mfu else "-",
            f"{gib:.1f}" if gib else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- the layers
def layers(args) -> list[dict]:
    """Where a step's time goes, on one GPU: `--layers` decoder layers of the architecture (random bf16 weights, LoRA
    r=`--lora-r` with dropout 0.05 on all seven projections) read one `--max-tokens` sequence, forward and backward,
    with and without Liger's kernels (train.liger_kernels) and recomputation (train.checkpoint_layers). Then the LM
    head and loss of one such sequence: the model's own cross-entropy (the plain recipe) against TRL's fused LM head
    (ours). Milliseconds a layer; GiB a layer of the step's peak above the weights."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", **{**ARCHS[args.arch], "num_hidden_layers": args.layers})
    config.use_cache = False
    lora = lora_config({"r": args.lora_r, "alpha": args.lora_r, "dropout": 0.05, "target_modules": PROJECTIONS})
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke test of the tiny architecture
    ids = torch.randint(0, config.vocab_size, (1, args.max_tokens), device=device)
    labels = ids.clone()
    labels[:, : args.max_tokens // 8] = -100  # a prompt: TRL's fused head projects only the labelled positions

    def timed(step, repeats: int = 3) -> tuple[float, float]:
        """ms of one step (median of `repeats` after 2 warm-ups) and the GiB it held above what was allocated."""
        for _ in range(2):
            step()
        if device == "cpu":
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                step()
                times.append((time.perf_counter() - started) * 1e3)
            return sorted(times)[len(times) // 2], 0.0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2], (torch.cuda.max_memory_allocated() - base) / 2**30

    rows: list[dict] = []
    for liger in (False, True) if device == "cuda" else (False,):  # Liger patches in place: the plain layers first
        torch.manual_seed(args.seed)
        with torch.device(device):
            base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        if liger:
            from liger_kernel.transformers import _apply_liger_kernel_to_instance

            _apply_liger_kernel_to_instance(model=base, fused_linear_cross_entropy=False, cross_entropy=False)
        model = get_peft_model(base, lora)
        model.train()
        step = functools.partial(layer_step, model, base.model, ids)
        for recompute in (True, False):
            if recompute:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_disable()
            ms, gib = timed(step)
            rows.append(
                {
                    "part": "layers",
                    "liger": liger,
                    "recompute": recompute,
                    "ms_per_layer": ms / args.layers,
                    "gib_per_layer": gib / args.layers,  # the step's peak above the weights, a layer
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        if not liger:  # the LM head and loss, once: the plain recipe's against ours
            rows += head_rows(base.lm_head, labels, config.hidden_size, timed, device)
        del model, base, step
        torch.cuda.empty_cache()
    return rows


def layer_step(model, decoder, ids) -> None:
    """Forward and backward through the decoder layers (a loss on their last hidden state), gradients dropped."""
    hidden = decoder(input_ids=ids).last_hidden_state
    hidden.float().square().mean().backward()
    model.zero_grad(set_to_none=True)


def head_rows(head, labels, hidden_size: int, timed, device: str) -> list[dict]:
    """The LM head and loss of one sequence, forward and backward: the model's own cross-entropy on the full fp32
    logits (the plain recipe), and TRL's fused head on the labelled positions, with the metrics TRL's trainer asks for
    (ours) and with the log-probabilities alone."""
    import torch
    from trl.trainer import utils as trl_utils

    hidden = torch.randn(1, labels.shape[1], hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)

    def plain():
        logits = head(hidden).float()
        torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100).backward()

    def fused(outputs):
        def step():
            mask = labels[0, 1:] != -100
            per_token = trl_utils._ChunkedLogProbFunction.apply(
                hidden[0, :-1][mask],
                head.weight,
                head.bias,
                labels[0, 1:][mask],
                1.0,
                trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE,
                None,
                1.0,
                outputs,
            )
            (-per_token[0].sum() / mask.sum()).backward()

        return step

    rows = []
    for name, step in (
        ("model's cross-entropy", plain),
        ("TRL fused, with metrics", fused(("log_probs", "entropy", "is_top1"))),
        ("TRL fused, loss only", fused(("log_probs",))),
    ):
        ms, gib = timed(step)
        rows.append({"part": "head", "loss": name, "ms": ms, "gib": gib})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------- correctness
def correctness(args) -> dict:
    """1 GPU against `--gpus` GPUs from one seed; a killed multi-GPU run resumed; the adapter served."""
    from concur import models
    from concur.train import launch

    work = Path(args.workdir or tempfile.mkdtemp(prefix="concur-train-check-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = {"path": str(args.model), "dtype": "bfloat16"}
    lengths = dataset(
        models.load_tokenizer(spec), 64, args.min_tokens, args.max_tokens, args.seed, work / "rows.parquet"
    )
    steps = args.warmup + args.steps
    per_step = args.accumulation * args.gpus  # examples per optimizer step, the same in every run
    runs = {}
    for name, gpus in (("one", 1), ("many", args.gpus)):
        settings = settings_for(
            args,
            gpus,
            args.distributed,
            gradient_accumulation_steps=per_step // gpus,
            max_steps=steps,
            lora={"r": args.lora_r, "alpha": args.lora_r, "dropout": 0.0, "target_modules": PROJECTIONS},
            save_steps=max(1, steps // 4),
        )
        launch.run(
            str(work / "rows.parquet"), spec, settings, str(work / name), accelerate_configs=ROOT / "configs/accelerate"
        )
        runs[name] = [json.loads(line)["loss"] for line in (work / name / "train_log.jsonl").read_text().splitlines()]
        print(json.dumps({f"loss_{gpus}_gpu": runs[name]}), flush=True)
    # the multi-GPU job again (the same settings), killed once its first checkpoint is complete, then run to the end
    job = work / "resume.json"
    job.write_text(
        json.dumps(
            {"rows": str(work / "rows.parquet"), "spec": spec, "settings": settings, "out": str(work / "resumed")}
        )
    )
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "train-job", str(job)], start_new_session=True
    )
    checkpoints = work / ".resumed.checkpoints"
    while child.poll() is None and not any(checkpoints.glob("checkpoint-*/trainer_state.json")):
        time.sleep(0.5)
    killed_at = sorted(p.parent.name for p in checkpoints.glob("checkpoint-*/trainer_state.json"))
    finished_before_kill = child.poll() is not None
    if not finished_before_kill:  # torch's launcher starts its workers in sessions of their own: the whole tree
        procs.kill_tree(child.pid)
        child.wait()
    from concur.train.checkpoints import last_checkpoint

    resumed_from = last_checkpoint(checkpoints)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "train-job", str(job)], check=True)
    resumed = [json.loads(line)["loss"] for line in (work / "resumed" / "train_log.jsonl").read_text().splitlines()]
    served = serve_adapter(spec, work / "many", work)
    one, many = runs["one"], runs["many"]
    differences = [abs(a - b) / abs(a) for a, b in zip(one, many)]
    report = {
        "gpus": args.gpus,
        "distributed": args.distributed,
        "record_tokens": [min(lengths), max(lengths)],
        "loss_1_gpu": one,
        f"loss_{args.gpus}_gpus": many,
        "max_relative_difference": max(differences),
        "killed_after": killed_at,
        "finished_before_kill": finished_before_kill,
        "resumed_from": Path(resumed_from).name if resumed_from else None,
        "resumed_losses": resumed,
        "resumed_final_loss": resumed[-1],
        "uninterrupted_final_loss": many[-1],
        "served": served,
    }
    print(json.dumps(report, indent=1), flush=True)
    return report


def train_job(job_file: Path) -> None:
    from concur.train import launch

    job = json.loads(Path(job_file).read_text())
    launch.run(job["rows"], job["spec"], job["settings"], job["out"], accelerate_configs=ROOT / "configs/accelerate")


def serve_adapter(spec: dict, adapter: Path, work: Path) -> dict:
    """The eval_generate stage's function answering two tasks with the base model and the adapter."""
    import pandas as pd

    from concur import config
    from concur.synthesize import run_eval_generation

    tasks = work / "tasks.parquet"
    rows = [("relu", "torch.relu(x)"), ("add", "x + 1")]
    frame = pd.DataFrame(
        [
            {
                "task_id": f"check/{name}",
                "split": "eval",
                "suite": "check",
                "level": 1,
                "name": name,
                "code": _TASK.format(op=op),
                "category": "elementwise",
                "n_ops": 1,
                "origin": "check",
            }
            for name, op in rows
        ]
    )
    frame.to_parquet(tasks)
    settings = config.with_defaults(
        "evaluate", {"samples": 1, "max_new_tokens": 16, "gpus": 1, "base_generator": "base"}
    )
    out = work / "served.parquet"
    run_eval_generation(
        tasks_path=tasks,
        adapter_dir=str(adapter),
        model_name="check",
        generator_name="base",
        generator={"backend": "transformers", "model": "base"},
        model_specs={"base": spec},
        settings=settings,
        language="cuda",
        out_path=out,
    )
    answered = pd.read_parquet(out)
    return {"candidates": len(answered), "generator": sorted(set(answered["generator"]))}


_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {op}


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
"""


# --------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-model")
    build.add_argument("--arch", choices=sorted(ARCHS), default="qwen2.5-32b")
    build.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    build.add_argument("--out", required=True)
    sub.add_parser("peak")
    parts = sub.add_parser("layers")
    parts.add_argument("--arch", choices=sorted(ARCHS), default="qwen2.5-32b")
    parts.add_argument("--layers", type=int, default=4)
    parts.add_argument("--max-tokens", type=int, default=16384)
    parts.add_argument("--lora-r", type=int, default=32)
    parts.add_argument("--seed", type=int, default=0)
    parts.add_argument("--out", help="write the rows (JSON lines) here")
    for name in ("run", "correctness"):
        one = sub.add_parser(name)
        one.add_argument("--model", required=True)
        one.add_argument("--gpus", type=int, default=2)
        one.add_argument("--distributed", default="fsdp", choices=("ddp", "fsdp", "deepspeed_zero3"))
        one.add_argument("--recipe", default="ours", choices=("ours", "plain"))
        one.add_argument("--attn-implementation")
        one.add_argument("--checkpoint-layers", type=int, help="train.checkpoint_layers (ours): layers recomputed")
        one.add_argument("--liger", action="store_true", help="train.liger_kernels (ours)")
        one.add_argument("--records", type=int, default=0, help="default: enough for every step")
        one.add_argument("--min-tokens", type=int, default=8192)
        one.add_argument("--max-tokens", type=int, default=16384, help="also train.max_length")
        one.add_argument("--accumulation", type=int, default=2, help="micro-batches per step and process")
        one.add_argument("--warmup", type=int, default=1)
        one.add_argument("--steps", type=int, default=3)
        one.add_argument("--lora-r", type=int, default=32)
        one.add_argument("--seed", type=int, default=0)
        one.add_argument("--workdir")
        one.add_argument("--out", help="append the result (JSON) here")
    show = sub.add_parser("table")
    show.add_argument("results")
    show.add_argument("--peak-tflops", type=float)
    for hidden in ("plain-worker", "train-job"):
        sub.add_parser(hidden).add_argument("job")
    args = parser.parse_args(argv)

    if args.command == "build-model":
        started = time.perf_counter()
        build_model(args.arch, Path(args.tokenizer), Path(args.out))
        print(f"built {args.arch} in {args.out} in {time.perf_counter() - started:.0f} s", flush=True)
    elif args.command == "peak":
        rates = peak_tflops()
        print(json.dumps({"bf16_matmul_tflops": [round(r, 1) for r in rates]}), flush=True)
    elif args.command == "layers":
        rows = layers(args)
        if args.out:
            Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(layers_table(rows), flush=True)
    elif args.command == "run":
        result = measure(args)
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
    elif args.command == "correctness":
        report = correctness(args)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    elif args.command == "table":
        results = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
        print(table(results, args.peak_tflops))
    elif args.command == "plain-worker":
        plain_worker(Path(args.job))
    elif args.command == "train-job":
        train_job(Path(args.job))


if __name__ == "__main__":
    main()

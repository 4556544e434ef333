"""Build an offline tokenizer folder for Qwen2-family generators (Qwen2, Qwen2.5, QwQ-32B) from PyPI.

Hub downloads are not possible everywhere this project is validated, and reasoning lengths must be counted in the
generator's own tokens (the paper's 4,000 / 8,500 thresholds are QwQ tokens). Qwen's byte-level BPE ranks ship
inside the `dashscope` wheel on PyPI (`dashscope/resources/qwen.tiktoken`: 151,643 ranks, the vocabulary Qwen2 and
its successors up to Qwen3 share). This script turns them into a Hugging Face `tokenizer.json` (the merges recovered
from the ranks, Qwen2's pre-tokenizer pattern, NFC normalisation, Qwen2.5's added tokens with `<think>` = 151667 and
`</think>` = 151668), writes it to OUT_DIR, and checks a few token ids known from Qwen2's published vocabulary.

    pip download --no-deps dashscope==2.0.2 -d /tmp/pkgs
    python benchmarks/qwen_tokenizer.py /tmp/pkgs/dashscope-2.0.2-py3-none-any.whl OUT_DIR

OUT_DIR then serves as a `models` entry (`{path: OUT_DIR}`), named as a replay generator's `tokenizer`. On a
cluster, point the entry at the real model folder instead (`Qwen/QwQ-32B`): the script is for offline machines.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import zipfile
from pathlib import Path

RANKS_IN_WHEEL = "dashscope/resources/qwen.tiktoken"
# Qwen2's pre-tokenizer: contractions, letters with one leading non-letter, single digits, punctuation runs,
# newlines, other whitespace
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2.5 / QwQ added tokens, in id order from 151643
ADDED = (
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> <|box_end|> "
    "<|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|> "
    "<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> "
    "<tool_response> </tool_response> <think> </think>"
).split()
SPECIAL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # the rest are ordinary added tokens (not skipped)
# ids from Qwen2's published vocabulary
KNOWN = {"Hello world": [9707, 1879], "\n": [198], "\n\n": [271], "<think>": [151667], "</think>": [151668]}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of bytes to printable characters, which byte-level BPE vocabularies are written in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def read_ranks(wheel: Path) -> dict[bytes, int]:
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(RANKS_IN_WHEEL)
    ranks = {}
    for line in text.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that reproduces rank-ordered BPE: every split of a token into two known tokens of lower rank,
    ordered by the merged token's rank, then by the parts' ranks."""
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if ranks.get(left, rank) < rank and ranks.get(right, rank) < rank:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def build(ranks: dict[bytes, int]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    chars = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    first = len(ranks)
    for offset, name in enumerate(ADDED):
        assert tokenizer.get_vocab_size(with_added_tokens=True) == first + offset, name
        tokenizer.add_tokens([AddedToken(name, special=name in SPECIAL, normalized=False)])
    return tokenizer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the dashscope wheel (pip download --no-deps dashscope==2.0.2)")
    parser.add_argument("out", type=Path, help="folder to write tokenizer.json and tokenizer_config.json into")
    args = parser.parse_args(argv)
    tokenizer = build(read_ranks(args.wheel))
    for sample, ids in KNOWN.items():
        got = tokenizer.encode(sample).ids
        if got != ids:
            print(f"{sample!r}: {got}, Qwen2's vocabulary says {ids}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"{args.out}: {tokenizer.get_vocab_size(with_added_tokens=True)} tokens; known ids checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())

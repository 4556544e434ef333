import ast
import re

import pytest

from concur.prompts import LANGUAGES, build_prompt, example_answer

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
"""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_task_code_is_embedded_verbatim_as_the_last_block() -> None:
    for language in LANGUAGES:
        prompt = build_prompt(TASK, language)
        assert TASK in prompt
        assert python_blocks(prompt)[-1].strip() == TASK.strip()


def test_cuda_prompt_asks_for_cuda_and_shows_a_global_kernel() -> None:
    prompt = build_prompt(TASK, "cuda")
    assert "custom CUDA kernels" in prompt
    assert "__global__" in prompt and "cuda_sources=" in prompt
    assert "C++ CPU" not in prompt


def test_cpp_prompt_asks_for_cpu_cpp_and_shows_a_plain_loop() -> None:
    prompt = build_prompt(TASK, "cpp")
    assert "custom C++ CPU kernels" in prompt
    assert "for (int64_t i = 0; i < a.numel(); ++i) pc[i] = pa[i] + pb[i];" in prompt
    assert "__global__" not in prompt and "cuda_sources=" not in prompt


def test_prompt_states_the_contract() -> None:
    prompt = build_prompt(TASK, "cpp")
    for phrase in ("ModelNew", "load_inline", "__init__", "<think>", "one ```python block"):
        assert phrase in prompt


@pytest.mark.parametrize("language", LANGUAGES)
def test_example_answer_is_valid_python_defining_model_new(language: str) -> None:
    tree = ast.parse(example_answer(language))
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert classes == ["ModelNew"]
    assert example_answer(language) in build_prompt(TASK, language)


def test_prompt_without_task_is_compact() -> None:
    # Measured with the SmolLM2 tokenizer: cpp 311 tokens (924 chars), cuda 398 tokens (1198 chars).
    for language in LANGUAGES:
        assert len(build_prompt("", language)) < 1250


@pytest.mark.parametrize("language", ["CUDA", "triton", ""])
def test_unknown_language_is_rejected(language: str) -> None:
    with pytest.raises(ValueError, match="prompt language .* is unknown; expected one of cuda, cpp"):
        build_prompt(TASK, language)

"""The user message that asks a model to rewrite a PyTorch task with custom kernels (our own wording)."""

LANGUAGES = ("cuda", "cpp")

_TEMPLATE = """Rewrite the PyTorch `Model` below as `ModelNew`: same `__init__` signature and parameters, same \
forward inputs and outputs, with some or all operators replaced by {kernel_kind} built with \
torch.utils.cpp_extension.load_inline ({language_rule}). Think it through inside <think>...</think>, then give the \
whole program in a single ```python block.

Example: for a `Model` whose forward(a, b) returns a + b, an answer is
```python
{example}
```

Task:
```python
{task_code}
```
"""

_KERNEL_KIND = {
    "cuda": "custom CUDA kernels",
    "cpp": "custom C++ CPU kernels",
}

_LANGUAGE_RULE = {
    "cuda": "`__global__` kernels and their launchers in cuda_sources, launcher declarations in cpp_sources",
    "cpp": "cpp_sources only, no CUDA; functions=[...] makes the bindings",
}

_HEADER = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"

_MODEL_NEW = '''
class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a.contiguous(), b.contiguous())'''

_KERNELS = {
    "cuda": '''
src = """
__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}"""
ext = load_inline("add_cuda", cpp_sources="torch::Tensor add(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=src, functions=["add"])
''',
    "cpp": '''
src = """
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>(), *po = out.data_ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
    return out;
}"""
ext = load_inline("add_cpp", cpp_sources=src, functions=["add"])
''',
}


def example_answer(language: str) -> str:
    """The one-shot example's `ModelNew` program (elementwise add) for `language`."""
    _check_language(language)
    return _HEADER + _KERNELS[language] + _MODEL_NEW


def build_prompt(task_code: str, language: str) -> str:
    """The user message asking for a `ModelNew` of `task_code` with kernels in `language` ("cuda" or "cpp")."""
    _check_language(language)
    return _TEMPLATE.format(
        kernel_kind=_KERNEL_KIND[language],
        language_rule=_LANGUAGE_RULE[language],
        example=example_answer(language),
        task_code=task_code.strip("\n"),
    )


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"prompt language {language!r} is unknown; expected one of {', '.join(LANGUAGES)}")

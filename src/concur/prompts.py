"""The user message that asks a model to rewrite a PyTorch task with custom kernels (our own wording)."""

LANGUAGES = ("cuda", "cpp")

_TEMPLATE = """Rewrite the PyTorch `Model` below as `ModelNew` (same `__init__` arguments, parameters, inputs and \
outputs), replacing some or all operators with {kernel_kind} built by torch.utils.cpp_extension.load_inline \
({language_rule}). Reason inside <think>...</think>, then give the full program in one ```python block.

Example, for forward(a, b) returning a + b:
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
    "cuda": "`__global__` kernels and launchers in cuda_sources, declarations in cpp_sources",
    "cpp": "cpp_sources only, no CUDA",
}

_HEADER = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"

_MODEL_NEW = """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a, b)"""

_KERNELS = {
    "cuda": '''
src = """
__global__ void add_kernel(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}"""
ext = load_inline("add_cuda", cpp_sources="torch::Tensor add(torch::Tensor, torch::Tensor);",
                  cuda_sources=src, functions=["add"])
''',
    "cpp": '''
src = """
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>(), *pc = c.data_ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) pc[i] = pa[i] + pb[i];
    return c;
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

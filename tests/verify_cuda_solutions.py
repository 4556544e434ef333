"""CUDA candidates for the GPU tests and the verifier benchmark, written as a model would write them.

Each variant changes one thing of an honest fused relu(x + y) * scale kernel: its body, its launch, or the host
code around it. `solution(variant)` returns the full program (ModelNew + load_inline) for that variant.
"""

CUDA_TEMPLATE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>

__global__ void relu_add_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                                float scale, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
        BODY
    }
}

torch::Tensor relu_add(torch::Tensor x, torch::Tensor y, double scale) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && y.is_contiguous(), "relu_add: contiguous CUDA tensors");
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    HOST
    return out;
}
"""

HONEST_BODY = "out[i] = fmaxf(x[i] + y[i], 0.f) * scale;"
LAUNCH = """relu_add_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                                out.data_ptr<float>(), (float)scale, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();"""

VARIANTS = {
    "fast": {},
    # one warp for 16M elements: correct and much slower than eager
    "slow": {"HOST": LAUNCH.replace("(unsigned)((n + 255) / 256), 256", "1, 32")},
    "wrong": {"BODY": "out[i] = (x[i] + y[i]) * scale;"},
    "compile_error": {"BODY": "out[i] = undeclared_value;"},
    "illegal_access": {"BODY": "out[i * 4096 + 100000000] = 1.f;"},
    # clock64() is an asm volatile read the compiler cannot hoist: the loop never ends
    "hang": {"BODY": "long long t0 = clock64(); while (clock64() - t0 >= 0) {} out[i] = 0.f;"},
    # allocates the output and launches nothing: the reference's freed result is what it returns
    "stale_output": {"HOST": "/* no launch */"},
    # repeats its work 20 times on a private stream the caller never waits for: a timer that records events on
    # the current stream only sees the launch
    "side_stream": {"HOST": """cudaStream_t side;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    for (int r = 0; r < 20; ++r) {
        relu_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, side>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                                       out.data_ptr<float>(), (float)scale, n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();"""},
    # the extension only calls ATen: its own kernel never runs
    "aten_wrapper": {"HOST": "out = at::relu(x + y) * scale;"},
}

PYTHON_TEMPLATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""{cuda}"""

ext = load_inline(
    name="relu_add_{name}",
    cpp_sources="torch::Tensor relu_add(torch::Tensor x, torch::Tensor y, double scale);",
    cuda_sources=CUDA_SOURCE,
    functions=["relu_add"],
    extra_cuda_cflags=["-O3"],
)
{extra}

class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ext.relu_add(x, y, self.scale)
'''

# replaces the timer's method through the type, out of the static screen's sight
TAMPER = '\ntype.__setattr__(torch.cuda.Event, "elapsed_time", lambda self, end: 1e-3)\n'

GEMM_BIAS_RELU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>

__global__ void bias_relu_kernel(float* __restrict__ h, const float* __restrict__ bias, int64_t rows, int64_t cols) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        h[i] = fmaxf(h[i] + bias[i % cols], 0.f);
    }
}

torch::Tensor bias_relu_(torch::Tensor h, torch::Tensor bias) {
    int64_t rows = h.size(0), cols = h.size(1);
    bias_relu_kernel<<<(unsigned)((rows * cols + 255) / 256), 256>>>(h.data_ptr<float>(), bias.data_ptr<float>(),
                                                                     rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return h;
}
"""

ext = load_inline(
    name="bias_relu{tag}",
    cpp_sources="torch::Tensor bias_relu_(torch::Tensor h, torch::Tensor bias);",
    cuda_sources=CUDA_SOURCE,
    functions=["bias_relu_"],
)


class ModelNew(nn.Module):
    """The GEMM stays in cuBLAS; bias and relu are fused into one kernel on its output."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.matmul(x, self.linear.weight.t())
        return ext.bias_relu_(h, self.linear.bias)
'''


def solution(variant: str, tag: str = "") -> str:
    """The program for one variant of the relu_add kernel (`tamper`: the honest kernel plus a patched timer).

    `tag` changes the extension's name, so the same variant can be built again (the benchmark's cold builds)."""
    if variant == "gemm_bias_relu":
        return GEMM_BIAS_RELU.replace("{tag}", tag)
    parts = {"BODY": HONEST_BODY, "HOST": LAUNCH, **VARIANTS.get(variant, {})}
    cuda = CUDA_TEMPLATE.replace("BODY", parts["BODY"]).replace("HOST", parts["HOST"])
    extra = TAMPER if variant == "tamper" else ""
    return PYTHON_TEMPLATE.format(cuda=cuda, name=f"{variant}{tag}", extra=extra)

import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix product, scaled by a constant, plus a learned bias per output column."""

    def __init__(self, scale: float, n: int):
        super().__init__()
        self.scale = scale
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b) * self.scale + self.bias


m = 32
k = 64
n = 48
scale = 0.5


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, n)]


def get_init_inputs():
    return [scale, n]

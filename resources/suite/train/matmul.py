import torch
import torch.nn as nn


class Model(nn.Module):
    """Small dense matrix product: (m, k) @ (k, n) -> (m, n)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


m = 16
k = 64
n = 32


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, n)]


def get_init_inputs():
    return []

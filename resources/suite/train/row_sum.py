import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over the last dimension: (batch, dim) -> (batch,)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)


batch = 32
dim = 256


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean over one dimension, chosen at construction."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=self.dim)


batch = 16
rows = 128
cols = 64
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch, rows, cols)]


def get_init_inputs():
    return [reduce_dim]

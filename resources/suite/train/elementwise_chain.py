import torch
import torch.nn as nn


class Model(nn.Module):
    """A long chain of cheap elementwise operations on a small tensor (20 operator calls)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        y = y + 0.25
        y = torch.abs(y)
        y = y - 0.5
        y = torch.relu(y)
        y = y * y
        y = y + x
        y = torch.clamp(y, -1.0, 2.0)
        y = y * 0.75
        y = torch.maximum(y, x)
        y = y - 0.125
        y = torch.neg(y)
        y = y + 1.0
        y = torch.square(y)
        y = torch.minimum(y, torch.abs(x))
        y = y * 3.0
        y = y - x
        y = torch.abs(y)
        y = y + 0.5
        return y


batch = 32
dim = 64


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Swish activation (x * sigmoid(x)) summed over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * torch.sigmoid(x)).sum(dim=-1)


batch = 16
dim = 128


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []

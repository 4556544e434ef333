import torch
import torch.nn as nn


class Model(nn.Module):
    """Add two tensors, then multiply the sum by a third one."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (x + y) * z


batch = 64
dim = 256


def get_inputs():
    return [torch.randn(batch, dim), torch.randn(batch, dim), torch.randn(batch, dim)]


def get_init_inputs():
    return []

import torch
import torch.nn as nn


class Model(nn.Module):
    """Difference of two tensors, exponentiated, summed over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sum(torch.exp(x - y), dim=-1)


batch = 32
features = 128


def get_inputs():
    return [torch.rand(batch, features), torch.rand(batch, features)]


def get_init_inputs():
    return []

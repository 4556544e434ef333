import torch
import torch.nn as nn


class Model(nn.Module):
    """Hyperbolic tangent applied elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


batch = 16
features = 512


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return []

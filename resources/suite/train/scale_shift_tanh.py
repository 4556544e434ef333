import torch
import torch.nn as nn


class Model(nn.Module):
    """Affine rescaling by constant scale and shift, then tanh."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale + self.shift)


batch = 32
dim = 256
scale = 1.5
shift = -0.25


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [scale, shift]

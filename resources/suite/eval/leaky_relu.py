import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Leaky ReLU with a configurable slope for negative inputs."""

    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


batch = 64
features = 1024
slope = 0.05


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [slope]

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, GELU, then a residual connection back to the input."""

    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.linear(x))


batch = 16
features = 64


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [features]

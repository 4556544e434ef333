import torch
import torch.nn as nn


class Model(nn.Module):
    """Two-layer perceptron: Linear, ReLU, Linear."""

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


batch = 16
in_features = 64
hidden = 128
out_features = 32


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]

import torch
import torch.nn as nn


class Model(nn.Module):
    """Clamp to [lo, hi], square, then average over the last dimension."""

    def __init__(self, lo: float, hi: float):
        super().__init__()
        self.lo = lo
        self.hi = hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        clamped = torch.clamp(x, self.lo, self.hi)
        return (clamped ** 2).mean(dim=-1)


batch = 64
dim = 256
lo = -0.5
hi = 0.75


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [lo, hi]

"""Every built-in suite program (resources/suite/{train,eval}/*.py) must build and run deterministically."""

from pathlib import Path

import pytest
import torch

from concur.tasks import REQUIRED_NAMES
from conftest import ROOT

SUITE = ROOT / "resources" / "suite"
PROGRAMS = sorted(SUITE.glob("train/*.py")) + sorted(SUITE.glob("eval/*.py"))
SEED = 42

# Output shapes worked out by hand from each eval program's module-level sizes.
EVAL_OUTPUT_SHAPES = {
    "tanh": (16, 512),
    "row_max": (32,),
    "mean_dim": (16, 64),
    "leaky_relu": (64, 1024),
    "matmul_scale_add": (32, 48),
    "sub_exp_sum": (32,),
    "gelu_residual": (16, 64),
    "tiny_mlp": (16, 32),
}


def load_program(path: Path) -> dict:
    namespace: dict = {"__name__": f"suite_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def run_seeded(namespace: dict) -> torch.Tensor:
    torch.manual_seed(SEED)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    with torch.no_grad():
        return model(*inputs)


def program_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", PROGRAMS, ids=[program_id(p) for p in PROGRAMS])
def test_program_runs_and_is_deterministic(path: Path) -> None:
    namespace = load_program(path)
    missing = [name for name in REQUIRED_NAMES if name not in namespace]
    assert not missing, f"{program_id(path)} does not define {missing}"

    first = run_seeded(namespace)
    assert isinstance(first, torch.Tensor), f"{program_id(path)} forward returned {type(first).__name__}"
    assert torch.isfinite(first).all(), f"{program_id(path)} output has NaN/inf"

    second = run_seeded(load_program(path))
    assert torch.equal(first, second), f"{program_id(path)} is not reproducible under a fixed seed"


def test_eval_suite_has_the_expected_tasks() -> None:
    names = {p.stem for p in SUITE.glob("eval/*.py")}
    assert names == set(EVAL_OUTPUT_SHAPES)


@pytest.mark.parametrize("name", sorted(EVAL_OUTPUT_SHAPES))
def test_eval_output_shape(name: str) -> None:
    output = run_seeded(load_program(SUITE / "eval" / f"{name}.py"))
    assert tuple(output.shape) == EVAL_OUTPUT_SHAPES[name]
    assert output.dtype == torch.float32


def test_eval_values_match_hand_computed_formulas() -> None:
    leaky = load_program(SUITE / "eval" / "leaky_relu.py")["Model"](0.05)
    assert leaky(torch.tensor([-2.0, 0.0, 3.0])).tolist() == pytest.approx([-0.1, 0.0, 3.0])

    row_max = load_program(SUITE / "eval" / "row_max.py")["Model"]()
    assert row_max(torch.tensor([[1.0, 5.0, -2.0], [-3.0, -1.0, -4.0]])).tolist() == [5.0, -1.0]

    sub_exp_sum = load_program(SUITE / "eval" / "sub_exp_sum.py")["Model"]()
    x = torch.tensor([[1.0, 2.0]])
    assert sub_exp_sum(x, x).tolist() == [2.0]  # exp(0) + exp(0)

    mean_dim = load_program(SUITE / "eval" / "mean_dim.py")["Model"](1)
    assert mean_dim(torch.tensor([[[1.0, 2.0], [3.0, 6.0]]])).tolist() == [[2.0, 4.0]]

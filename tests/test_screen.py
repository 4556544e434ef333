"""Static screen rules on small source snippets (no compilation)."""

import textwrap

import pytest

from concur.verify.screen import screen

HEADER = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="ext", cpp_sources=["..."], functions=["fused"])
"""


def program(forward_body: str, extra: str = "", bases: str = "nn.Module", init_body: str = "pass") -> str:
    cls = f"""
class ModelNew({bases}):
    def __init__(self):
        super().__init__()
        {init_body}

    def forward(self, x, y):
{textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)}
"""
    return HEADER + textwrap.dedent(extra) + cls


def rules(source: str) -> list[str]:
    return [f.rule for f in screen(source)]


# ---------------------------------------------------------------- honest programs pass


@pytest.mark.parametrize(
    "body",
    [
        "return ext.fused(x, y)",
        # keeping the matmul in torch and fusing the rest into the kernel is legitimate
        "h = torch.matmul(x, y)\nreturn ext.fused(h, y)",
        # torch ops applied to the kernel's result still depend on the kernel
        "out = ext.fused(x.contiguous(), y)\nreturn out.view(-1) + 1",
        # out-parameter kernel writing into a buffer it is handed
        "out = torch.empty_like(x)\next.fused(x, y, out)\nreturn out",
        "a, b = ext.fused(x, y)\nreturn torch.cat([a, b])",
        "return torch.ops.myops.fused(x, y)",
    ],
)
def test_kernel_result_returned_passes(body):
    assert rules(program(body)) == []


def test_kernel_reached_through_helpers_passes():
    extra = """
    def launch(a, b):
        return ext.fused(a, b)

    class FusedFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return ext.fused(a, b)

    class Block(nn.Module):
        def forward(self, a):
            return launch(a, a)
    """
    assert rules(program("return launch(x, y)", extra)) == []
    assert rules(program("return FusedFn.apply(x, y)", extra)) == []
    assert rules(program("return self.block(x)", extra, init_body="self.block = Block()")) == []
    assert rules(program("return self.kernel(x, y)", init_body="self.kernel = ext.fused")) == []


def test_extension_built_in_init_passes():
    source = (
        HEADER.replace("ext = load_inline", "_unused = load_inline")
        + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.mod = load_inline(name="m", cpp_sources=["..."], functions=["f"])

    def forward(self, x):
        return self._run(x) * 2

    def _run(self, x):
        return self.mod.f(x)
"""
    )
    assert rules(source) == []


# ---------------------------------------------------------------- each rule


def test_no_custom_kernel():
    source = (
        "import json\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return json.load(x)\n"
    )
    assert rules(source) == ["no_custom_kernel"]


def test_cpp_extension_load_counts_as_custom_kernel():
    source = program("return ext.fused(x, y)").replace("ext = load_inline(", "ext = torch.utils.cpp_extension.load(")
    assert rules(source) == []


@pytest.mark.parametrize(
    "body",
    [
        "return torch.relu(x + y)",  # never calls the extension
        "_ = ext.fused(x, y)\nreturn torch.relu(x + y)",  # calls it, returns a torch-computed value
        "ext.fused(x, y)\nreturn x * 2",  # forward's own inputs handed to the kernel do not count as its output
    ],
)
def test_kernel_unused(body):
    assert rules(program(body)) == ["kernel_unused"]


def test_try_fallback_in_forward_and_in_called_helper():
    in_forward = "try:\n    return ext.fused(x, y)\nexcept RuntimeError:\n    return torch.relu(x + y)"
    assert rules(program(in_forward)) == ["try_fallback"]
    extra = """
    def safe(a, b):
        try:
            return ext.fused(a, b)
        except Exception:
            return a + b
    """
    assert rules(program("return safe(x, y)", extra)) == ["try_fallback"]


def test_subclasses_model_directly_and_through_a_base():
    extra = "class Model(nn.Module):\n    pass\n\nclass Middle(Model):\n    pass\n"
    assert rules(program("return ext.fused(x, y)", extra, bases="Model")) == ["subclasses_model"]
    assert rules(program("return ext.fused(x, y)", extra, bases="Middle")) == ["subclasses_model"]


@pytest.mark.parametrize(
    "extra, name",
    [
        ("import threading\n", "threading"),
        ("import multiprocessing.pool\n", "multiprocessing"),
        ("from ctypes import CDLL\n", "ctypes"),
        ("import inspect as ins\n", "inspect"),
        ("gc = __import__('gc')\n", "gc"),
        ("from concurrent.futures import ThreadPoolExecutor\n", "concurrent"),
        ("import sys\nframe = sys._getframe(1)\n", "sys._getframe"),
    ],
)
def test_forbidden_module(extra, name):
    assert rules(program("return ext.fused(x, y)", extra)) == [f"forbidden_module:{name}"]


@pytest.mark.parametrize(
    "extra",
    ["import os\nos._exit(0)\n", "import sys\nsys.exit(1)\n", "exit()\n", "from os import _exit as bye\nbye(0)\n"],
)
def test_process_exit(extra):
    assert rules(program("return ext.fused(x, y)", extra)) == ["process_exit"]


@pytest.mark.parametrize("extra", ["exec('x = 1')\n", "y = eval('1 + 1')\n", "code = compile('1', 'f', 'eval')\n"])
def test_dynamic_code(extra):
    assert rules(program("return ext.fused(x, y)", extra)) == ["dynamic_code"]


def test_similar_names_are_not_flagged():
    extra = "import re\npattern = re.compile('a+')\nfast = torch.compile\n"
    assert rules(program("return ext.fused(x, y)", extra)) == []


def test_findings_ordered_most_telling_first():
    source = program("import os\nos._exit(0)\nreturn torch.relu(x)", "import threading\n")
    assert rules(source) == ["kernel_unused", "forbidden_module:threading", "process_exit"]
    assert screen(source)[0].line == source.splitlines().index("    def forward(self, x, y):") + 1


def test_unparsable_source_has_no_findings():
    assert screen("def broken(:\n") == []


# ---------------------------------------------------------------- processes, streams, patching the harness


@pytest.mark.parametrize(
    ("extra", "body", "rule"),
    [
        ("import os\n", "os.fork()\nreturn ext.fused(x, y)", "process_spawn"),
        ("import os\n", "os.system('true')\nreturn ext.fused(x, y)", "process_spawn"),
        ("import os\n", "os.execv('/bin/true', ['true'])\nreturn ext.fused(x, y)", "process_spawn"),
        ("import subprocess\n", "return ext.fused(x, y)", "forbidden_module:subprocess"),
        (
            "",
            "s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    out = ext.fused(x, y)\nreturn out",
            "side_stream",
        ),
        ("", "torch.allclose = lambda *a, **k: True\nreturn ext.fused(x, y)", "monkeypatch"),
        ("import time\n", "setattr(time, 'perf_counter', lambda: 0.0)\nreturn ext.fused(x, y)", "monkeypatch"),
        ("", "torch.cuda.Event.elapsed_time = lambda self, other: 0.001\nreturn ext.fused(x, y)", "monkeypatch"),
    ],
)
def test_processes_streams_and_patches_are_flagged(extra, body, rule):
    assert rule in rules(program(body, extra=extra))


def test_own_attributes_are_not_monkeypatching():
    assert rules(program("self.scale = 2.0\nreturn ext.fused(x, y)")) == []


def test_forward_inherited_from_a_copy_of_the_reference_is_checked():
    source = HEADER + textwrap.dedent("""
    class ScaledSoftmax(nn.Module):
        def forward(self, x, y):
            return torch.softmax(x * y, dim=-1)

    class ModelNew(ScaledSoftmax):
        def __init__(self):
            super().__init__()
    """)
    assert "kernel_unused" in rules(source)

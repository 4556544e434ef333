"""Extensions a candidate loads in `ModelNew.__init__` (directly, in a helper, or with `load` of a file it wrote) are
built in the compile step, on the task's init inputs, and judged like any other; the verify step still builds
nothing. The compile step makes ModelNew on meta tensors and never runs its extensions there.

Compiles: one small CPU extension per candidate below (each program is its own cache entry); the GPU test one CUDA
extension.
"""

import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from verify_frames import tasks_frame

from concur import contracts
from concur.verify import build, compile_frame, verify_frame

FIXTURES = Path(__file__).parent / "fixtures" / "verify"
REFERENCE = (FIXTURES / "task_relu_add.py").read_text()

CPP = r"""
#include <torch/extension.h>
torch::Tensor relu_add(torch::Tensor x, torch::Tensor y, double scale) {
    auto a = x.contiguous();
    auto b = y.contiguous();
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t i = 0; i < a.numel(); ++i) {
        float s = pa[i] + pb[i];
        po[i] = (s > 0.0f ? s : 0.0f) * static_cast<float>(scale);
    }
    return out;
}
"""
BINDING = 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu_add", &relu_add); }\n'
HEAD = f"""import os
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load, load_inline

CPP = r'''{CPP}'''
"""
FORWARD = """
    def forward(self, x, y):
        return self.ext.relu_add(x, y, self.scale)
"""


def candidates_frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """(candidate_id, task_id, code) rows as a candidates table, every other column of the contract blank."""
    blank = {"str": "", "int": 0, "float": 0.0, "bool": False}
    fields = {column: blank.get(kind, "") for column, kind in contracts.CANDIDATES.items()}
    frame = pd.DataFrame([{**fields, "candidate_id": c, "task_id": t, "code": code} for c, t, code in rows])
    return contracts.conform(frame, contracts.CANDIDATES, "candidates")


def program(init_body: str, before: str = "", forward: str = FORWARD) -> str:
    """A candidate whose ModelNew(scale) runs `init_body` (which sets self.ext) in its __init__."""
    body = textwrap.indent(textwrap.dedent(init_body).strip(), " " * 8)
    cls = "\n\nclass ModelNew(nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n" + (
        f"        self.scale = scale\n{body}\n{forward}"
    )
    return HEAD + textwrap.dedent(before) + cls


CANDIDATES = {
    # load_inline called by __init__ itself
    "in_init": program('self.ext = load_inline(name="ext_in_init", cpp_sources=[CPP], functions=["relu_add"])'),
    # a helper called by __init__, caching the module in a global, and __init__ calling the extension once (not
    # run in the compile step, where the model holds meta tensors)
    "helper": program(
        """
        self.ext = extension()
        self.probe = self.ext.relu_add(torch.zeros(4), torch.ones(4), 1.0)
        """,
        before="""
        _EXT = None

        def extension():
            global _EXT
            if _EXT is None:
                _EXT = load_inline(name="ext_helper", cpp_sources=[CPP], functions=["relu_add"])
            return _EXT
        """,
    ),
    # a source file written by __init__ in its working folder, built with `load`
    "load_file": program(
        f"""
        path = os.path.join(os.getcwd(), "ext_file.cpp")
        with open(path, "w") as f:
            f.write(CPP + {BINDING!r})
        self.ext = load(name="ext_file", sources=[path])
        """
    ),
    # raises after its build: the build stands, the verify step reports the error
    "raises_after": program(
        """
        self.ext = load_inline(name="ext_raises", cpp_sources=[CPP], functions=["relu_add"])
        raise ValueError("after the build")
        """
    ),
    # reads a tensor's value before its build: fails on meta tensors, made again on the CPU
    "reads_values": program(
        """
        self.weight = nn.Parameter(torch.ones(3))
        if float(self.weight.sum().item()) == 3.0:
            self.ext = load_inline(name="ext_values", cpp_sources=[CPP], functions=["relu_add"])
        """
    ),
    # native code that would crash on meta tensors (an abort) after its build: the build is kept
    "crashes_on_meta": program(
        """
        self.ext = load_inline(name="ext_crash", cpp_sources=[CPP], functions=["relu_add"])
        if torch.empty(1).device.type == "meta":
            os.abort()
        """
    ),
    # no load call anywhere: nothing to build
    "no_load": program("self.ext = None", forward="\n    def forward(self, x, y):\n"
                       "        return torch.relu(x + y) * self.scale\n"),
    # builds a second extension only where its model is not on meta tensors (the contestant), never in compile
    "second_elsewhere": program(
        """
        self.ext = load_inline(name="ext_first", cpp_sources=[CPP], functions=["relu_add"])
        if torch.empty(1).device.type != "meta":
            self.ext = load_inline(name="ext_second", cpp_sources=[CPP + "// other"], functions=["relu_add"])
        """
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> dict:
    return {
        "device": "cpu",
        "mode": "kernelbench",
        "timeout_s": 600,
        "workers": 2,
        "correctness_trials": 2,
        "warmup": 1,
        "timing_trials": 3,
        "build_cache": str(tmp_path_factory.mktemp("build-cache")),
    }


@pytest.fixture(scope="module")
def judged(settings, tmp_path_factory) -> dict:
    candidates = candidates_frame([(name, "relu_add", code) for name, code in CANDIDATES.items()])
    tasks = tasks_frame([("relu_add", REFERENCE)])
    builds = compile_frame(candidates, settings, tmp_path_factory.mktemp("compile"), False, tasks=tasks)
    verdicts = verify_frame(candidates, tasks, settings, tmp_path_factory.mktemp("verify"), False, builds=builds)
    in_init = candidates[candidates["candidate_id"] == "in_init"]
    hardened = verify_frame(
        in_init, tasks, {**settings, "mode": "hardened"}, tmp_path_factory.mktemp("hardened"), False, builds=builds
    )
    return {
        "builds": builds.set_index("candidate_id"),
        "verdicts": verdicts.set_index("candidate_id"),
        "hardened": hardened.set_index("candidate_id"),
    }


def entry(settings: dict, builds: pd.DataFrame, name: str) -> Path:
    return Path(settings["build_cache"]) / builds.loc[name, "cache_key"]


@pytest.mark.parametrize("name", ["in_init", "helper", "load_file"])
def test_extensions_loaded_in_init_are_built_in_compile_and_judged(judged, name):
    build_row, verdict = judged["builds"].loc[name], judged["verdicts"].loc[name]
    assert build_row.status == "built", build_row.reason
    assert (verdict.status, verdict.reason, verdict.correct) == ("correct", "", True)


def test_an_extension_loaded_in_init_passes_the_hardened_checks(judged):
    verdict = judged["hardened"].loc["in_init"]
    assert (verdict.status, verdict.reason) == ("correct", "")  # its calls are counted (check:kernel_not_called)


def test_an_extension_call_in_init_is_not_run_in_compile(judged):
    # the helper's __init__ calls its extension: blocked on meta tensors, which is no fault of the build
    assert judged["builds"].loc["helper", "reason"].startswith("init: ModelNew(*init): ExtensionCallBlocked")


def test_an_init_that_raises_after_its_build_still_builds(judged):
    build_row, verdict = judged["builds"].loc["raises_after"], judged["verdicts"].loc["raises_after"]
    assert (build_row.status, build_row.reason) == (
        "built",
        "init: ModelNew(*init): ValueError: after the build",
    )
    assert (verdict.status, verdict.reason) == ("runtime_error", "ModelNew(*init): ValueError: after the build")


def test_an_init_that_needs_real_values_is_made_again_on_the_cpu(judged):
    assert judged["builds"].loc["reads_values", "status"] == "built"
    assert judged["verdicts"].loc["reads_values", "status"] == "correct"


def test_a_crash_in_init_after_its_build_keeps_the_build(judged):
    build_row = judged["builds"].loc["crashes_on_meta"]
    assert build_row.status == "built"
    assert build_row.reason.startswith("init: ModelNew(*init): killed by SIGABRT")
    assert judged["verdicts"].loc["crashes_on_meta", "status"] == "correct"


def test_no_load_call_at_import_or_in_init_is_no_build(judged):
    build_row = judged["builds"].loc["no_load"]
    assert (build_row.status, build_row.reason) == ("no_build", "no load_inline/load call")
    assert judged["verdicts"].loc["no_load", "status"] == "correct"  # kernelbench mode: pure PyTorch passes


def test_an_extension_built_only_outside_compile_is_never_built(judged, settings):
    build_row, verdict = judged["builds"].loc["second_elsewhere"], judged["verdicts"].loc["second_elsewhere"]
    assert build_row.status == "built"
    assert verdict.status == "runtime_error"
    assert verdict.reason == "ModelNew(*init): RuntimeError: extension ext_second was not built in the compile step"
    folder = entry(settings, judged["builds"], "second_elsewhere")
    assert (folder / "ext_first" / build.BUILT_MARKER).exists()
    assert not (folder / "ext_second" / "ext_second.so").exists()  # the verify step built nothing


def test_the_reference_is_part_of_the_cache_key(judged, settings, tmp_path):
    other = REFERENCE.replace("return [0.5]", "return [2.0]")
    candidates = candidates_frame([("in_init", "other", CANDIDATES["in_init"])])
    builds = compile_frame(candidates, settings, tmp_path, False, tasks=tasks_frame([("other", other)]))
    assert builds.loc[0, "cache_key"] != judged["builds"].loc["in_init", "cache_key"]


def test_a_task_missing_from_the_tasks_frame_is_an_error(settings, tmp_path):
    candidates = candidates_frame([("c", "absent", CANDIDATES["no_load"])])
    with pytest.raises(ValueError, match="not in the tasks frame"):
        compile_frame(candidates, settings, tmp_path, False, tasks=tasks_frame([("relu_add", REFERENCE)]))


def test_models_are_made_on_meta_tensors_whatever_device_they_name(tmp_path):
    class Huge(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.a = torch.nn.Linear(n, n)  # 40 GB of float32 on a real device
            self.b = torch.nn.Parameter(torch.randn(n, n, device="cuda"))
            self.c = torch.nn.Parameter(torch.ones(n).cuda())
            self.d = torch.zeros(3).to("cuda", torch.float16)
            self.to(torch.device("cuda"))
            assert {p.device.type for p in self.parameters()} == {"meta"}
            assert (self.d.device.type, self.d.dtype) == ("meta", torch.float16)

    loader = build.ExtensionLoader(str(tmp_path), allow_build=False, blockable=True)
    assert build.make_model(Huge, [100_000], loader) is None
    assert loader.blocked is None


def _extension():
    """A stand-in for a built extension: a module whose exported functions are builtins, as pybind11's are."""
    import types

    module = types.ModuleType("ext")
    module.relu = torch.relu
    return module


def test_a_contestant_counts_extension_calls_without_a_python_frame(tmp_path):
    import sys

    loader = build.ExtensionLoader(str(tmp_path), allow_build=False)
    ext = loader._counting(_extension())

    class Held(torch.nn.Module):  # the function kept on the class: called through an instance, it is not bound
        relu = ext.relu

        def forward(self, x):
            return self.relu(x) + ext.relu(x)

    x, held, seen = torch.tensor([-1.0, 2.0]), Held(), []
    sys.setprofile(lambda frame, event, arg: seen.append((event, frame.f_code.co_name)))
    try:
        out = held(x)
    finally:
        sys.setprofile(None)
    assert out.tolist() == [0.0, 4.0]
    assert loader.kernel_calls == 2
    # the honest kernel's calls cost no more than the extension's own: no Python frame between forward and relu
    module_call = {"_wrapped_call_impl", "_call_impl"}
    assert [name for event, name in seen if event == "call" and name not in module_call] == ["forward"]
    ext.relu.__wrapped__.cache_clear()  # a candidate that resets the counter reads as fewer calls, never more
    assert loader.kernel_calls == 0


def test_the_compile_steps_loader_blocks_extension_calls(tmp_path):
    loader = build.ExtensionLoader(str(tmp_path), allow_build=True, blockable=True)
    ext = loader._counting(_extension())
    assert ext.relu(torch.tensor([-1.0])).tolist() == [0.0] and loader.kernel_calls == 1
    loader.blocked = "not here"
    with pytest.raises(build.ExtensionCallBlocked, match="relu: not here"):
        ext.relu(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="blockable"):
        build.make_model(torch.nn.Identity, [], build.ExtensionLoader(str(tmp_path), allow_build=False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_extension_loaded_in_init_is_correct_on_the_gpu(tmp_path):
    from verify_cuda_solutions import CUDA_TEMPLATE, HONEST_BODY, LAUNCH

    cuda = CUDA_TEMPLATE.replace("PRELUDE", "").replace("BODY", HONEST_BODY).replace("HOST", LAUNCH)
    code = (
        HEAD
        + f'\nCUDA = r"""{cuda}"""\n'
        + textwrap.dedent(
            """

        class ModelNew(nn.Module):
            def __init__(self, scale):
                super().__init__()
                self.scale = scale
                self.ext = load_inline(
                    name="relu_add_in_init",
                    cpp_sources="torch::Tensor relu_add(torch::Tensor x, torch::Tensor y, double scale);",
                    cuda_sources=CUDA,
                    functions=["relu_add"],
                )

            def forward(self, x, y):
                return self.ext.relu_add(x, y, self.scale)
        """
        )
    )
    task = (Path(__file__).parent / "fixtures" / "verify_cuda" / "task_relu_add.py").read_text()
    candidates, tasks = candidates_frame([("cuda_in_init", "relu_add", code)]), tasks_frame([("relu_add", task)])
    settings = {"device": "cuda", "timeout_s": 300, "workers": 2, "correctness_trials": 5, "warmup": 3,
                "timing_trials": 50, "build_cache": str(tmp_path / "cache")}  # fmt: skip
    builds = compile_frame(candidates, {**settings, "mode": "hardened"}, tmp_path / "compile", False, tasks=tasks)
    assert builds.loc[0, "status"] == "built", builds.loc[0, "reason"]
    assert "relu_add_kernel" in builds.loc[0, "kernels"]
    for mode in ("kernelbench", "hardened"):
        verdict = verify_frame(candidates, tasks, {**settings, "mode": mode}, tmp_path / mode, False, builds=builds)
        assert (verdict.loc[0, "status"], verdict.loc[0, "reason"]) == ("correct", ""), mode


def test_build_rows_say_what_was_run():
    from concur.verify.compiling import classify

    def reason(**facts) -> tuple[str, str]:
        made = classify({"ok": True, "load_calls": 0, "built": 0, **facts}, "k")
        return made["status"], made["reason"]

    assert reason(made=True) == ("no_build", "no load_inline/load call")
    assert reason(made=True, init_error="ModelNew(*init): ValueError: x") == (
        "no_build",
        "no load_inline/load call (ModelNew(*init): ValueError: x)",
    )
    assert reason() == ("no_build", "no load_inline/load call at import (ModelNew not made)")
    assert reason(init_error="reference: NameError: y") == (
        "no_build",
        "no load_inline/load call at import (ModelNew not made: reference: NameError: y)",
    )
    assert reason(made=True, load_calls=1, built=1, init_error="ModelNew(*init): timeout after 9 s") == (
        "built",
        "init: ModelNew(*init): timeout after 9 s",
    )
    assert reason(made=True, load_calls=1, build_error="main.cpp:1:1: error: x") == (
        "compile_error",
        "main.cpp:1:1: error: x",
    )

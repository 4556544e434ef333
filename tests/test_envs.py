"""The conda environments of the rules (envs/*.yaml, for `snakemake --sdm conda`): conda-forge only, and listing
every package the code each rule runs imports (followed through the concur modules it uses) or needs at run time.
They are not built here (docs/validation.md); this checks what they list."""

import ast
import re
import sys

import pytest
import yaml

from conftest import ROOT

SRC = ROOT / "src"
# import name -> package name in the environment files
PACKAGE_OF = {"torch": "pytorch-gpu", "yaml": "pyyaml", "matplotlib": "matplotlib-base", "liger_kernel": "liger-kernel"}
# imported only on paths a rule's environment does not serve: vLLM is installed on GPU nodes by the user
OPTIONAL = {"vllm"}
# needed without an import of their own: parquet files, GGUF models, accelerate under Trainer, extension builds
AT_RUN_TIME = {
    "core.yaml": {"pyarrow"},
    "torch.yaml": {"pyarrow", "gguf", "accelerate", "ninja", "cxx-compiler", "cuda-nvcc", "cuda-cudart-dev"},
}


def rules() -> dict[str, tuple[str, str]]:
    """rule -> (environment file, script) of every rule with a script; `use rule` copies inherit both."""
    found, text = {}, "\n".join(p.read_text() for p in sorted((ROOT / "rules").glob("*.smk")))
    for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^\S)", text + "\nEND", re.MULTILINE | re.DOTALL):
        env = re.search(r'conda:\s*\n\s*"\.\./envs/([\w.]+)"', body)
        script = re.search(r'script:\s*\n\s*"\.\./scripts/([\w.]+)"', body)
        if script:
            found[name] = (env[1] if env else None, script[1])
    return found


def listed(env_file: str) -> set[str]:
    names = set()
    for entry in yaml.safe_load((ROOT / "envs" / env_file).read_text())["dependencies"]:
        for item in entry["pip"] if isinstance(entry, dict) else [entry]:
            names.add(re.split(r"[<>=!~ \[]", item, maxsplit=1)[0].lower())
    return names


def _module_file(name: str):
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(script: str) -> set[str]:
    """Top-level names of the third-party modules imported, anywhere, by a script and the concur modules it uses."""
    todo, seen, third_party = [ROOT / "scripts" / script], set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = ".".join(path.relative_to(SRC).with_suffix("").parts[:-1]) if SRC in path.parents else ""
        if path.name == "__init__.py":
            package = ".".join(path.relative_to(SRC).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "concur":
                    if (module := _module_file(name)) is not None:
                        todo.append(module)
                elif top and top not in sys.stdlib_module_names and top != "__future__":
                    third_party.add(top)
    return third_party


def test_every_rule_with_a_script_has_an_environment():
    assert rules() and all(env for env, _ in rules().values()), rules()
    assert {"compile", "verify", "train", "curate", "analyze", "eval_score"} <= set(rules())


@pytest.mark.parametrize("env_file", ["core.yaml", "torch.yaml"])
def test_environments_use_conda_forge_only(env_file):
    channels = yaml.safe_load((ROOT / "envs" / env_file).read_text())["channels"]
    assert channels == ["conda-forge", "nodefaults"]


@pytest.mark.parametrize("rule", sorted(rules()))
def test_the_environment_lists_what_the_rule_imports(rule):
    env_file, script = rules()[rule]
    wanted = {PACKAGE_OF.get(name, name) for name in imports(script) - OPTIONAL} | AT_RUN_TIME[env_file]
    assert not wanted - listed(env_file), f"{rule} ({env_file}) misses {sorted(wanted - listed(env_file))}"

"""VerifySettings: the schema's `verify` section as one typed object, and every key list read off its fields (the
compile and verify rules' params, the referee's job, the probe cache key, the command line's options)."""

import ast
import dataclasses
import runpy
from types import SimpleNamespace

import pytest

from concur import config, workflow
from concur.verify import api, compiling, modes, orchestrate
from concur.verify import settings as verify_settings
from concur.verify.settings import BUILD, PROBE, READERS, REFEREE, VERDICT, VerifySettings
from conftest import ROOT

SCHEMA = config.load_schema()["properties"]["verify"]["properties"]


def changed(key: str, value):
    """Another valid value of a verify setting."""
    spec = SCHEMA[key]
    if "enum" in spec:
        return next(v for v in spec["enum"] if v != value)
    if isinstance(value, list):  # baselines: one more of its items' values
        return value + [next(v for v in spec["items"]["enum"] if v not in value)]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return {"cuda_arch": "8.0", "build_cache": "/elsewhere/cache"}.get(key, 1)  # a null number: atol, rtol, workers


def test_the_fields_are_the_schemas_keys_and_defaults():
    assert [f.name for f in dataclasses.fields(VerifySettings)] == list(SCHEMA)
    assert VerifySettings.from_dict({}).to_dict() == config.defaults("verify") == verify_settings.defaults()
    assert not any(f.default is not dataclasses.MISSING for f in dataclasses.fields(VerifySettings))  # schema only


def test_every_mode_the_schema_allows_is_defined_once():
    assert sorted(modes.MODES) == sorted(SCHEMA["mode"]["enum"])
    assert all(name == mode.name for name, mode in modes.MODES.items())
    hardened, kernelbench = modes.MODES["hardened"], modes.MODES["kernelbench"]
    assert hardened.speedup_stat == "best_ms" and kernelbench.speedup_stat == "mean_ms"  # KernelBench's: the mean
    assert not any(
        getattr(kernelbench, f.name) is True for f in dataclasses.fields(modes.Mode) if f.name != "cast_float32"
    )


def test_what_each_field_changes_is_marked():
    for f in dataclasses.fields(VerifySettings):
        assert f.metadata["reads"] <= set(READERS), f.name
    verdict = set(VerifySettings.keys(VERDICT))
    assert (
        set(VerifySettings.keys(BUILD)) | set(VerifySettings.keys(REFEREE)) | set(VerifySettings.keys(PROBE)) <= verdict
    )
    assert verdict | set(VerifySettings.plan_keys()) == set(SCHEMA) and not verdict & set(VerifySettings.plan_keys())
    # the two keys once missing from the compile rule: a build's headers and its candidate code's confinement
    assert {"light_cuda_headers", "sandbox"} <= set(VerifySettings.keys(BUILD))
    assert set(VerifySettings.plan_keys()) == {"workers", "compile_workers", "compile_threads", "gpus"}


def test_baselines_change_verdicts_and_what_a_referee_times_but_no_build_or_probe():
    assert "baselines" in VerifySettings.keys(VERDICT) and "baselines" in VerifySettings.keys(REFEREE)
    assert "baselines" not in VerifySettings.keys(BUILD) + VerifySettings.keys(PROBE)
    assert VerifySettings.from_dict({}).baselines == ["eager"]
    with pytest.raises(ValueError, match="verify.baselines"):
        VerifySettings.from_dict({"baselines": ["jit"]})


def test_settings_are_checked_against_the_schema():
    with pytest.raises(ValueError, match="verify: unknown setting"):
        VerifySettings.from_dict({"timing_trails": 5})
    with pytest.raises(ValueError, match="verify.mode must be kernelbench or hardened, got 'strict'"):
        VerifySettings.from_dict({"mode": "strict"})
    with pytest.raises(ValueError, match="verify.workers: 0 is less than the minimum of 1"):
        VerifySettings.from_dict({"workers": 0})
    with pytest.raises(ValueError, match="verify.timeout_s"):
        VerifySettings.of({"device": "cpu"}).replace(timeout_s=0)
    one = VerifySettings.from_dict({"device": "cpu"})
    assert VerifySettings.of(one) is one and VerifySettings.of(None) == VerifySettings.from_dict({})


def test_sandbox_off_can_be_configured():
    """The schema lists "off" as a string: YAML 1.1 reads a bare `off` as false, which no config could pass."""
    cfg = config.load(ROOT / "config.yaml")
    cfg["verify"]["sandbox"] = "off"
    assert config.validate(cfg)["verify"]["sandbox"] == "off"
    assert verify_settings.normalize({"device": "cpu", "sandbox": "off"})["sandbox"] == "off"


def test_normalize_resolves_and_stays_plain_data():
    resolved = verify_settings.normalize(VerifySettings.from_dict({"device": "cpu", "host_compiler": "gcc"}))
    assert type(resolved) is dict and list(resolved) == list(SCHEMA)
    assert resolved["device"] == "cpu" and resolved["host_compiler"] == "gcc"
    assert resolved == verify_settings.normalize({"device": "cpu", "host_compiler": "gcc"})


def test_a_referee_gets_only_what_it_reads():
    resolved = verify_settings.normalize({"device": "cpu"})
    sent = api.job_settings(resolved)
    assert list(sent) == list(VerifySettings.keys(REFEREE))
    assert "audit_speedup" not in sent and "build_cache" not in sent and "workers" not in sent  # decided here


def test_the_probe_cache_key_follows_the_probe_settings_only():
    base = verify_settings.normalize({"device": "cpu"})
    key = api.probe_key("code", base)
    for name in base:
        other = {**base, name: changed(name, base[name])}
        assert (api.probe_key("code", other) != key) == (name in VerifySettings.keys(PROBE)), name
    assert api.probe_key("other code", base) != key


def rule_params(cfg: dict) -> tuple[dict, dict]:
    return workflow.compile_settings(cfg), workflow.verify_settings(cfg)


@pytest.mark.parametrize("key", list(SCHEMA))
def test_a_changed_setting_reruns_exactly_the_jobs_that_read_it(key):
    """The compile and verify rules' params (Snakemake reruns a job when their repr changes) change with a BUILD
    setting, and the verify rule's with a VERDICT one; a plan setting changes neither."""
    cfg = config.load(ROOT / "config.yaml")
    before = rule_params(cfg)
    cfg["verify"][key] = changed(key, cfg["verify"][key])
    after = rule_params(config.validate(cfg))
    for params in (*before, *after):
        assert type(params) is dict and eval(repr(params)) == params  # plain data, compared by repr
    assert (before[0] != after[0]) == (key in VerifySettings.keys(BUILD))
    assert (before[1] != after[1]) == (key in VerifySettings.keys(VERDICT))


def test_the_build_cache_is_resolved_under_the_results():
    cfg = config.load(ROOT / "config.yaml")
    assert workflow.verifier(cfg).build_cache == workflow.results_path(cfg, "build-cache")
    assert workflow.compile_settings(cfg)["build_cache"] == workflow.verify_settings(cfg)["build_cache"]


def fake_snakemake(tmp_path, cfg: dict, threads: int = 3) -> SimpleNamespace:
    return SimpleNamespace(
        input=SimpleNamespace(candidates="c.parquet", tasks="t.parquet", builds="b.parquet"),
        output=[str(tmp_path / "out.parquet")],
        params=SimpleNamespace(settings=None, workdir=str(tmp_path / "work")),
        log=[str(tmp_path / "job.log")],
        threads=threads,
        config=cfg,
    )


@pytest.mark.parametrize("script", ["compile", "verify"])
def test_the_rules_scripts_run_with_the_workflows_settings(script, tmp_path, monkeypatch):
    import concur.verify.api as api_mod

    cfg = config.load(ROOT / "config.yaml")
    cfg["verify"].update(light_cuda_headers=False, compile_workers=7)
    got = {}
    monkeypatch.setattr(api_mod, f"{script}_run" if script == "compile" else "run", lambda **kw: got.update(kw))
    runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), init_globals={"snakemake": fake_snakemake(tmp_path, cfg)})
    expected = workflow.verifier(cfg)
    assert got["settings"] == (expected.replace(compile_workers=3) if script == "compile" else expected)
    assert got["settings"].to_dict(BUILD) == workflow.compile_settings(cfg)  # what the params hold, it runs with


def test_a_required_sandbox_stops_the_compile_job_without_landlock(tmp_path, monkeypatch):
    """`sandbox: required` reaches the compile job: where the kernel has no Landlock it builds nothing (it once ran
    candidate code there under the default `auto`, unconfined)."""
    from verify_frames import candidates_frame

    from concur.verify import sandbox

    cfg = config.load(ROOT / "config.yaml")
    cfg["verify"].update(sandbox="required", device="cpu")
    candidates = tmp_path / "c.parquet"
    candidates_frame([("c-1", "t", "import os\nos.system('touch pwned')")]).to_parquet(candidates)
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    monkeypatch.setattr(orchestrate, "run_builds", lambda *a, **k: pytest.fail("a build ran without Landlock"))
    fake = fake_snakemake(tmp_path, cfg)
    fake.input = SimpleNamespace(candidates=str(candidates), tasks=None)
    with pytest.raises(ValueError, match="verify.sandbox is required but this kernel has no Landlock"):
        runpy.run_path(str(ROOT / "scripts" / "compile.py"), init_globals={"snakemake": fake})


def test_builds_see_the_build_settings_only(tmp_path, monkeypatch):
    """compile_frame hands its builds the BUILD settings (and how many to run at once): a build reading anything
    else fails here, not silently in a compile job whose params lack it."""
    from verify_frames import candidates_frame

    seen = {}

    def run_builds(jobs, settings, *_):
        seen.update(settings)
        return [compiling.row("no_code", "", "", 0.0) for _ in jobs]

    monkeypatch.setattr(orchestrate, "run_builds", run_builds)
    api.compile_frame(candidates_frame([("c-1", "t", "x = 1")]), {"device": "cpu", "compile_workers": 2}, tmp_path)
    assert set(seen) == set(VerifySettings.keys(BUILD)) | set(VerifySettings.plan_keys())
    assert seen["compile_workers"] == 2


# ---------------------------------------------------------------- what the code reads, statically

VERIFY = ROOT / "src" / "concur" / "verify"
JOB_EXTRAS = {"precision"}  # what api adds to a job's settings beside the REFEREE fields: the task's own


def settings_reads(node) -> set[str]:
    """The keys read as `settings["key"]` or `settings.get("key", ...)` anywhere under an AST node."""
    keys = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "settings":
            if isinstance(n.slice, ast.Constant):
                keys.add(n.slice.value)
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "settings"
            and n.args
            and isinstance(n.args[0], ast.Constant)
        ):
            keys.add(n.args[0].value)
    return keys


def module_tree(name: str) -> ast.Module:
    return ast.parse((VERIFY / f"{name}.py").read_text())


def verify_imports(tree: ast.Module) -> tuple[set[str], dict[str, set[str]]]:
    """The concur.verify modules a module imports whole, and the names it takes from the others."""
    whole, names = set(), {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "concur.verify":
            whole |= {a.name for a in n.names if (VERIFY / f"{a.name}.py").is_file()}
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("concur.verify."):
            names.setdefault(n.module.split(".")[2], set()).update(a.name for a in n.names)
        elif isinstance(n, ast.Import):
            whole |= {a.name.split(".")[2] for a in n.names if a.name.startswith("concur.verify.")}
    return whole, names


def reached(tree: ast.Module, wanted: set[str]) -> list[ast.AST]:
    """The module's top-level definitions named in `wanted`, and those they call by name, transitively."""
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    todo, seen = [w for w in wanted if w in defs], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        calls = {c.func.id for c in ast.walk(defs[name]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        todo += [c for c in calls if c in defs]
    return [defs[name] for name in seen]


def process_reads(entry: str) -> dict[str, set[str]]:
    """module -> the settings keys read by the code a process started at module `entry` can run: every module it
    imports whole (transitively), and of a module it takes names from, those definitions and what they call."""
    whole, partial, todo = set(), {}, [entry]
    while todo:
        name = todo.pop()
        if name in whole:
            continue
        whole.add(name)
        more, names = verify_imports(module_tree(name))
        todo += list(more)
        for module, taken in names.items():
            partial.setdefault(module, set()).update(taken)
    reads = {name: settings_reads(module_tree(name)) for name in whole}
    for module, taken in partial.items():
        if module not in whole:
            reads[module] = set().union(*(settings_reads(n) for n in reached(module_tree(module), taken)))
    return reads


def test_every_key_the_verifier_reads_is_a_setting():
    fields = {f.name for f in dataclasses.fields(VerifySettings)}
    for path in sorted(VERIFY.glob("*.py")):
        assert settings_reads(ast.parse(path.read_text())) <= fields | JOB_EXTRAS, path.name


def test_a_referees_code_reads_only_the_settings_it_is_sent():
    """Checked on the source, so the code paths that run only on a GPU (not in this suite) are covered too: a key
    outside the REFEREE fields would be a KeyError there, on the device, mid-run."""
    reads = process_reads("referee")
    assert {"measure", "evaluation", "reference", "verdict"} <= set(reads)  # found through the imports
    assert {"timing_trials", "warmup", "signed_trials"} <= set().union(*reads.values())
    sent = set(VerifySettings.keys(REFEREE)) | JOB_EXTRAS
    for module, keys in reads.items():
        assert keys <= sent, f"{module} reads {sorted(keys - sent)}, which a referee is not sent"
    # verdict.py reads audit_speedup, but only in code the orchestrator runs: a whole import would have found it
    assert "audit_speedup" in settings_reads(module_tree("verdict")) and "audit_speedup" not in reads["verdict"]


def test_a_builds_code_reads_only_build_settings():
    reads = set().union(*process_reads("compiling").values())
    assert {"cuda_arch", "light_cuda_headers"} <= reads
    assert reads <= set(VerifySettings.keys(BUILD)) | set(VerifySettings.plan_keys())

import copy

import pytest
import yaml

from concur import config
from conftest import ROOT


@pytest.fixture(scope="module")
def default():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_default_config_is_valid_and_gets_defaults(default):
    cfg = config.validate(default)
    assert cfg["verify"]["mode"] == "hardened"
    assert cfg["tasks"]["shards"] == 2
    assert cfg["analyze"]["bin_width"] == 128
    # a key absent from config.yaml is filled from the schema's default
    trimmed = copy.deepcopy(default)
    del trimmed["curate"]["speedup_threshold"]
    assert config.validate(trimmed)["curate"]["speedup_threshold"] == 5.0


def test_paper_config_is_valid():
    cfg = config.load(ROOT / "configs" / "paper.yaml")
    assert cfg["synthesize"]["samples_per_task"] == 5
    assert cfg["train"]["lora"] == {
        "r": 32,
        "alpha": 32,
        "dropout": 0.05,
        "target_modules": cfg["train"]["lora"]["target_modules"],
    }
    assert cfg["train"]["epochs"] == 3
    assert cfg["train"]["adapters"] == ["concur", "min", "max", "speedup", "random"]
    evaluate = cfg["evaluate"]
    assert (evaluate["pass_k"], evaluate["samples"], evaluate["difficulty_model"]) == ([1, 10], 10, "base")
    assert evaluate["baselines"] == [] and 1 in evaluate["fast_p"]
    assert cfg["analyze"] == {"bin_width": 512, "easy_below": 4000, "hard_above": 8500, "include_truncated": False}
    assert (cfg["train"]["gpus"], cfg["train"]["distributed"], cfg["train"]["packing"]) == (8, "fsdp", True)
    assert cfg["train"]["max_length"] >= 16384


def test_train_keys_default_from_the_schema(default):
    trimmed = copy.deepcopy(default)
    for key in ("packing", "merge", "gpus"):
        trimmed["train"].pop(key, None)
    train = config.validate(trimmed)["train"]
    assert (train["packing"], train["merge"], train["gpus"], train["distributed"]) == (False, False, 0, "fsdp")
    assert (train["max_steps"], train["save_steps"]) == (0, 0) and "accelerate_config" not in train


def test_evaluation_defaults(default):
    trimmed = copy.deepcopy(default)
    trimmed["evaluate"] = {"base_generator": "smollm2-135m"}
    del trimmed["analyze"]
    cfg = config.validate(trimmed)
    assert cfg["evaluate"]["baselines"] == [] and cfg["evaluate"]["difficulty_model"] == "base"
    assert cfg["evaluate"]["pass_k"] == [1, 10] and cfg["evaluate"]["samples"] == 10
    assert cfg["analyze"] == {"bin_width": 512, "easy_below": 4000, "hard_above": 8500, "include_truncated": False}


def test_a_baseline_can_be_the_difficulty_model(default):
    cfg = copy.deepcopy(default)
    cfg["generators"]["other"] = {"backend": "transformers", "model": "smollm2-135m"}
    cfg["evaluate"].update(baselines=["other"], difficulty_model="other")
    assert config.validate(cfg)["evaluate"]["baselines"] == ["other"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.update(verfy={}), "unknown key under <top level>"),
        (
            lambda c: c["curate"].update(speedup_threshold="fast"),
            "curate.speedup_threshold: 'fast' is not of type 'number'",
        ),
        (lambda c: c["verify"].update(device="tpu"), "verify.device: 'tpu' is not one of"),
        (lambda c: c["tasks"].update(shards=0), "tasks.shards: 0 is less than the minimum of 1"),
        (lambda c: c["synthesize"].update(generator="nope"), "synthesize.generator 'nope' is not a generators entry"),
        (lambda c: c["train"].update(base_model="nope"), "train.base_model 'nope' is not a models entry"),
        (lambda c: c["train"].update(distributed="horovod"), "train.distributed: 'horovod' is not one of"),
        (lambda c: c["train"].update(packing="yes"), "train.packing: 'yes' is not of type 'boolean'"),
        (
            lambda c: c["train"].update(adapters=["concur", "min"]) or c["curate"].update(ablations=["max"]),
            "need the matching curate.ablations",
        ),
        (lambda c: c["generators"]["demo-teacher"].pop("tokenizer"), "the replay backend needs 'tokenizer'"),
        (lambda c: c["evaluate"].update(baselines=["nope"]), "evaluate.baselines: 'nope' is not a generators entry"),
        (
            lambda c: c["evaluate"].update(baselines=["smollm2-135m"]),
            "is the base generator, already evaluated as 'base'",
        ),
        (
            lambda c: (
                c["generators"].update(concur={"backend": "transformers", "model": "smollm2-135m"})
                or c["evaluate"].update(baselines=["concur"])
            ),
            "'concur' is also the name of an evaluated model",
        ),
        (
            lambda c: c["evaluate"].update(difficulty_model="min"),
            "evaluate.difficulty_model 'min' is not an evaluated model",
        ),
        (lambda c: c["evaluate"].update(fast_p=[0, 2]), "evaluate.fast_p must include 1"),
    ],
)
def test_bad_configs_fail_with_one_clear_line(default, mutate, message):
    bad = copy.deepcopy(default)
    mutate(bad)
    with pytest.raises(config.ConfigError) as err:
        config.validate(bad)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


# a run of replayed generations only: no model-backed generator, no evaluate section
REPLAY_ONLY = {
    "tasks": {"sources": [{"kind": "builtin", "path": "resources/suite"}]},
    "models": {"qwq-tokenizer": {"path": "/models/qwq-tokenizer"}},
    "generators": {"qwq": {"backend": "replay", "path": "qwq.jsonl", "tokenizer": "qwq-tokenizer"}},
    "synthesize": {"generator": "qwq"},
    "train": {"base_model": "qwq-tokenizer", "adapters": []},
}


def test_a_replay_only_config_needs_no_base_generator():
    from concur import workflow

    cfg = config.validate(REPLAY_ONLY)
    assert cfg["evaluate"]["base_generator"] is None and cfg["evaluate"]["baselines"] == []
    assert not workflow.evaluates(cfg) and workflow.eval_models(cfg) == []
    # on top of config.yaml (as a --configfile is), `base_generator: null` turns its evaluation off
    with_default = yaml.safe_load((ROOT / "config.yaml").read_text())
    with_default["evaluate"]["base_generator"] = None
    assert not workflow.evaluates(config.validate(with_default))
    assert workflow.evaluates(config.validate(yaml.safe_load((ROOT / "config.yaml").read_text())))


@pytest.mark.parametrize(
    "evaluate, message",
    [
        ({"baselines": ["qwq"]}, "config: evaluate.baselines need evaluate.base_generator"),
        ({"base_generator": "qwq"}, "evaluate.base_generator 'qwq' must name a model-backed generators entry"),
    ],
)
def test_evaluation_without_a_model_backed_base_fails_with_one_line(evaluate, message):
    with pytest.raises(config.ConfigError) as err:
        config.validate({**REPLAY_ONLY, "evaluate": evaluate})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unreadable_config_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("tasks: [unclosed")
    with pytest.raises(config.ConfigError, match="broken.yaml: cannot read config"):
        config.load(path)


SECTIONS = ("tasks", "synthesize", "verify", "curate", "train", "evaluate", "analyze")
MINIMAL = {
    "tasks": {"sources": [{"kind": "builtin", "path": "resources/suite"}]},
    "models": {"m": {"path": "some/model"}},
    "generators": {
        "g": {"backend": "transformers", "model": "m"},
        "served": {"backend": "openai", "base_url": "http://localhost:9/v1", "model": "x"},
        "offline": {"backend": "vllm", "model": "m"},
    },
    "synthesize": {"generator": "g"},
    "train": {"base_model": "m", "lora": {"r": 4}},
    "evaluate": {"base_generator": "g"},
}


def test_the_workflow_and_the_python_api_fill_the_same_defaults():
    """One source of truth: the packaged schema's defaults are what the Snakefile and `concur` (config.validate)
    and every stage called from Python (config.with_defaults) fill in, nested objects and shared definitions
    (`gpus`) included, and each generator backend gets only its own."""
    validated = config.validate(MINIMAL)
    for section in SECTIONS:
        assert validated[section] == config.with_defaults(section, MINIMAL.get(section)), section
    for name, entry in MINIMAL["generators"].items():
        assert validated["generators"][name] == config.with_defaults("generator", entry), name
    assert validated["train"]["lora"]["r"] == 4 and validated["train"]["lora"]["alpha"] == 32
    assert {validated[s]["gpus"] for s in ("synthesize", "verify", "train", "evaluate")} == {0}
    assert (
        validated["generators"]["served"]["max_concurrency"] == 8
        and "max_concurrency" not in validated["generators"]["offline"]
    )
    assert (
        validated["generators"]["offline"]["prompts_per_call"] == 512
        and "prompts_per_call" not in validated["generators"]["g"]
    )
    assert config.defaults("analyze") == {
        "bin_width": 512,
        "easy_below": 4000,
        "hard_above": 8500,
        "include_truncated": False,
    }
    assert config.with_defaults("curate", {"seed": 3, "extra": 1}) == {
        **config.defaults("curate"),
        "seed": 3,
        "extra": 1,
    }


def test_stages_called_from_python_use_the_schema_defaults():
    """The stages themselves hold no default values of their own: what they fill in comes from the schema."""
    import pandas as pd

    from concur import curate, evaluate

    verdicts = pd.DataFrame({"task_id": ["t"], "correct": [True], "speedup": [2.0]})
    tasks = pd.DataFrame({"task_id": ["t"], "level": [1], "category": ["fused"]})
    columns = evaluate.score({"m": verdicts}, tasks, {}).columns
    defaults = config.defaults("evaluate")
    assert [c for c in columns if c.startswith("pass@")] == [f"pass@{k}" for k in defaults["pass_k"]]
    assert [c for c in columns if c.startswith("fast_") and "@" not in c] == [
        evaluate.fast_name(p) for p in defaults["fast_p"]
    ]
    card = curate.curate(*_curate_tables(), {}).card
    assert f"`single_op_share`: {config.defaults('curate')['single_op_share']}" in card


def test_no_module_keeps_its_own_default_settings():
    sources = (ROOT / "src" / "concur").rglob("*.py")
    assert not [p.name for p in sources if "DEFAULT_SETTINGS" in p.read_text() or "DEFAULTS" in p.read_text()]


def _curate_tables():
    import pandas as pd

    candidates = pd.DataFrame(
        {
            "candidate_id": ["c"],
            "task_id": ["t"],
            "generator": ["g"],
            "prompt": ["p"],
            "reasoning": ["r"],
            "answer": ["a"],
            "code": ["x"],
            "reasoning_tokens": [3],
        }
    )
    verdicts = pd.DataFrame({"candidate_id": ["c"], "task_id": ["t"], "correct": [True], "speedup": [2.0]})
    tasks = pd.DataFrame({"task_id": ["t"], "name": ["n"], "category": ["fused"], "level": [2]})
    return candidates, verdicts, tasks


def test_transport_keys_are_openai_generator_keys():
    """The keys left out of generation params and checkpoint fingerprints are keys of the schema's generator entry,
    each with its openai default."""
    from concur import workflow

    served = config.with_defaults("generator", {"backend": "openai", "base_url": "http://h:8000/v1", "model": "m"})
    assert set(workflow.TRANSPORT_KEYS) <= set(config.load_schema()["$defs"]["generator"]["properties"])
    assert set(workflow.TRANSPORT_KEYS) - {"api_key_env"} <= set(served)
    assert workflow.generator_params({"generators": {"s": served}}, "s") == {
        "backend": "openai",
        "model": "m",
        "request_n": True,
    }

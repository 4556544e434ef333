"""Load and validate a workflow config against schemas/config.schema.yaml, filling in defaults."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """The config is invalid; the message is one line naming the key and the problem."""


def _with_defaults(validator_class):
    """A validator that also writes each property's `default` into the instance (jsonschema's documented recipe)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    return yaml.safe_load(Path(path).read_text())


def validate(config: dict, schema: dict | None = None) -> dict:
    """Return a validated deep copy of `config` with defaults filled in, or raise ConfigError."""
    config = copy.deepcopy(config)
    errors = sorted(_Validator(schema or load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_describe(errors[0]))
    _check_references(config)
    return config


def load(path: str | Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read config: {err}") from None
    return validate(raw)


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    if error.validator == "additionalProperties":
        return f"config: unknown key under {where}: {error.message}"
    return f"config: {where}: {error.message}"


def _check_references(config: dict) -> None:
    """Names that point at other sections must exist there."""
    models, generators = config["models"], config["generators"]
    for name, gen in generators.items():
        if gen["backend"] == "transformers" and gen.get("model") not in models:
            raise ConfigError(f"config: generators.{name}.model {gen.get('model')!r} is not a models entry")
        if gen["backend"] == "replay":
            for key in ("path", "tokenizer"):
                if key not in gen:
                    raise ConfigError(f"config: generators.{name}: the replay backend needs '{key}'")
            if gen["tokenizer"] not in models:
                raise ConfigError(f"config: generators.{name}.tokenizer {gen['tokenizer']!r} is not a models entry")
    if config["synthesize"]["generator"] not in generators:
        raise ConfigError(f"config: synthesize.generator {config['synthesize']['generator']!r} is not a generators entry")
    if config["train"]["base_model"] not in models:
        raise ConfigError(f"config: train.base_model {config['train']['base_model']!r} is not a models entry")
    base = config["evaluate"]["base_generator"]
    if base not in generators or generators[base]["backend"] == "replay":
        raise ConfigError(f"config: evaluate.base_generator {base!r} must name a model-backed generators entry")
    adapters = config["train"]["adapters"]
    missing = [a for a in adapters if a != "concur" and a not in config["curate"]["ablations"]]
    if missing:
        raise ConfigError(f"config: train.adapters {missing} need the matching curate.ablations subsets")
    evaluate = config["evaluate"]
    for name in evaluate["baselines"]:
        if name not in generators:
            raise ConfigError(f"config: evaluate.baselines: {name!r} is not a generators entry")
        if name == base:
            raise ConfigError(f"config: evaluate.baselines: {name!r} is the base generator, already evaluated "
                              "as 'base'")
        if name == "base" or name in adapters:
            raise ConfigError(f"config: evaluate.baselines: {name!r} is also the name of an evaluated model "
                              "('base' or a train.adapters entry); rename the generators entry")
    models_evaluated = ["base", *adapters, *evaluate["baselines"]]
    if evaluate["difficulty_model"] not in models_evaluated:
        raise ConfigError(f"config: evaluate.difficulty_model {evaluate['difficulty_model']!r} is not an evaluated "
                          f"model ({', '.join(models_evaluated)})")
    if 1 not in evaluate["fast_p"]:
        raise ConfigError("config: evaluate.fast_p must include 1 (the results table reports fast_1)")


def generator_model_spec(config: dict, generator: str) -> dict:
    """The models entry behind a generator (its tokenizer, for replay)."""
    gen = config["generators"][generator]
    return config["models"][gen["model"] if gen["backend"] != "replay" else gen["tokenizer"]]

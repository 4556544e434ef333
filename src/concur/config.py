"""The workflow config: its schema (package data, the one place defaults live), validation and defaults.

The Snakefile, the `concur` command and every stage called from Python fill defaults from the same schema:
`validate` for a whole config, `with_defaults` for one section's settings (or one generator or model entry).
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
from pathlib import Path

import yaml

SCHEMA_FILE = "config.schema.yaml"


class ConfigError(ValueError):
    """The config is invalid; the message is one line naming the key and the problem."""


def _with_defaults(validator_class):
    """A validator that also writes each property's `default` into the instance (jsonschema's documented recipe)."""
    import jsonschema

    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _inline_ref_defaults(node, defs: dict):
    """Copy the `default` of a `$defs` entry to every `{$ref: "#/$defs/…"}` without its own, so that the
    validator above, which looks only at the property's own keys, fills it too."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/") and "default" not in node and "default" in defs.get(ref[8:], {}):
            node["default"] = copy.deepcopy(defs[ref[8:]]["default"])
        for value in node.values():
            _inline_ref_defaults(value, defs)
    elif isinstance(node, list):
        for value in node:
            _inline_ref_defaults(value, defs)
    return node


@functools.cache
def _validator():
    """The default-filling validator; jsonschema is imported here only, so that reading the schema (the verifier's
    processes do) needs nothing beyond PyYAML."""
    import jsonschema

    return _with_defaults(jsonschema.Draft202012Validator)


@functools.cache
def _schema() -> dict:
    schema = yaml.safe_load(importlib.resources.files("concur").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))
    return _inline_ref_defaults(schema, schema["$defs"])


def load_schema() -> dict:
    """A fresh copy of the packaged schema."""
    return copy.deepcopy(_schema())


def validate(config: dict, schema: dict | None = None) -> dict:
    """Return a validated deep copy of `config` with defaults filled in, or raise ConfigError."""
    config = copy.deepcopy(config)
    errors = sorted(_validator()(schema or load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
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


def with_defaults(section: str, settings: dict | None = None) -> dict:
    """`settings` of one config section (`tasks`, `train`, …) or entry (`generator`, `model`) with every key it
    leaves out filled from the schema, nested objects included; keys it sets are kept as they are.

    Only fills in: it neither checks the given values nor rejects extra keys (the workflow validates the whole
    config before anything runs; the stages check what they rely on).
    """
    filled = copy.deepcopy(settings or {})
    for _ in _validator()(_section_schema(section)).iter_errors(filled):
        pass  # errors are not ours to report here; iterating fills the defaults
    return filled


def section_errors(section: str, settings: dict) -> list:
    """What is wrong with `settings` of one section or entry, as jsonschema errors in key order (none: valid)."""
    errors = _validator()(_section_schema(section)).iter_errors(copy.deepcopy(settings))
    return sorted(errors, key=lambda e: list(e.absolute_path))


def _section_schema(section: str) -> dict:
    schema = load_schema()
    if section in schema["properties"]:
        return {**schema["properties"][section], "$defs": schema["$defs"]}
    if section in schema["$defs"]:
        return {**schema["$defs"][section], "$defs": schema["$defs"]}
    raise KeyError(f"the config schema has no section or definition {section!r}")


def defaults(section: str) -> dict:
    """The schema's defaults of one section or entry: what a config that leaves the section's keys out gets."""
    return with_defaults(section, {})


def _describe(error) -> str:
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
        raise ConfigError(
            f"config: synthesize.generator {config['synthesize']['generator']!r} is not a generators entry"
        )
    if config["train"]["base_model"] not in models:
        raise ConfigError(f"config: train.base_model {config['train']['base_model']!r} is not a models entry")
    adapters = config["train"]["adapters"]
    missing = [a for a in adapters if a != "concur" and a not in config["curate"]["ablations"]]
    if missing:
        raise ConfigError(f"config: train.adapters {missing} need the matching curate.ablations subsets")
    evaluate = config["evaluate"]
    base = evaluate["base_generator"]
    if base is None:  # no evaluation: nothing else of the section is used
        if evaluate["baselines"]:
            raise ConfigError("config: evaluate.baselines need evaluate.base_generator (evaluation is off without one)")
        return
    if base not in generators or generators[base]["backend"] == "replay":
        raise ConfigError(f"config: evaluate.base_generator {base!r} must name a model-backed generators entry")
    for name in evaluate["baselines"]:
        if name not in generators:
            raise ConfigError(f"config: evaluate.baselines: {name!r} is not a generators entry")
        if name == base:
            raise ConfigError(
                f"config: evaluate.baselines: {name!r} is the base generator, already evaluated as 'base'"
            )
        if name == "base" or name in adapters:
            raise ConfigError(
                f"config: evaluate.baselines: {name!r} is also the name of an evaluated model "
                "('base' or a train.adapters entry); rename the generators entry"
            )
    models_evaluated = ["base", *adapters, *evaluate["baselines"]]
    if evaluate["difficulty_model"] not in models_evaluated:
        raise ConfigError(
            f"config: evaluate.difficulty_model {evaluate['difficulty_model']!r} is not an evaluated "
            f"model ({', '.join(models_evaluated)})"
        )
    if 1 not in evaluate["fast_p"]:
        raise ConfigError("config: evaluate.fast_p must include 1 (the results table reports fast_1)")

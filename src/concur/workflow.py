"""What each stage receives from a validated config: the rules' `params:` and the `concur` command's arguments are
both made here, so a stage run from the command line gets exactly what its rule would give it.

Each stage gets only the settings it depends on: Snakemake reruns a job when its params change, so editing, say,
`evaluate.pass_k` reruns the scoring and never a model.
"""

from __future__ import annotations

import os

from concur.verify.settings import BUILD, VERDICT, VerifySettings

# Keys of the tasks section that are not the stage's settings: the sources are its input, the shards and workers
# belong to the workflow's plan and the job's cores.
TASKS_PLAN_KEYS = ("sources", "shards", "workers")
# What eval generation depends on: changing pass_k, baselines or the difficulty model reruns no generation.
EVAL_GENERATION_KEYS = ("samples", "temperature", "top_p", "max_new_tokens", "batch_size", "seed", "gpus")
SCORING_KEYS = ("pass_k", "fast_p", "difficulty_model", "samples", "temperature", "turns")
# Keys of refinement only: the first turn's jobs leave them out of their params, so more turns rerun no first turn.
REFINE_KEYS = ("turns", "stop_speedup")
THRESHOLD_KEYS = ("easy_below", "hard_above")
# generators whose jobs run no model: an endpoint serves it, or a file holds its answers
NO_GPU_BACKENDS = ("openai", "replay")
# generator keys that change how samples are fetched, not what they are (how an openai server is reached): neither a
# generation rule's params nor a checkpoint's fingerprint holds them, so a server that moved (a new node or port, a
# new key variable) or other concurrency, retries, timeouts or streaming rerun no finished job and keep checkpoints
TRANSPORT_KEYS = (
    "base_url",
    "api_key_env",
    "max_concurrency",
    "max_retries",
    "request_timeout_s",
    "backoff_s",
    "stream",
    "check_model",
)


def results_path(config: dict, *parts: str) -> str:
    """A path under the configured results folder."""
    return os.path.join(config["results"], *parts)


def drawn_with(generator: dict) -> dict:
    """A generators entry without its TRANSPORT_KEYS: what the samples it gives depend on."""
    return {key: value for key, value in generator.items() if key not in TRANSPORT_KEYS}


def generator_params(config: dict, name: str) -> dict:
    """What a generation job's params hold of its generators entry (the job's script reads the whole entry)."""
    return drawn_with(config["generators"][name])


def synthesis_settings(config: dict) -> dict:
    """The synthesize section a first-turn job depends on (without REFINE_KEYS)."""
    return {key: value for key, value in config["synthesize"].items() if key not in REFINE_KEYS}


def refine_settings(config: dict) -> dict:
    """The synthesize section a refinement turn depends on: what the first turn's does, and `stop_speedup`."""
    return {**synthesis_settings(config), "stop_speedup": config["synthesize"]["stop_speedup"]}


def turn_dir(turn: int) -> list[str]:
    """The path part of a turn's files: none for turn 1 (single-turn runs' paths), `turn-{k}` after it."""
    return [] if int(turn) == 1 else [f"turn-{int(turn)}"]


def tasks_settings(config: dict) -> dict:
    return {key: value for key, value in config["tasks"].items() if key not in TASKS_PLAN_KEYS}


def verifier(config: dict) -> VerifySettings:
    """The verify section as the compile and verify jobs run it (their scripts and the `concur` command alike), the
    build cache resolved: <results>/build-cache unless set."""
    section = config["verify"]
    return VerifySettings.from_dict(
        {**section, "build_cache": section["build_cache"] or results_path(config, "build-cache")}
    )


def verify_settings(config: dict) -> dict:
    """The verify rule's params: what a verdict depends on (VerifySettings' VERDICT fields); processes, cores and
    GPUs rerun nothing."""
    return verifier(config).to_dict(VERDICT)


def compile_settings(config: dict) -> dict:
    """The compile rule's params: what a build depends on (VerifySettings' BUILD fields); editing timing or
    correctness settings reruns no compile job."""
    return verifier(config).to_dict(BUILD)


def evaluates(config: dict) -> bool:
    """Whether the config evaluates models: it names an `evaluate.base_generator` (a replay-only run does not)."""
    return config["evaluate"].get("base_generator") is not None


def eval_models(config: dict) -> list[str]:
    """Every evaluated model: the base generator, the base generator plus each adapter, each baseline generator;
    none when the config evaluates nothing."""
    if not evaluates(config):
        return []
    return ["base", *config["train"]["adapters"], *config["evaluate"]["baselines"]]


def eval_generator_name(config: dict, model: str) -> str:
    """The generators entry behind an evaluated model: a baseline's own, else the base generator."""
    return model if model in config["evaluate"]["baselines"] else config["evaluate"]["base_generator"]


def eval_gpus(config: dict, model: str) -> int:
    """GPUs of one eval generation job: none for a baseline behind an endpoint or a replay file."""
    backend = config["generators"][eval_generator_name(config, model)]["backend"]
    return 0 if backend in NO_GPU_BACKENDS else config["evaluate"]["gpus"]


def eval_generation_settings(config: dict) -> dict:
    return {key: config["evaluate"][key] for key in EVAL_GENERATION_KEYS}


def eval_refine_settings(config: dict) -> dict:
    """What an eval refinement turn depends on: eval generation's settings and `stop_speedup`."""
    return {**eval_generation_settings(config), "stop_speedup": config["evaluate"]["stop_speedup"]}


def eval_model_info(config: dict) -> dict[str, dict]:
    """Kind (base, adapter, baseline) and generators entry of every evaluated model, for the results table."""
    kinds = {"base": "base"}
    kinds.update({adapter: "adapter" for adapter in config["train"]["adapters"]})
    kinds.update({baseline: "baseline" for baseline in config["evaluate"]["baselines"]})
    return {model: {"kind": kinds[model], "generator": eval_generator_name(config, model)} for model in kinds}


def scoring_settings(config: dict) -> dict:
    return {key: config["evaluate"][key] for key in SCORING_KEYS}


def difficulty_thresholds(config: dict) -> dict:
    return {key: config["analyze"][key] for key in THRESHOLD_KEYS}


def api_key_variables(config: dict, generators: list[str]) -> list[str]:
    """The environment variables holding the API keys of these generators (openai entries that name one)."""
    entries = (config["generators"][name] for name in generators)
    return sorted({entry["api_key_env"] for entry in entries if entry.get("api_key_env")})

# Helper functions and constants shared by every rule file. Rules never compute paths themselves.

RESULTS = config["results"]
SHARDS = list(range(config["tasks"]["shards"]))
TEACHER = config["synthesize"]["generator"]
ADAPTERS = config["train"]["adapters"]
BASE_GENERATOR = config["evaluate"]["base_generator"]
BASELINES = config["evaluate"]["baselines"]
# every evaluated model: the base generator, the base generator plus each adapter, each baseline generator
EVAL_MODELS = ["base"] + ADAPTERS + BASELINES
DIFFICULTY_MODEL = config["evaluate"]["difficulty_model"]
# what eval generation depends on: changing pass_k, baselines or the difficulty model reruns no generation
EVAL_GENERATION_KEYS = ["samples", "temperature", "top_p", "max_new_tokens", "batch_size", "seed", "gpus"]


wildcard_constraints:
    shard=r"\d+",
    generator="|".join(map(re.escape, config["generators"])),
    adapter="|".join(ADAPTERS) or "(?!)",
    model="|".join(map(re.escape, EVAL_MODELS)),


def results(*parts):
    """A path under the configured results folder."""
    return os.path.join(RESULTS, *parts)


def log_path(*parts):
    return results("logs", *parts) + ".log"


def benchmark_path(*parts):
    return results("benchmarks", *parts) + ".tsv"


def shard_files(kind, generator=TEACHER):
    """Every shard of a stage's output for one generator (`kind`: candidates or verified)."""
    return [results(kind, generator, f"shard-{i}.parquet") for i in SHARDS]


def replay_file(wildcards):
    """The generations file a replay generator reads (nothing for model-backed generators)."""
    generator = config["generators"][wildcards.generator]
    return [generator["path"]] if generator["backend"] == "replay" else []


def adapter_dataset(wildcards):
    """The curated table an adapter is trained on: the ConCuR dataset or an ablation subset."""
    if wildcards.adapter == "concur":
        return results("dataset", "concur.parquet")
    return results("dataset", "subsets", f"{wildcards.adapter}.parquet")


def eval_adapter_dir(wildcards):
    return [results("adapters", wildcards.model)] if wildcards.model in ADAPTERS else []


def eval_generator_name(model):
    """The generators entry behind an evaluated model: a baseline's own, else the base generator."""
    return model if model in BASELINES else BASE_GENERATOR


def eval_generator(wildcards):
    return config["generators"][eval_generator_name(wildcards.model)]


def eval_replay_file(wildcards):
    """The generations file of a replay baseline (nothing for model-backed generators)."""
    generator = eval_generator(wildcards)
    return [generator["path"]] if generator["backend"] == "replay" else []


def eval_gpus(wildcards):
    """GPUs of one eval generation job: none for a baseline behind an endpoint or a replay file."""
    return 0 if eval_generator(wildcards)["backend"] in ("openai", "replay") else gpus("evaluate")


def eval_generation_settings():
    return {key: config["evaluate"][key] for key in EVAL_GENERATION_KEYS}


def eval_model_info():
    """Kind (base, adapter, baseline) and generators entry of every evaluated model, for the results table."""
    kinds = {"base": "base", **{a: "adapter" for a in ADAPTERS}, **{b: "baseline" for b in BASELINES}}
    return {model: {"kind": kinds[model], "generator": eval_generator_name(model)} for model in EVAL_MODELS}


def eval_api_key_variables():
    """The API key variables of the evaluated generators (the base one and each baseline)."""
    names = [BASE_GENERATOR] + BASELINES
    return sorted({config["generators"][n]["api_key_env"] for n in names if config["generators"][n].get("api_key_env")})


COMPILE_KEYS = ["device", "mode", "cuda_arch", "host_compiler", "timeout_s", "memory_limit_mb", "max_processes"]


def verify_settings():
    """The verify section with the build cache resolved (shared by compile and verify jobs)."""
    return {**config["verify"], "build_cache": config["verify"]["build_cache"] or results("build-cache")}


def compile_settings():
    """Only what changes a build: editing timing or correctness settings must not rerun the compile jobs."""
    return {key: value for key, value in verify_settings().items() if key in COMPILE_KEYS + ["build_cache"]}


def verify_mem_mb(wildcards, threads):
    """Host memory of a verify job: each of its `threads` children holds torch, a CUDA context and its inputs."""
    return max(16000, 4000 * threads)


def gpus(section):
    """GPUs a rule family asks for (0 on the CPU default)."""
    return config[section]["gpus"]


def _per_job(value, formula):
    """formula(value), or a function of the wildcards when `value` is one (a GPU count that differs per job)."""
    if callable(value):
        return lambda wildcards: formula(value(wildcards))
    return formula(value)


def model_job_threads(gpus):
    """Cores of a job that runs a model on `gpus` GPUs (a number, or a function of the wildcards): 4 per GPU, at
    least 2."""
    return _per_job(gpus, lambda n: max(2, 4 * n))


def model_job_resources(gpus, mem_mb, runtime):
    """Resources of a job that runs a model on `gpus` GPUs: the GPUs (`gpu`, which the SLURM profile turns into
    --gpus), `mem_mb` plus 32 GB of host memory per GPU (a large model's weights pass through it), `runtime` minutes."""
    return {"gpu": gpus, "mem_mb": _per_job(gpus, lambda n: mem_mb + 32000 * n), "runtime": runtime}


def final_targets():
    return [
        results("dataset", "concur.parquet"),
        results("dataset", "card.md"),
        *[results("adapters", name) for name in ADAPTERS],
        results("eval", "scores.csv"),
        results("eval", "table.md"),
        results("analysis", "summary.json"),
    ]

# Helper functions and constants shared by every rule file. Rules never compute paths themselves; what a stage
# receives from the config is made by concur.workflow, which the `concur` command uses too.

SHARDS = list(range(config["tasks"]["shards"]))
TEACHER = config["synthesize"]["generator"]
ADAPTERS = config["train"]["adapters"]
BASELINES = config["evaluate"]["baselines"]
EVALUATES = concur_workflow.evaluates(config)  # false without evaluate.base_generator: no eval job is planned
EVAL_MODELS = concur_workflow.eval_models(config)
DIFFICULTY_MODEL = config["evaluate"]["difficulty_model"]
TURNS = list(range(1, config["synthesize"]["turns"] + 1))  # turns of the synthesis trajectories
EVAL_TURNS = list(range(1, config["evaluate"]["turns"] + 1))  # turns of the eval trajectories


wildcard_constraints:
    shard=r"\d+",
    generator="|".join(map(re.escape, config["generators"])),
    adapter="|".join(ADAPTERS) or "(?!)",
    model="|".join(map(re.escape, EVAL_MODELS)) or "(?!)",
    turn=r"[2-9]|[1-9]\d+",  # refinement turns: turn 1 has the single-turn paths


def results(*parts):
    """A path under the configured results folder."""
    return concur_workflow.results_path(config, *parts)


def log_path(*parts):
    return results("logs", *parts) + ".log"


def benchmark_path(*parts):
    return results("benchmarks", *parts) + ".tsv"


def turn_file(kind, generator, shard, turn):
    """One shard of one turn of a stage's output (`kind`: candidates, builds or verified): turn 1 at
    `{kind}/{generator}/shard-{i}.parquet`, turn k > 1 under `turn-{k}/`."""
    return results(kind, generator, *concur_workflow.turn_dir(turn), f"shard-{shard}.parquet")


def shard_files(kind, generator=TEACHER, turns=(1,)):
    """Every shard of a stage's output for one generator (`kind`: candidates or verified), of the given turns."""
    return [turn_file(kind, generator, i, turn) for turn in turns for i in SHARDS]


def eval_file(model, name, turn=1):
    """An evaluated model's file of one turn: eval/{model}/{name}, turn k > 1 under turn-{k}/."""
    return results("eval", model, *concur_workflow.turn_dir(turn), name)


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


def eval_generator(wildcards):
    return config["generators"][concur_workflow.eval_generator_name(config, wildcards.model)]


def eval_generator_params(wildcards):
    """What eval_generate's params hold of its generator (the script reads the whole entry from the config)."""
    return concur_workflow.generator_params(config, concur_workflow.eval_generator_name(config, wildcards.model))


def eval_replay_file(wildcards):
    """The generations file of a replay baseline (nothing for model-backed generators)."""
    generator = eval_generator(wildcards)
    return [generator["path"]] if generator["backend"] == "replay" else []


def eval_gpus(wildcards):
    return concur_workflow.eval_gpus(config, wildcards.model)


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
    """The default target: the dataset, every adapter, the evaluation (when the config evaluates) and the analysis."""
    evaluation = [results("eval", "scores.csv"), results("eval", "table.md")] if EVALUATES else []
    return [
        results("dataset", "concur.parquet"),
        results("dataset", "card.md"),
        *[results("adapters", name) for name in ADAPTERS],
        *evaluation,
        results("analysis", "summary.json"),
    ]


def scores_file(wildcards):
    """The analysis's evaluation scores: eval/scores.csv when the config evaluates, else none (placeholders)."""
    return [results("eval", "scores.csv")] if EVALUATES else []

# An openai base generator's API key variable must be set before the run starts; cluster jobs receive it.
if config["generators"][config["evaluate"]["base_generator"]].get("api_key_env"):

    envvars:
        config["generators"][config["evaluate"]["base_generator"]]["api_key_env"],


rule eval_generate:
    """The base model, or the base model plus an adapter, answers every eval task `samples` times (resumable like
    synthesize, from `<output>.partial.jsonl`)."""
    input:
        tasks=results("tasks", "eval.parquet"),
        adapter=eval_adapter_dir,
    output:
        results("eval", "{model}", "candidates.parquet"),
    params:
        settings=config["evaluate"],
        generator=config["generators"][config["evaluate"]["base_generator"]],
        generator_name=config["evaluate"]["base_generator"],
        models=config["models"],
        language=config["synthesize"]["language"],
    log:
        log_path("eval", "{model}", "generate"),
    benchmark:
        benchmark_path("eval", "{model}", "generate")
    conda:
        "../envs/torch.yaml"
    threads: max(2, 4 * gpus("evaluate"))
    resources:
        gpu=gpus("evaluate"),
        mem_mb=8000 + 32000 * gpus("evaluate"),  # host memory to load a large model's weights, per GPU
        runtime=12 * 60,
    script:
        "../scripts/eval_generate.py"


rule eval_compile:
    """Build the eval generations' extensions into the shared build cache (a CPU job)."""
    input:
        candidates=results("eval", "{model}", "candidates.parquet"),
    output:
        results("eval", "{model}", "builds.parquet"),
    params:
        settings=compile_settings(),
        workdir=lambda wc: results("scratch", "eval-compile", wc.model),
    log:
        log_path("eval", "{model}", "compile"),
    benchmark:
        benchmark_path("eval", "{model}", "compile")
    conda:
        "../envs/torch.yaml"
    threads: config["verify"]["compile_threads"]
    resources:
        mem_mb=lambda wc, threads: 4000 * threads,
        runtime=6 * 60,
    script:
        "../scripts/compile.py"


rule eval_verify:
    """The same verifier as for training candidates, on the eval generations."""
    input:
        candidates=results("eval", "{model}", "candidates.parquet"),
        builds=results("eval", "{model}", "builds.parquet"),
        tasks=results("tasks", "eval.parquet"),
    output:
        results("eval", "{model}", "verified.parquet"),
    params:
        settings=verify_settings(),
        workdir=lambda wc: results("scratch", "eval", wc.model),
    log:
        log_path("eval", "{model}", "verify"),
    benchmark:
        benchmark_path("eval", "{model}", "verify")
    conda:
        "../envs/torch.yaml"
    threads: config["verify"]["workers"]
    resources:
        gpu=gpus("verify"),
        mem_mb=16000,
        runtime=6 * 60,
    script:
        "../scripts/verify.py"


rule eval_score:
    """Exec, fast_p and unbiased pass@k per model, overall, per level and per category."""
    input:
        verified=expand(results("eval", "{model}", "verified.parquet"), model=EVAL_MODELS),
        tasks=results("tasks", "eval.parquet"),
    output:
        csv=results("eval", "scores.csv"),
        markdown=results("eval", "scores.md"),
    params:
        settings=config["evaluate"],
        models=EVAL_MODELS,
    log:
        log_path("eval", "score"),
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/eval_score.py"

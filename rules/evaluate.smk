# The API key variables of openai generators evaluated (the base one, baselines) must be set before the run
# starts; cluster jobs receive them.
if eval_api_key_variables():

    envvars:
        *eval_api_key_variables(),


rule eval_generate:
    """One evaluated model answers every eval task `samples` times: the base generator, the base generator plus an
    adapter, or a baseline generator as it is (resumable like synthesize, from `<output>.partial.jsonl`)."""
    input:
        tasks=results("tasks", "eval.parquet"),
        adapter=eval_adapter_dir,
        generations=eval_replay_file,
    output:
        results("eval", "{model}", "candidates.parquet"),
    params:
        settings=eval_generation_settings(),
        generator=eval_generator,
        generator_name=lambda wc: eval_generator_name(wc.model),
        models=config["models"],
        language=config["synthesize"]["language"],
    log:
        log_path("eval", "{model}", "generate"),
    benchmark:
        benchmark_path("eval", "{model}", "generate")
    conda:
        "../envs/torch.yaml"
    threads: model_job_threads(eval_gpus)
    resources:
        **model_job_resources(eval_gpus, mem_mb=8000, runtime=12 * 60),
    script:
        "../scripts/eval_generate.py"


# the eval generations' extensions, built into the shared build cache (a CPU job)
use rule compile as eval_compile with:
    input:
        candidates=results("eval", "{model}", "candidates.parquet"),
    output:
        results("eval", "{model}", "builds.parquet"),
    params:
        workdir=lambda wc: results("scratch", "eval-compile", wc.model),
    log:
        log_path("eval", "{model}", "compile"),
    benchmark:
        benchmark_path("eval", "{model}", "compile")


# the same verifier as for training candidates, on the eval generations
use rule verify as eval_verify with:
    input:
        candidates=results("eval", "{model}", "candidates.parquet"),
        builds=results("eval", "{model}", "builds.parquet"),
        tasks=results("tasks", "eval.parquet"),
    output:
        results("eval", "{model}", "verified.parquet"),
    params:
        workdir=lambda wc: results("scratch", "eval", wc.model),
    log:
        log_path("eval", "{model}", "verify"),
    benchmark:
        benchmark_path("eval", "{model}", "verify")


rule eval_score:
    """Exec, fast_p and unbiased pass@k per model: overall, per level, per category and per ARL difficulty band;
    the paper's results table; each eval task's difficulty."""
    input:
        verified=expand(results("eval", "{model}", "verified.parquet"), model=EVAL_MODELS),
        tasks=results("tasks", "eval.parquet"),
        difficulty=results("eval", DIFFICULTY_MODEL, "candidates.parquet"),
    output:
        csv=results("eval", "scores.csv"),
        table_csv=report(
            results("eval", "table.csv"),
            caption="../report/eval_table.rst",
            category="Evaluation",
        ),
        table_md=results("eval", "table.md"),
        difficulty=results("eval", "difficulty.csv"),
    params:
        settings={key: config["evaluate"][key] for key in ("pass_k", "fast_p", "difficulty_model", "samples",
                                                            "temperature")},
        thresholds={key: config["analyze"][key] for key in ("easy_below", "hard_above")},
        models=eval_model_info(),
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

# The API key variables of openai generators evaluated (the base one, baselines) must be set before the run
# starts; cluster jobs receive them.
EVAL_API_KEYS = concur_workflow.api_key_variables(config, [config["evaluate"]["base_generator"], *BASELINES])
if EVAL_API_KEYS:

    envvars:
        *EVAL_API_KEYS,


rule eval_generate:
    """One evaluated model answers every eval task `samples` times: the base generator, the base generator plus an
    adapter, or a baseline generator as it is (resumable like synthesize, from `<output>.partial.jsonl`)."""
    input:
        tasks=results("tasks", "eval.parquet"),
        adapter=eval_adapter_dir,
        generations=eval_replay_file,
    output:
        candidates=results("eval", "{model}", "candidates.parquet"),
        report=results("eval", "{model}", "candidates.report.csv"),
    params:
        settings=concur_workflow.eval_generation_settings(config),
        generator=eval_generator_params,  # a moved server reruns nothing
        generator_name=lambda wc: concur_workflow.eval_generator_name(config, wc.model),
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
        tasks=results("tasks", "eval.parquet"),
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


rule eval_refine:
    """Turn k (evaluate.turns > 1) of one evaluated model's eval trajectories: every turn k-1 version not yet correct
    and fast enough (evaluate.stop_speedup) asked again with the verifier's feedback (resumable like eval_generate)."""
    input:
        tasks=results("tasks", "eval.parquet"),
        adapter=eval_adapter_dir,
        generations=eval_replay_file,
        history=lambda wc: [eval_file(wc.model, "candidates.parquet", t) for t in range(1, int(wc.turn))],
        verified=lambda wc: eval_file(wc.model, "verified.parquet", int(wc.turn) - 1),
    output:
        candidates=results("eval", "{model}", "turn-{turn}", "candidates.parquet"),
        report=results("eval", "{model}", "turn-{turn}", "candidates.report.csv"),
    params:
        settings=concur_workflow.eval_refine_settings(config),
        generator=eval_generator_params,  # a moved server reruns nothing
        generator_name=lambda wc: concur_workflow.eval_generator_name(config, wc.model),
        models=config["models"],
        language=config["synthesize"]["language"],
    log:
        log_path("eval", "{model}", "turn-{turn}", "generate"),
    benchmark:
        benchmark_path("eval", "{model}", "turn-{turn}", "generate")
    conda:
        "../envs/torch.yaml"
    threads: model_job_threads(eval_gpus)
    resources:
        **model_job_resources(eval_gpus, mem_mb=8000, runtime=12 * 60),
    script:
        "../scripts/eval_generate.py"


use rule compile as eval_refine_compile with:
    input:
        candidates=results("eval", "{model}", "turn-{turn}", "candidates.parquet"),
        tasks=results("tasks", "eval.parquet"),
    output:
        results("eval", "{model}", "turn-{turn}", "builds.parquet"),
    params:
        workdir=lambda wc: results("scratch", "eval-compile", wc.model, f"turn-{wc.turn}"),
    log:
        log_path("eval", "{model}", "turn-{turn}", "compile"),
    benchmark:
        benchmark_path("eval", "{model}", "turn-{turn}", "compile")


use rule verify as eval_refine_verify with:
    input:
        candidates=results("eval", "{model}", "turn-{turn}", "candidates.parquet"),
        builds=results("eval", "{model}", "turn-{turn}", "builds.parquet"),
        tasks=results("tasks", "eval.parquet"),
    output:
        results("eval", "{model}", "turn-{turn}", "verified.parquet"),
    params:
        workdir=lambda wc: results("scratch", "eval", wc.model, f"turn-{wc.turn}"),
    log:
        log_path("eval", "{model}", "turn-{turn}", "verify"),
    benchmark:
        benchmark_path("eval", "{model}", "turn-{turn}", "verify")


rule eval_score:
    """Exec, fast_p and unbiased pass@k per model (after each turn and best of trajectory): overall, per level, per
    category and per ARL difficulty band; the paper's results table; each eval task's difficulty."""
    input:
        verified=[eval_file(m, "verified.parquet", t) for m in EVAL_MODELS for t in EVAL_TURNS],
        # the trajectories (sample and turn of every verdict), with more than one turn
        trajectories=[eval_file(m, "candidates.parquet", t) for m in EVAL_MODELS for t in EVAL_TURNS]
        if len(EVAL_TURNS) > 1
        else [],
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
        settings=concur_workflow.scoring_settings(config),
        thresholds=concur_workflow.difficulty_thresholds(config),
        models=concur_workflow.eval_model_info(config),
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

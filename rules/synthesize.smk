# An openai teacher's API key variable must be set before the run starts; cluster jobs receive it.
if concur_workflow.api_key_variables(config, [TEACHER]):

    envvars:
        *concur_workflow.api_key_variables(config, [TEACHER]),


rule synthesize:
    """A generator writes samples_per_task candidates for every training task of one shard. Resumable: finished
    samples go to `<output>.partial.jsonl` (not an output, so it survives a failed job) and a rerun skips them."""
    input:
        tasks=results("tasks", "train.parquet"),
        generations=replay_file,
    output:
        candidates=results("candidates", "{generator}", "shard-{shard}.parquet"),
        report=results("candidates", "{generator}", "shard-{shard}.report.csv"),
    params:
        settings=concur_workflow.synthesis_settings(config),  # more turns rerun no first turn
        generator=lambda wc: concur_workflow.generator_params(config, wc.generator),  # a moved server reruns nothing
        models=config["models"],
        shards=len(SHARDS),
    log:
        log_path("synthesize", "{generator}", "shard-{shard}"),
    benchmark:
        benchmark_path("synthesize", "{generator}", "shard-{shard}")
    conda:
        "../envs/torch.yaml"
    threads: model_job_threads(gpus("synthesize"))
    resources:
        **model_job_resources(gpus("synthesize"), mem_mb=8000, runtime=24 * 60),
    script:
        "../scripts/synthesize.py"

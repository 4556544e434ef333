rule compile:
    """Build every candidate's extension of one shard into the shared build cache: a CPU job, so GPUs never compile.
    The tasks give each ModelNew its init inputs: extensions its __init__ loads are built here too."""
    input:
        candidates=results("candidates", "{generator}", "shard-{shard}.parquet"),
        tasks=results("tasks", "train.parquet"),
    output:
        results("builds", "{generator}", "shard-{shard}.parquet"),
    params:
        settings=concur_workflow.compile_settings(config),
        workdir=lambda wc: results("scratch", "compile", wc.generator, f"shard-{wc.shard}"),
    log:
        log_path("compile", "{generator}", "shard-{shard}"),
    benchmark:
        benchmark_path("compile", "{generator}", "shard-{shard}")
    conda:
        "../envs/torch.yaml"
    threads: config["verify"]["compile_threads"]
    resources:
        mem_mb=lambda wc, threads: 4000 * threads,
        runtime=6 * 60,
    script:
        "../scripts/compile.py"


rule verify:
    """Load, check and time every candidate of one shard against its task, each in its own process."""
    input:
        candidates=results("candidates", "{generator}", "shard-{shard}.parquet"),
        builds=results("builds", "{generator}", "shard-{shard}.parquet"),
        tasks=results("tasks", "train.parquet"),
    output:
        results("verified", "{generator}", "shard-{shard}.parquet"),
    params:
        settings=concur_workflow.verify_settings(config),
        workdir=lambda wc: results("scratch", "verify", wc.generator, f"shard-{wc.shard}"),
    log:
        log_path("verify", "{generator}", "shard-{shard}"),
    benchmark:
        benchmark_path("verify", "{generator}", "shard-{shard}")
    conda:
        "../envs/torch.yaml"
    threads: config["verify"]["workers"]
    resources:
        gpu=gpus("verify"),
        mem_mb=verify_mem_mb,
        runtime=6 * 60,
    script:
        "../scripts/verify.py"

rule verify:
    """Compile, check and time every candidate of one shard, each in its own process."""
    input:
        candidates=results("candidates", "{generator}", "shard-{shard}.parquet"),
        tasks=results("tasks", "train.parquet"),
    output:
        results("verified", "{generator}", "shard-{shard}.parquet"),
    params:
        settings=config["verify"],
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
        mem_mb=16000,
        runtime=12 * 60,
    script:
        "../scripts/verify.py"

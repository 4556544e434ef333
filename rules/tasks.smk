rule tasks:
    """Collect the configured task sources into the train and eval tables."""
    input:
        task_source_files,
    output:
        train=results("tasks", "train.parquet"),
        eval=results("tasks", "eval.parquet"),
    params:
        sources=config["tasks"]["sources"],
    log:
        log_path("tasks"),
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    script:
        "../scripts/tasks.py"

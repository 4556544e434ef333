rule tasks:
    """Collect the configured task sources into the train and eval tables; report rejected and contaminated tasks."""
    input:
        # the local files the sources read (concur.tasks.input_files), so editing a program reruns this rule
        concur_tasks.input_files(config["tasks"]["sources"]),
    output:
        train=results("tasks", "train.parquet"),
        eval=results("tasks", "eval.parquet"),
        rejected=results("tasks", "rejected.csv"),
        unchecked=results("tasks", "unchecked.csv"),
        contamination=results("tasks", "contamination.csv"),
    params:
        sources=config["tasks"]["sources"],
        settings=concur_workflow.tasks_settings(config),
    log:
        log_path("tasks"),
    conda:
        "../envs/torch.yaml"  # the references are run once on the CPU
    threads: config["tasks"]["workers"]
    resources:
        mem_mb=lambda wildcards, threads: 2000 + 3000 * threads,
        runtime=120,
    script:
        "../scripts/tasks.py"

rule curate:
    """ConCuR: the shortest-reasoning fastest kernel per task, very fast kernels, single-op balance; ablations. Over
    every turn's versions: single-turn records or whole trajectories (curate.records)."""
    input:
        candidates=shard_files("candidates", turns=TURNS),
        verified=shard_files("verified", turns=TURNS),
        tasks=results("tasks", "train.parquet"),
    output:
        dataset=results("dataset", "concur.parquet"),
        sft=results("dataset", "concur_sft.jsonl"),
        card=results("dataset", "card.md"),
        subsets=expand(results("dataset", "subsets", "{name}.parquet"), name=config["curate"]["ablations"]),
    params:
        settings=config["curate"],
    log:
        log_path("curate"),
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../scripts/curate.py"

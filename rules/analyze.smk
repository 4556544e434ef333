FIGURES = [
    "accuracy_by_length",
    "length_correct_vs_incorrect",
    "speedup_vs_length",
    "arl_difficulty",
    "accuracy_by_length_within_task",
    "speedup_vs_length_within_task",
    "eval_scores",
    "eval_by_difficulty",
]


rule analyze:
    """The paper's analysis on the synthesis run: accuracy and speedup against reasoning length, over all tasks and
    within each task, ARL difficulty; the evaluation scores overall and by difficulty."""
    input:
        candidates=shard_files("candidates"),
        verified=shard_files("verified"),
        tasks=results("tasks", "train.parquet"),
        scores=scores_file,
    output:
        summary=results("analysis", "summary.json"),
        figures=[
            report(
                results("figures", f"{name}.png"),
                caption=f"../report/{name}.rst",
                category="Analysis",
            )
            for name in FIGURES
        ],
    params:
        settings=config["analyze"],
    log:
        log_path("analyze"),
    conda:
        "../envs/core.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=15,
    script:
        "../scripts/analyze.py"

from concur.evaluate import run_scoring
from concur.logs import logging_to

with logging_to(snakemake.log[0]):
    run_scoring(
        verified_paths=dict(zip(snakemake.params.models, snakemake.input.verified)),
        tasks_path=snakemake.input.tasks,
        difficulty_path=snakemake.input.difficulty,
        settings=snakemake.params.settings,
        thresholds=snakemake.params.thresholds,
        models=snakemake.params.models,
        outputs=snakemake.output,
    )

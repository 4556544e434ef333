from concur.evaluate import run_scoring
from concur.logs import logging_to

with logging_to(snakemake.log[0]):
    run_scoring(
        verified_paths=dict(zip(snakemake.params.models, snakemake.input.verified)),
        tasks_path=snakemake.input.tasks,
        settings=snakemake.params.settings,
        csv_path=snakemake.output.csv,
        markdown_path=snakemake.output.markdown,
    )

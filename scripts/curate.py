from concur.curate import run
from concur.logs import logging_to

with logging_to(snakemake.log[0]):
    run(
        candidate_paths=snakemake.input.candidates,
        verified_paths=snakemake.input.verified,
        tasks_path=snakemake.input.tasks,
        settings=snakemake.params.settings,
        outputs=snakemake.output,
    )

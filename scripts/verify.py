from concur.logs import logging_to
from concur.verify import run

with logging_to(snakemake.log[0]):
    run(
        candidates_path=snakemake.input.candidates,
        tasks_path=snakemake.input.tasks,
        settings=snakemake.params.settings,
        workdir=snakemake.params.workdir,
        out_path=snakemake.output[0],
        builds_path=snakemake.input.builds,
    )

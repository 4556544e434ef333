from concur import workflow
from concur.logs import logging_to
from concur.verify import run

# params.settings holds what a verdict depends on (a change reruns the job); the job runs with the whole section
with logging_to(snakemake.log[0]):
    run(
        candidates_path=snakemake.input.candidates,
        tasks_path=snakemake.input.tasks,
        settings=workflow.verifier(snakemake.config),
        workdir=snakemake.params.workdir,
        out_path=snakemake.output[0],
        builds_path=snakemake.input.builds,
    )

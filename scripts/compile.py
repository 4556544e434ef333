from concur import workflow
from concur.logs import logging_to
from concur.verify import compile_run

# params.settings holds what a build depends on (a change reruns the job); the job runs with the whole section
with logging_to(snakemake.log[0]):
    compile_run(
        candidates_path=snakemake.input.candidates,
        settings=workflow.verifier(snakemake.config).replace(compile_workers=snakemake.threads),
        workdir=snakemake.params.workdir,
        out_path=snakemake.output[0],
        tasks_path=snakemake.input.tasks,
    )

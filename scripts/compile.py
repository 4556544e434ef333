from concur.logs import logging_to
from concur.verify import compile_run

with logging_to(snakemake.log[0]):
    compile_run(
        candidates_path=snakemake.input.candidates,
        settings={**snakemake.params.settings, "compile_workers": snakemake.threads},
        workdir=snakemake.params.workdir,
        out_path=snakemake.output[0],
        tasks_path=snakemake.input.tasks,
    )

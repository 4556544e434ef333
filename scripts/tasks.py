from concur.logs import logging_to
from concur.tasks import run

with logging_to(snakemake.log[0]):
    run(snakemake.params.sources, {"train": snakemake.output.train, "eval": snakemake.output.eval})

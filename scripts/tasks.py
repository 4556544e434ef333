from concur.logs import logging_to
from concur.tasks import run

with logging_to(snakemake.log[0]):
    run(
        snakemake.params.sources,
        {name: snakemake.output[name] for name in ("train", "eval", "rejected", "unchecked", "contamination")},
        snakemake.params.settings,
        workers=snakemake.threads,
    )

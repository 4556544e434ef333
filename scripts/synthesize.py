from concur.logs import logging_to
from concur.synthesize import run

with logging_to(snakemake.log[0]):
    run(
        tasks_path=snakemake.input.tasks,
        shard=int(snakemake.wildcards.shard),
        n_shards=snakemake.params.shards,
        generator_name=snakemake.wildcards.generator,
        config=snakemake.config,
        out_path=snakemake.output.candidates,
    )

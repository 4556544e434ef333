from concur.logs import logging_to
from concur.synthesize import run_refine

with logging_to(snakemake.log[0]):
    run_refine(
        tasks_path=snakemake.input.tasks,
        history_paths=list(snakemake.input.history),
        verified_path=snakemake.input.verified,
        turn=int(snakemake.wildcards.turn),
        shard=int(snakemake.wildcards.shard),
        n_shards=snakemake.params.shards,
        generator_name=snakemake.wildcards.generator,
        config=snakemake.config,
        out_path=snakemake.output.candidates,
    )

from concur.logs import logging_to
from concur.train import run

with logging_to(snakemake.log[0]):
    run(
        dataset_path=snakemake.input[0],
        model_spec=snakemake.params.model,
        settings=snakemake.params.settings,
        out_dir=snakemake.output[0],
    )

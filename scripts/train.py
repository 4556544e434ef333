from pathlib import Path

from concur.logs import logging_to
from concur.train import run

with logging_to(snakemake.log[0]):
    run(
        dataset_path=snakemake.input[0],
        model_spec=snakemake.params.model,
        settings=snakemake.params.settings,
        out_dir=snakemake.output.adapter,
        figure_path=snakemake.output.figure,
        accelerate_configs=Path(snakemake.scriptdir).parent / "configs" / "accelerate",
    )

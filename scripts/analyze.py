from concur.analyze import run
from concur.logs import logging_to

with logging_to(snakemake.log[0]):
    run(
        candidate_paths=snakemake.input.candidates,
        verified_paths=snakemake.input.verified,
        tasks_path=snakemake.input.tasks,
        scores_path=snakemake.input.scores,  # a list: empty when the config evaluates nothing
        settings=snakemake.params.settings,
        summary_path=snakemake.output.summary,
        figure_paths=snakemake.output.figures,
    )

from concur.evaluate import run_scoring
from concur.logs import logging_to


def per_model(paths, models):
    """The rule's flat list (model by model, turn by turn) as each model's list of paths, turn 1 first."""
    paths = list(paths)
    turns = len(paths) // max(1, len(models))
    return {model: paths[i * turns : (i + 1) * turns] for i, model in enumerate(models)}


with logging_to(snakemake.log[0]):
    run_scoring(
        verified_paths=per_model(snakemake.input.verified, snakemake.params.models),
        tasks_path=snakemake.input.tasks,
        difficulty_path=snakemake.input.difficulty,
        settings=snakemake.params.settings,
        thresholds=snakemake.params.thresholds,
        models=snakemake.params.models,
        outputs=snakemake.output,
        candidate_paths=per_model(snakemake.input.trajectories, snakemake.params.models)
        if snakemake.input.trajectories
        else None,
    )

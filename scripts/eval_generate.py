from concur.logs import logging_to
from concur.synthesize import run_eval_generation

# eval_generate (turn 1) and eval_refine (turn k > 1, with the earlier turns' candidates and turn k-1's verdicts)
turn = int(getattr(snakemake.wildcards, "turn", 1))
with logging_to(snakemake.log[0]):
    run_eval_generation(
        tasks_path=snakemake.input.tasks,
        adapter_dir=snakemake.input.adapter[0] if snakemake.input.adapter else None,
        model_name=snakemake.wildcards.model,
        generator_name=snakemake.params.generator_name,
        generator=snakemake.config["generators"][snakemake.params.generator_name],
        model_specs=snakemake.params.models,
        settings=snakemake.params.settings,
        language=snakemake.params.language,
        out_path=snakemake.output.candidates,
        turn=turn,
        history_paths=list(snakemake.input.history) if turn > 1 else None,
        verified_path=snakemake.input.verified if turn > 1 else None,
    )

# Included instead of evaluate.smk when the config names no evaluate.base_generator: an eval/ target then stops
# the run, dry runs included, with one line saying why.


def evaluation_is_off(wildcards):
    raise WorkflowError(
        f"{results('eval', wildcards.path)}: evaluation is off (no evaluate.base_generator in the config); "
        "name a model-backed generators entry there to evaluate"
    )


rule evaluation_off:
    """Stands for every evaluation output when the config evaluates nothing."""
    input:
        evaluation_is_off,
    output:
        results("eval", "{path}"),
    localrule: True
    shell:
        "false"

# concur: PyTorch programs -> LLM-written kernels with reasoning -> verified -> ConCuR dataset -> LoRA -> KernelBench-style scores.
# Entry point: config, schema validation, includes, the final targets. All logic lives in src/concur.
import os
import re
import sys

from snakemake.utils import min_version

min_version("8.0")

SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, SRC)
# scripts run in their own interpreters (and conda envs): they find the package through PYTHONPATH
os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))

from concur import config as concur_config
from concur import tasks as concur_tasks
from concur import workflow as concur_workflow


configfile: "config.yaml"


report: "report/workflow.rst"


try:
    _validated = concur_config.validate(config)
except concur_config.ConfigError as err:
    raise WorkflowError(str(err))
config.clear()
config.update(_validated)


include: "rules/common.smk"
include: "rules/tasks.smk"
include: "rules/synthesize.smk"
include: "rules/verify.smk"
include: "rules/refine.smk"
include: "rules/curate.smk"
include: "rules/train.smk"
if EVALUATES:

    include: "rules/evaluate.smk"

else:

    include: "rules/no_evaluate.smk"


include: "rules/analyze.smk"


rule all:
    input:
        final_targets(),
    default_target: True

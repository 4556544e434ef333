"""LoRA supervised fine-tuning on the curated SFT records (docs/data.md §5 in, §6 out), with TRL's SFTTrainer.

`records`: our own tokenisation and loss masking, against which TRL's labels are checked. `trainer`: the trainer,
its arguments and the adapter folder. `progress`: token counts, throughput and the step log. `checkpoints`: resuming
a killed run, saving and merging the adapter. `launch`: the stage's entry point, in this process or through
`accelerate launch` of `gpus` processes (`python -m concur.train <launch.json>`). The loss figure is drawn by
`concur.figures`.
"""

from .checkpoints import FINGERPRINT, last_checkpoint, merge_adapter
from .launch import DISTRIBUTED, LAUNCH_FILE, accelerate_config_file, launch_command, main, run, run_job
from .progress import step_log
from .records import IGNORE_INDEX, masked_example, n_target_tokens, prompt_completion, select_records
from .trainer import train_adapter

__all__ = [
    "DISTRIBUTED",
    "FINGERPRINT",
    "IGNORE_INDEX",
    "LAUNCH_FILE",
    "accelerate_config_file",
    "last_checkpoint",
    "launch_command",
    "main",
    "masked_example",
    "merge_adapter",
    "n_target_tokens",
    "prompt_completion",
    "run",
    "run_job",
    "select_records",
    "step_log",
    "train_adapter",
]

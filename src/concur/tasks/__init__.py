"""Task sources -> the tasks contract (docs/data.md §1), and the stable shard assignment.

A source (`sources`) turns a collection of PyTorch programs into rows of contracts.TASKS: the built-in suite, a
KernelBook export (or hub id, adapted by `kernelbook`), a KernelBench checkout or dataset export, or a user's folder.
Every program is then checked once (`programs`): it must parse and define Model, get_inputs and get_init_inputs,
and (with `validate_run`) its reference is sized on the meta device and, when small enough, must run on the CPU in a
forked child with a time and memory limit (`reference`). Programs that fail go to rejected.csv and never stop the run
(`stage`).
"""

from .kernelbook import adapt_kernelbook
from .programs import REQUIRED_NAMES, TaskError, categorise, check_program, count_ops, model_class
from .reference import validate_programs
from .sources import SOURCES, input_files, load_builtin, load_folder, load_kernelbench, load_kernelbook, read_table
from .stage import OUTPUTS, build_tasks, drop_duplicate_code, flag_degenerate, run, select_shard, shard_of

__all__ = [
    "OUTPUTS",
    "REQUIRED_NAMES",
    "SOURCES",
    "TaskError",
    "adapt_kernelbook",
    "build_tasks",
    "categorise",
    "check_program",
    "count_ops",
    "drop_duplicate_code",
    "flag_degenerate",
    "input_files",
    "load_builtin",
    "load_folder",
    "load_kernelbench",
    "load_kernelbook",
    "model_class",
    "read_table",
    "run",
    "select_shard",
    "shard_of",
    "validate_programs",
]

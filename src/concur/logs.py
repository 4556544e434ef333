"""Send a stage's output (Python logging, prints, compiler chatter of child processes) to its Snakemake log."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def logging_to(path: str | os.PathLike | None):
    """Redirect file descriptors 1 and 2 into `path` for the block (so subprocesses inherit it), and set up logging."""
    if path is None:
        _configure()
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    failure = None
    with open(path, "a", buffering=1) as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            _configure()
            yield
        except Exception as err:
            logging.getLogger("concur").exception("stage failed")
            failure = err
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if failure is not None:  # the one line a user reads in Snakemake's output; details stay in the log
                print(f"concur: {failure} (log: {path})", file=sys.stderr, flush=True)


def _configure() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True, stream=sys.stderr
    )

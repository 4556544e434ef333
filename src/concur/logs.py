"""Send a stage's output (Python logging, prints, compiler chatter of child processes) to its Snakemake log."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
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


class Progress:
    """Counts finished items by outcome and logs "{verb} 120/200 {noun} (95 run, 5 rejected), 1m40s" at most every
    `every_s` seconds (a long stage is never silent, a big one never floods its log), and the same line at the end.
    Thread-safe: workers call `add`."""

    def __init__(self, log: logging.Logger, verb: str, noun: str, total: int, outcomes: list[str], every_s=10.0):
        self.log, self.verb, self.noun, self.total, self.every_s = log, verb, noun, total, every_s
        self.counts = Counter({outcome: 0 for outcome in outcomes})
        self.started = self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, outcome: str) -> None:
        with self.lock:
            self.counts[outcome] += 1
            if time.monotonic() - self.last >= self.every_s:
                self.last = time.monotonic()
                self.log.info("%s", self.line())

    def finish(self) -> None:
        self.log.info("%s", self.line())

    def line(self) -> str:
        seconds = round(time.monotonic() - self.started)
        elapsed = f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in self.counts.items())
        return f"{self.verb} {sum(self.counts.values())}/{self.total} {self.noun} ({outcomes}), {elapsed}"

"""`concur`: every stage of the workflow from the command line, with the same code the Snakemake scripts call."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from . import config as config_mod


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as err:  # bad input: one line, no traceback
        print(f"concur {args.command}: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concur", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate-config", help="check a config against the schema and print it with defaults")
    p.add_argument("config")
    p.set_defaults(func=_validate_config)

    p = sub.add_parser("tasks", help="build results/tasks/{train,eval}.parquet from the config's task sources")
    _config_arg(p)
    p.add_argument("--out-dir", default="results/tasks")
    p.set_defaults(func=_tasks)

    p = sub.add_parser("synthesize", help="generate candidates for one shard of the training tasks")
    _config_arg(p)
    p.add_argument("--tasks", required=True)
    p.add_argument("--generator", help="generators entry (default: synthesize.generator)")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_synthesize)

    p = sub.add_parser("verify", help="verify a candidates table (batch, as the workflow does)")
    _config_arg(p)
    p.add_argument("--candidates", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    _verify_overrides(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser("verify-one", help="verify one solution against one reference program; prints JSON")
    _config_arg(p)
    p.add_argument("--reference", required=True, help="program with Model, get_inputs, get_init_inputs")
    p.add_argument("--solution", required=True, help="program with ModelNew")
    p.add_argument("--workdir", default=None)
    _verify_overrides(p)
    p.set_defaults(func=_verify_one)
    return parser


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="config.yaml", help="workflow config (default: config.yaml)")


def _verify_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", choices=["kernelbench", "hardened"])
    p.add_argument("--timeout", type=float, dest="timeout_s")


def _load(args) -> dict:
    return config_mod.load(args.config)


def _verify_settings(args) -> dict:
    settings = dict(_load(args)["verify"])
    settings.update({k: v for k in ("device", "mode", "timeout_s") if (v := getattr(args, k)) is not None})
    return settings


def _validate_config(args) -> None:
    print(json.dumps(config_mod.load(args.config), indent=2))


def _tasks(args) -> None:
    from .tasks import run

    out = Path(args.out_dir)
    run(_load(args)["tasks"]["sources"], {split: out / f"{split}.parquet" for split in ("train", "eval")})


def _synthesize(args) -> None:
    from .synthesize import run

    cfg = _load(args)
    run(args.tasks, args.shard, args.shards, args.generator or cfg["synthesize"]["generator"], cfg, args.out)


def _verify(args) -> None:
    from .verify import run

    with _workdir(args.workdir) as workdir:
        run(args.candidates, args.tasks, _verify_settings(args), workdir, args.out)


def _verify_one(args) -> None:
    from .verify import verify_one

    reference, solution = Path(args.reference).read_text(), Path(args.solution).read_text()
    with _workdir(args.workdir) as workdir:
        verdict = verify_one(reference, solution, _verify_settings(args), Path(workdir))
    # strict JSON for the tools users pipe this into: NaN (not measured) becomes null
    clean = {k: None if isinstance(v, float) and v != v else v for k, v in verdict.items()}
    print(json.dumps(clean, indent=2, default=str))


class _workdir:
    """A given scratch folder, or a temporary one removed afterwards."""

    def __init__(self, path: str | None):
        self.path, self._tmp = path, None

    def __enter__(self) -> str:
        if self.path:
            Path(self.path).mkdir(parents=True, exist_ok=True)
            return self.path
        self._tmp = tempfile.TemporaryDirectory(prefix="concur-")
        return self._tmp.name

    def __exit__(self, *exc) -> None:
        if self._tmp:
            self._tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())

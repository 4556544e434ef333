"""`concur`: every stage of the workflow from the command line, with the code and the settings its rule uses.

Each subcommand reads the config (validated, defaults filled in), writes what its rule writes (reports included)
and logs the same progress and summary lines to stderr; outputs go where the workflow puts them under the config's
`results` folder unless given.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from . import config as config_mod
from . import workflow
from .logs import logging_to
from .verify.settings import VerifySettings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with logging_to(None):
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

    p = _stage(sub, "tasks", "the tasks tables and their reports (rejected, unchecked, contamination)")
    p.add_argument("--out-dir", help="folder of the five outputs (default: <results>/tasks)")
    p.add_argument("--workers", type=int, help="reference runs at once (default: tasks.workers)")
    p.set_defaults(func=_tasks)

    p = _stage(sub, "synthesize", "generate candidates for one shard of the training tasks")
    p.add_argument("--tasks", required=True)
    p.add_argument("--generator", help="generators entry (default: synthesize.generator)")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_synthesize)

    p = _stage(sub, "refine", "refinement turn k of one shard's trajectories, with the verifier's feedback")
    p.add_argument("--tasks", required=True)
    p.add_argument("--turn", type=int, required=True, help="the turn to write (2, 3, …)")
    p.add_argument("--history", nargs="+", required=True, help="the shard's candidates of turns 1 … k-1")
    p.add_argument("--verified", required=True, help="the shard's verdicts of turn k-1")
    p.add_argument("--generator", help="generators entry (default: synthesize.generator)")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_refine)

    p = _stage(sub, "compile", "build a candidates table's extensions into the build cache (a CPU job)")
    p.add_argument("--candidates", required=True)
    p.add_argument(
        "--tasks",
        help="the tasks table: each ModelNew is made on its task's init inputs, so what __init__ loads "
        "is built too (without it, only on the candidate's own get_init_inputs)",
    )
    p.add_argument("--out", required=True, help="the builds table")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    _verify_overrides(p)
    p.set_defaults(func=_compile)

    p = _stage(sub, "verify", "verify a candidates table (batch, as the workflow does)")
    p.add_argument("--candidates", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--builds", help="the compile step's builds table (default: build while verifying)")
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    _verify_overrides(p)
    p.set_defaults(func=_verify)

    p = _stage(sub, "verify-one", "verify one solution against one reference program; prints JSON")
    p.add_argument("--reference", required=True, help="program with Model, get_inputs, get_init_inputs")
    p.add_argument("--solution", required=True, help="program with ModelNew")
    p.add_argument("--workdir", default=None)
    _verify_overrides(p)
    p.set_defaults(func=_verify_one)

    p = _stage(sub, "curate", "the ConCuR dataset, its SFT records, card and ablation subsets")
    p.add_argument("--candidates", nargs="+", required=True)
    p.add_argument("--verified", nargs="+", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--out-dir", help="default: <results>/dataset")
    p.set_defaults(func=_curate)

    p = _stage(sub, "train", "a LoRA adapter on a curated table")
    p.add_argument("--dataset", required=True, help="dataset/concur.parquet or an ablation subset")
    p.add_argument("--out-dir", required=True, help="the adapter folder, e.g. results/adapters/concur")
    p.add_argument("--figure", help="a copy of the loss figure (the rule's figures/train_loss_{adapter}.png)")
    p.set_defaults(func=_train)

    p = _stage(sub, "eval-generate", "one evaluated model answers every eval task")
    p.add_argument("--tasks", required=True, help="tasks/eval.parquet")
    p.add_argument("--model", required=True, help="base, a train.adapters entry or an evaluate.baselines entry")
    p.add_argument("--adapter", help="the adapter folder of an adapter model (default: <results>/adapters/<model>)")
    p.add_argument("--out", required=True)
    p.add_argument("--turn", type=int, default=1, help="a refinement turn k > 1 (eval_refine): needs the next two")
    p.add_argument("--history", nargs="+", help="the model's eval candidates of turns 1 … k-1")
    p.add_argument("--verified", help="the model's eval verdicts of turn k-1")
    p.set_defaults(func=_eval_generate)

    p = _stage(sub, "eval-score", "scores, the results table and the eval tasks' difficulty")
    p.add_argument(
        "--verified",
        nargs="+",
        required=True,
        metavar="MODEL=PATH[,PATH…]",
        help="each model's verdicts, one file per turn (evaluate.turns), turn 1 first",
    )
    p.add_argument(
        "--candidates",
        nargs="+",
        metavar="MODEL=PATH[,PATH…]",
        help="with several turns: each model's eval candidates of the same turns",
    )
    p.add_argument("--tasks", required=True, help="tasks/eval.parquet")
    p.add_argument("--difficulty", required=True, help="the difficulty model's eval candidates")
    p.add_argument("--out-dir", help="default: <results>/eval")
    p.set_defaults(func=_eval_score)

    p = _stage(sub, "analyze", "the paper's analysis of a synthesis run: summary.json and the figures")
    p.add_argument("--candidates", nargs="+", required=True)
    p.add_argument("--verified", nargs="+", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--scores", help="eval/scores.csv (without: placeholders in the evaluation figures)")
    p.add_argument("--out-dir", help="gets analysis/summary.json and figures/ (default: <results>)")
    p.set_defaults(func=_analyze)

    p = sub.add_parser("import-kernelbench", help="a KernelBench run folder as a replay file, its verdicts beside it")
    p.add_argument("run_dir", help="the run folder (level_{L}_problem_{P}_sample_{S}_kernel.py, eval_results.json)")
    p.add_argument("--out", required=True, help="the replay JSONL; recorded verdicts go to <stem>.recorded.csv")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--tasks", help="a tasks table whose kernelbench task ids the problems map to")
    where.add_argument("--kernelbench", help="a KernelBench checkout whose programs the problems map to")
    p.add_argument("--level", type=int, help="only this level (and the level of an eval_results.json naming none)")
    p.add_argument("--baseline", help="KernelBench timing JSON for reference runtimes the verdicts lack")
    p.add_argument("--strict", action="store_true", help="a problem without a task is an error, not a skip")
    p.set_defaults(func=_import_kernelbench)

    p = sub.add_parser("compare-recorded", help="a run's recorded verdicts against ours: the agreement table")
    p.add_argument("--recorded", required=True, help="the <stem>.recorded.csv of import-kernelbench")
    p.add_argument("--candidates", nargs="+", required=True)
    p.add_argument("--verified", nargs="+", required=True)
    p.set_defaults(func=_compare_recorded)
    return parser


def _stage(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--config", default="config.yaml", help="workflow config (default: config.yaml)")
    return p


# verify settings the compile and verify commands take as options (flag: the setting); choices come from the schema
VERIFY_OPTIONS = {"--device": "device", "--mode": "mode", "--timeout": "timeout_s"}


def _verify_overrides(p: argparse.ArgumentParser) -> None:
    spec = config_mod.load_schema()["properties"]["verify"]["properties"]
    for flag, key in VERIFY_OPTIONS.items():
        kind = {"number": float, "integer": int}.get(spec[key]["type"], str)
        p.add_argument(flag, dest=key, type=kind, choices=spec[key].get("enum"), help=f"verify.{key}")


def _load(args) -> dict:
    return config_mod.load(args.config)


def _overridden(settings: VerifySettings, args) -> VerifySettings:
    """`settings` with the verify options given on the command line."""
    given = {key: value for key in VERIFY_OPTIONS.values() if (value := getattr(args, key)) is not None}
    return settings.replace(**given)


def _out_dir(args, cfg: dict, *default: str) -> Path:
    return Path(args.out_dir or workflow.results_path(cfg, *default))


def _validate_config(args) -> None:
    print(json.dumps(config_mod.load(args.config), indent=2))


def _tasks(args) -> None:
    from .tasks import OUTPUTS, run

    cfg = _load(args)
    out = _out_dir(args, cfg, "tasks")
    paths = {name: out / (f"{name}.parquet" if name in ("train", "eval") else f"{name}.csv") for name in OUTPUTS}
    run(cfg["tasks"]["sources"], paths, workflow.tasks_settings(cfg), workers=args.workers or cfg["tasks"]["workers"])


def _synthesize(args) -> None:
    from .synthesize import run

    cfg = _load(args)
    run(args.tasks, args.shard, args.shards, args.generator or cfg["synthesize"]["generator"], cfg, args.out)


def _refine(args) -> None:
    from .synthesize import run_refine

    cfg = _load(args)
    generator = args.generator or cfg["synthesize"]["generator"]
    run_refine(args.tasks, args.history, args.verified, args.turn, args.shard, args.shards, generator, cfg, args.out)


def _compile(args) -> None:
    from .verify import compile_run

    settings = _overridden(workflow.verifier(_load(args)), args)
    with _workdir(args.workdir) as workdir:
        compile_run(args.candidates, settings, workdir, args.out, tasks_path=args.tasks)


def _verify(args) -> None:
    from .verify import run

    settings = _overridden(workflow.verifier(_load(args)), args)
    with _workdir(args.workdir) as workdir:
        run(args.candidates, args.tasks, settings, workdir, args.out, builds_path=args.builds)


def _verify_one(args) -> None:
    from .verify import verify_one

    reference, solution = Path(args.reference).read_text(), Path(args.solution).read_text()
    with _workdir(args.workdir) as workdir:
        # the section as written: a build cache left unset is the workdir's, not the results' (a one-off check)
        settings = _overridden(VerifySettings.from_dict(_load(args)["verify"]), args)
        verdict = verify_one(reference, solution, settings, Path(workdir))
    # strict JSON for the tools users pipe this into: NaN (not measured) becomes null
    clean = {k: None if isinstance(v, float) and v != v else v for k, v in verdict.items()}
    print(json.dumps(clean, indent=2, default=str))


def _curate(args) -> None:
    from .curate import run

    cfg = _load(args)
    out = _out_dir(args, cfg, "dataset")
    outputs = SimpleNamespace(
        dataset=out / "concur.parquet",
        sft=out / "concur_sft.jsonl",
        card=out / "card.md",
        subsets=[out / "subsets" / f"{name}.parquet" for name in cfg["curate"]["ablations"]],
    )
    run(args.candidates, args.verified, args.tasks, cfg["curate"], outputs)


def _train(args) -> None:
    from .train import run

    cfg = _load(args)
    model = cfg["models"][cfg["train"]["base_model"]]
    configs = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
    run(args.dataset, model, cfg["train"], args.out_dir, figure_path=args.figure, accelerate_configs=configs)


def _eval_generate(args) -> None:
    from .synthesize import run_eval_generation

    cfg = _load(args)
    if args.model not in workflow.eval_models(cfg):
        raise ValueError(f"{args.model!r} is not an evaluated model ({', '.join(workflow.eval_models(cfg))})")
    adapter = None
    if args.model in cfg["train"]["adapters"]:
        adapter = args.adapter or workflow.results_path(cfg, "adapters", args.model)
    name = workflow.eval_generator_name(cfg, args.model)
    settings = workflow.eval_generation_settings(cfg) if args.turn == 1 else workflow.eval_refine_settings(cfg)
    language = cfg["synthesize"]["language"]
    generator = cfg["generators"][name]
    if args.turn > 1 and not (args.history and args.verified):
        raise ValueError(f"turn {args.turn} needs --history (turns 1 … {args.turn - 1}) and --verified")
    run_eval_generation(
        args.tasks,
        adapter,
        args.model,
        name,
        generator,
        cfg["models"],
        settings,
        language,
        args.out,
        turn=args.turn,
        history_paths=args.history,
        verified_path=args.verified,
    )


def _eval_score(args) -> None:
    from .evaluate import run_scoring

    cfg = _load(args)
    verified = {model: paths.split(",") for model, paths in (item.split("=", 1) for item in args.verified)}
    candidates = {model: paths.split(",") for model, paths in (item.split("=", 1) for item in args.candidates or [])}
    out = _out_dir(args, cfg, "eval")
    outputs = SimpleNamespace(
        csv=out / "scores.csv",
        table_csv=out / "table.csv",
        table_md=out / "table.md",
        difficulty=out / "difficulty.csv",
    )
    info = workflow.eval_model_info(cfg)
    models = {model: info.get(model, {"kind": "", "generator": ""}) for model in verified}
    settings, thresholds = workflow.scoring_settings(cfg), workflow.difficulty_thresholds(cfg)
    run_scoring(verified, args.tasks, args.difficulty, settings, thresholds, models, outputs, candidates or None)


def _analyze(args) -> None:
    from .analyze import FIGURES, run

    cfg = _load(args)
    out = _out_dir(args, cfg)
    figures = [out / "figures" / name for name in FIGURES]
    summary = out / "analysis" / "summary.json"
    run(args.candidates, args.verified, args.tasks, args.scores, cfg["analyze"], summary, figures)


def _import_kernelbench(args) -> None:
    from .kernelbench_runs import import_run

    import_run(args.run_dir, args.out, args.tasks, args.kernelbench, args.level, args.baseline, args.strict)


def _compare_recorded(args) -> None:
    from .io import read_parquets
    from .kernelbench_runs import compare_recorded

    agreement = compare_recorded(args.recorded, read_parquets(args.candidates), read_parquets(args.verified))
    print(agreement.table())


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

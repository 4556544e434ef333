"""Bring an existing KernelBench run: read a run folder (what KernelBench's sample generation and
`eval_from_generations` write) into a replay file, and keep the run's own verdicts beside it for comparison only.

A run folder holds, per sample, `level_{L}_problem_{P}_sample_{S}_kernel.py` (the first code block of the answer),
optionally `..._prompt.txt` and, in some forks, the raw answer (`..._response.txt`, `..._raw.txt`,
`..._raw_response.txt`: the raw completion, or a `REASONING TRACE:`/`ANSWER:` layout that is split), the reasoning
(`..._reasoning.txt`) or a verdict of its own (`..._eval_result.json`); the single-sample script writes
`prompt_level_{L}_problem_{P}.txt`, `generated_kernel_level_{L}_problem_{P}.py` and
`eval_result_level_{L}_problem_{P}.txt` instead. `eval_results.json` maps problem ids to one verdict (older
KernelBench) or a list of them (current), or level → problem → sample → verdict (some forks), or is a list of records
naming their sample (`"solution_id": "level_1_problem_1_epoch_0_sample_3"`, forks that run several epochs).

Sample file names (and solution ids) may carry an epoch, `level_{L}_problem_{P}_epoch_{E}_sample_{S}_…`; a name
without one is epoch 0. With one epoch in the run the sample index is S; with several, samples are numbered
epoch-major, `E * (largest S + 1) + S` (largest S over the whole run), so that it stays unique per task.

The recorded verdicts go to `<out stem>.recorded.csv` and are never read by our verifier: `compare_recorded` sets
them against our own verdicts afterwards.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from . import io
from .tasks.sources import _kernelbench_root, _level_files, read_table

log = logging.getLogger(__name__)

# per-sample files of batch generation (and its forks): kind by suffix
SAMPLE_FILE = re.compile(
    r"level_(?P<level>\d+)_problem_(?P<problem>\d+)_(?:epoch_(?P<epoch>\d+)_)?sample_(?P<sample>\d+)_"
    r"(?P<suffix>kernel\.py|prompt\.txt|response\.txt|raw_response\.txt|raw\.txt|reasoning\.txt|eval_result\.json)"
)
# generate_and_eval_single_sample.py's log folder: one sample (0) per problem
SINGLE_FILE = re.compile(
    r"(?P<suffix>prompt|generated_kernel|eval_result)_level_(?P<level>\d+)_problem_(?P<problem>\d+)\.(?:txt|py)"
)
KIND = {
    "kernel.py": "kernel",
    "generated_kernel": "kernel",
    "prompt.txt": "prompt",
    "prompt": "prompt",
    "response.txt": "response",
    "raw_response.txt": "raw_response",
    "raw.txt": "raw",
    "reasoning.txt": "reasoning",
    "eval_result.json": "verdict_json",
    "eval_result": "verdict_text",
}
RESPONSE_KINDS = ("response", "raw_response", "raw")  # the raw answer, in order of preference
# files a run folder holds besides its samples: read (eval_results.json, the config) or not needed, never counted as
# unmatched; subfolders (e.g. a fork's `epoch_0_batch_0/` of rule extraction) are never read
RUN_FILES = {
    "eval_results.json",
    "pass_at_k_results.json",
    "generation_config.yaml",
    "eval_config.yaml",
    "config.yaml",
    "metrics.json",
    "llm_usage.json",
    "rules_llm_usage.json",
    "usage.log",
}
CONFIG_FILES = ("config.yaml", "generation_config.yaml")  # the first present gives the run's max_tokens, logged only
# a verdict record naming its sample (solution_id, evaluation_id) or its problem (task_id) as a string
SOLUTION_ID = re.compile(
    r"level_(?P<level>\d+)_problem_(?P<problem>\d+)(?:_epoch_(?P<epoch>\d+))?_sample_(?P<sample>\d+)"
)
PROBLEM_ID = re.compile(r"level_(?P<level>\d+)_problem_(?P<problem>\d+)")
TASK_ID = re.compile(r"kernelbench/L(?P<level>\d+)/(?P<problem>\d+)_")
TRACE_HEAD, TRACE_ANSWER, TRACE_USAGE = "REASONING TRACE:\n", "\n\nANSWER:\n", "\n\nUsage:\n"
RECORDED_COLUMNS = [
    "task_id",
    "sample_idx",
    "level",
    "problem_id",
    "compiled",
    "correct",
    "runtime_ms",
    "ref_runtime_ms",
    "speedup",
    "hardware",
    "metadata",
    "source",
]
MAX_LISTED = 20  # skipped items named one a line in the log; the rest counted


@dataclass(frozen=True)
class ImportedSample:
    """One replay record: what the run's model answered for one (task, sample)."""

    task_id: str
    sample_idx: int
    response: str
    response_kind: str  # `raw`: the saved answer; `kernel`: only the kernel file, wrapped as a fenced python block
    prompt: str | None = None
    reasoning: str | None = None
    finish_reason: str | None = None
    level: int = 0
    problem_id: int = 0
    source: str = ""

    def record(self) -> dict:
        """The replay JSONL object (keys with no value left out)."""
        keys = ("task_id", "sample_idx", "response", "prompt", "reasoning", "finish_reason", "response_kind")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class RecordedVerdict:
    """The run's own verdict on one sample, as KernelBench recorded it (runtimes in ms; NaN when not measured)."""

    task_id: str
    sample_idx: int
    level: int
    problem_id: int
    compiled: bool
    correct: bool
    runtime_ms: float
    ref_runtime_ms: float
    speedup: float
    hardware: str
    metadata: str
    source: str


@dataclass
class ImportReport:
    """What was imported and everything left out, with why."""

    samples: int = 0
    response_kinds: Counter = field(default_factory=Counter)
    with_prompt: int = 0
    with_reasoning: int = 0
    verdicts: int = 0
    unmatched_files: list[str] = field(default_factory=list)
    other_level_files: int = 0
    unmapped_problems: list[tuple[int, int]] = field(default_factory=list)
    unmapped_samples: int = 0
    empty_samples: list[tuple[int, int, int]] = field(default_factory=list)
    duplicate_samples: list[tuple[int, int, int]] = field(default_factory=list)
    duplicate_verdicts: list[tuple[int, int, int]] = field(default_factory=list)
    verdicts_without_sample: int = 0
    unkeyed_verdicts: int = 0  # verdict records naming no sample that could be told
    baseline_other_hardware: int = 0  # speedups whose reference was timed on another GPU than the kernel
    epochs: int = 1  # epochs in the sample names (a name without one is epoch 0)
    sample_stride: int = 0  # with several epochs: sample_idx = epoch * sample_stride + sample; else 0
    config_file: str | None = None
    config_max_tokens: object = None  # what the run's config says; not checked against the responses

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.response_kinds.items())) or "none"
        return (
            f"{self.samples} samples (response: {kinds}; {self.with_prompt} with prompt, {self.with_reasoning} with"
            f" reasoning), {self.verdicts} recorded verdicts; skipped: {len(self.unmatched_files)} unmatched files,"
            f" {len(self.unmapped_problems)} unmapped problems ({self.unmapped_samples} samples),"
            f" {len(self.empty_samples)} samples with neither response nor kernel,"
            f" {len(self.duplicate_samples)} duplicate samples, {len(self.duplicate_verdicts)} duplicate verdicts,"
            f" {self.verdicts_without_sample} verdicts without a sample, {self.other_level_files} files of other levels"
            + (f", {self.unkeyed_verdicts} verdicts naming no sample" if self.unkeyed_verdicts else "")
            + (
                f"; {self.epochs} epochs, sample_idx = epoch * {self.sample_stride} + sample"
                if self.sample_stride
                else ""
            )
            + (
                f"; {self.baseline_other_hardware} speedups against a baseline timed on other hardware"
                if self.baseline_other_hardware
                else ""
            )
        )


@dataclass
class RunImport:
    samples: list[ImportedSample]
    verdicts: list[RecordedVerdict]
    report: ImportReport

    def recorded_frame(self) -> pd.DataFrame:
        return pd.DataFrame([v.__dict__ for v in self.verdicts], columns=RECORDED_COLUMNS)


class TaskIndex:
    """(level, problem id) → our task id `kernelbench/L{level}/{id}_{Name}`."""

    def __init__(self, ids: dict[tuple[int, int], str], origin: str):
        self.ids, self.origin = ids, origin

    @classmethod
    def from_tasks(cls, path: str | Path) -> TaskIndex:
        """From a tasks table (parquet/JSONL with `task_id`; rows of other suites ignored)."""
        table = pd.read_parquet(path) if Path(path).suffix == ".parquet" else read_table(str(path))
        if "task_id" not in table.columns:
            raise ValueError(f"{path}: not a tasks table (no task_id column)")
        if "suite" in table.columns:
            table = table[table["suite"] == "kernelbench"]
        return cls._build(((m, str(t)) for t in table["task_id"] if (m := TASK_ID.match(str(t)))), str(path))

    @classmethod
    def from_kernelbench(cls, path: str | Path) -> TaskIndex:
        """From a KernelBench checkout (`[KernelBench/]level{N}/{id}_{Name}.py`), ids as its task source makes."""
        root = _kernelbench_root(Path(path))
        if root is None:
            raise ValueError(f"{path}: not a KernelBench checkout (no level*/ folder in it or in its KernelBench/)")
        task_ids = [
            f"kernelbench/L{level}/{program.stem}"
            for level in sorted(int(d.name[5:]) for d in root.glob("level[0-9]*") if d.name[5:].isdigit())
            for program in _level_files(root, level)
        ]
        return cls._build(((TASK_ID.match(t), t) for t in task_ids), str(path))

    @classmethod
    def _build(cls, matches, origin: str) -> TaskIndex:
        ids: dict[tuple[int, int], str] = {}
        for match, task_id in matches:
            if match is None:
                continue
            key = (int(match["level"]), int(match["problem"]))
            if key in ids and ids[key] != task_id:
                raise ValueError(f"{origin}: level {key[0]} problem {key[1]} is both {ids[key]} and {task_id}")
            ids[key] = task_id
        if not ids:
            raise ValueError(f"{origin}: no KernelBench tasks (ids kernelbench/L{{level}}/{{id}}_{{Name}})")
        return cls(ids, origin)

    def get(self, level: int, problem_id: int) -> str | None:
        return self.ids.get((level, problem_id))


@dataclass
class _Sample:
    files: dict[str, Path] = field(default_factory=dict)


def read_run(
    run_dir: str | Path,
    tasks: TaskIndex,
    level: int | None = None,
    baseline: str | Path | None = None,
    strict: bool = False,
) -> RunImport:
    """Every sample of a run folder as a replay record, and the run's recorded verdicts.

    `level` keeps only that level's files and names the level of an `eval_results.json` that records none (else the
    one level of the folder's sample files). `baseline` is a KernelBench timing file
    (`results/timing/{hardware}/baseline_time_torch.json`) giving reference runtimes that the verdicts lack.
    `strict` makes the first problem without a task an error instead of a skip.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    report = ImportReport()
    report.config_file, report.config_max_tokens = _config_max_tokens(run_dir)
    scanned = _scan(run_dir, level, report)
    if not scanned and not (run_dir / "eval_results.json").is_file():
        raise ValueError(f"{run_dir}: no KernelBench samples (level_{{L}}_problem_{{P}}_sample_{{S}}_kernel.py …)")
    if strict:  # before the verdicts are read, whose own problems would hide this one
        for lvl, pid, _, _ in sorted(scanned):
            if tasks.get(lvl, pid) is None:
                raise ValueError(f"level {lvl} problem {pid}: no KernelBench task with this id in {tasks.origin}")
    levels = {lvl for lvl, _, _, _ in scanned}
    raw_records = _recorded(run_dir, scanned, level, levels, report)
    number = _numbering([*scanned, *raw_records], report)
    found = {number(key): sample for key, sample in scanned.items()}
    records = {number(key): record for key, record in raw_records.items()}
    report.duplicate_samples = [number(key) for key in report.duplicate_samples]
    report.duplicate_verdicts = [number(key) for key in report.duplicate_verdicts]

    unmapped: Counter = Counter()
    samples: list[ImportedSample] = []
    for (lvl, pid, idx), sample in sorted(found.items()):
        task_id = tasks.get(lvl, pid)
        if task_id is None:
            unmapped[(lvl, pid)] += 1
            continue
        imported = _sample(task_id, lvl, pid, idx, sample, run_dir)
        if imported is None:
            report.empty_samples.append((lvl, pid, idx))
            continue
        samples.append(imported)
    report.unmapped_problems = sorted(unmapped)
    report.unmapped_samples = sum(unmapped.values())
    if found and not samples and report.unmapped_problems:
        lvl, pid = report.unmapped_problems[0]
        raise ValueError(f"level {lvl} problem {pid}: no KernelBench task with this id in {tasks.origin} (none mapped)")

    report.samples = len(samples)
    report.response_kinds = Counter(s.response_kind for s in samples)
    report.with_prompt = sum(s.prompt is not None for s in samples)
    report.with_reasoning = sum(s.reasoning is not None for s in samples)

    ref_ms = _baseline(baseline) if baseline else {}
    by_key = {(s.level, s.problem_id, s.sample_idx): s for s in samples}
    verdicts = []
    for key, (record, source) in sorted(records.items()):
        sample = by_key.get(key)
        if sample is None:
            report.verdicts_without_sample += 1
            continue
        base_ms, base_hardware = ref_ms.get(key[:2], (math.nan, ""))
        verdicts.append(_verdict(sample, record, source, base_ms))
        used = verdicts[-1].ref_runtime_ms == base_ms and not math.isnan(verdicts[-1].speedup)
        if used and base_hardware and verdicts[-1].hardware and base_hardware != verdicts[-1].hardware:
            report.baseline_other_hardware += 1
    report.verdicts = len(verdicts)
    return RunImport(samples, verdicts, report)


def recorded_path(out: str | Path) -> Path:
    """`<out stem>.recorded.csv` beside the replay file."""
    out = Path(out)
    return out.with_name(f"{out.stem}.recorded.csv")


def import_run(
    run_dir: str | Path,
    out: str | Path,
    tasks: str | Path | None = None,
    kernelbench: str | Path | None = None,
    level: int | None = None,
    baseline: str | Path | None = None,
    strict: bool = False,
) -> ImportReport:
    """Write a run folder's replay file (`out`, JSONL) and its recorded verdicts (`recorded_path(out)`), atomically."""
    if (tasks is None) == (kernelbench is None):
        raise ValueError("give either a tasks table or a KernelBench checkout to map problems to task ids")
    index = TaskIndex.from_tasks(tasks) if tasks is not None else TaskIndex.from_kernelbench(kernelbench)
    run = read_run(run_dir, index, level=level, baseline=baseline, strict=strict)
    _log_skipped(run.report, run_dir)
    if run.report.config_file is not None:
        log.info(
            "%s: its %s says max_tokens %s (as configured; the responses may have been cut shorter)",
            run_dir,
            run.report.config_file,
            run.report.config_max_tokens if run.report.config_max_tokens is not None else "(not set)",
        )
    if run.report.baseline_other_hardware:
        log.warning(
            "%s: %d recorded speedups divide a reference timed on another GPU (%s) by the run's kernel time",
            run_dir,
            run.report.baseline_other_hardware,
            baseline,
        )
    io.write_csv(run.recorded_frame(), recorded_path(out))
    io.write_jsonl([s.record() for s in run.samples], out)
    log.info("import-kernelbench %s: %s", run_dir, run.report.summary())
    log.info("wrote %s and %s (recorded verdicts, for comparison only)", out, recorded_path(out))
    return run.report


def _scan(run_dir: Path, level: int | None, report: ImportReport) -> dict[tuple[int, int, int, int], _Sample]:
    """(level, problem, epoch, sample) → the sample's files."""
    found: dict[tuple[int, int, int, int], _Sample] = {}
    # a name as KernelBench writes it (no leading zeros) first, so that it is the one kept beside a duplicate
    for path in sorted(run_dir.iterdir(), key=lambda p: (re.search(r"_0\d", p.name) is not None, p.name)):
        if path.is_dir() or path.name in RUN_FILES or path.name.startswith("."):
            continue
        match = SAMPLE_FILE.fullmatch(path.name) or SINGLE_FILE.fullmatch(path.name)
        if match is None:
            report.unmatched_files.append(path.name)
            continue
        groups = match.groupdict()
        key = (
            int(match["level"]),
            int(match["problem"]),
            int(groups.get("epoch") or 0),
            int(groups.get("sample") or 0),
        )
        if level is not None and key[0] != level:
            report.other_level_files += 1
            continue
        kind = KIND[match["suffix"]]
        sample = found.setdefault(key, _Sample())
        if kind in sample.files:  # e.g. problem_01 beside problem_1, or both layouts in one folder
            report.duplicate_samples.append(key)  # numbered in read_run
            continue
        sample.files[kind] = path
    return found


def _numbering(keys, report: ImportReport):
    """(level, problem, epoch, sample) → (level, problem, sample_idx): the sample with one epoch, else epoch-major."""
    keys = list(keys)
    epochs = {epoch for _, _, epoch, _ in keys}
    report.epochs = max(len(epochs), 1)
    if len(epochs) <= 1:
        report.sample_stride = 0
        return lambda key: (key[0], key[1], key[3])
    stride = max(sample for _, _, _, sample in keys) + 1
    report.sample_stride = stride
    return lambda key: (key[0], key[1], key[2] * stride + key[3])


def _config_max_tokens(run_dir: Path) -> tuple[str | None, object]:
    """(the config file's name, its top-level max_tokens or None), or (None, None) when the run keeps no config."""
    for name in CONFIG_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            log.warning("%s: not readable YAML, its max_tokens not reported", path)
            return name, None
        return name, config.get("max_tokens") if isinstance(config, dict) else None
    return None, None


def _sample(task_id: str, level: int, pid: int, idx: int, sample: _Sample, run_dir: Path) -> ImportedSample | None:
    files = sample.files
    raw_kind = next((k for k in RESPONSE_KINDS if k in files and _text(files[k]).strip()), None)
    reasoning = _text(files["reasoning"]) if "reasoning" in files else None
    if raw_kind is not None:
        response, embedded = _split_trace(_text(files[raw_kind]))
        reasoning = reasoning if reasoning is not None else embedded
        kind, source = "raw", files[raw_kind]
    elif "kernel" in files and _text(files["kernel"]).strip():
        response = f"```python\n{_text(files['kernel']).strip(chr(10))}\n```\n"
        kind, source = "kernel", files["kernel"]
    else:
        return None
    prompt = _text(files["prompt"]) if "prompt" in files else None
    return ImportedSample(
        task_id,
        idx,
        response,
        kind,
        prompt=prompt,
        reasoning=reasoning or None,
        level=level,
        problem_id=pid,
        source=source.relative_to(run_dir).as_posix(),
    )


def _split_trace(text: str) -> tuple[str, str | None]:
    """A fork's `REASONING TRACE:\\n…\\n\\nANSWER:\\n…\\n\\nUsage:\\n…` → (answer, reasoning); else (text, None)."""
    if not text.startswith(TRACE_HEAD) or TRACE_ANSWER not in text:
        return text, None
    reasoning, answer = text[len(TRACE_HEAD) :].split(TRACE_ANSWER, 1)
    if TRACE_USAGE in answer:
        answer = answer[: answer.rindex(TRACE_USAGE)]
    return answer, None if reasoning.strip() in ("", "None") else reasoning


def _recorded(run_dir, found, level, levels, report) -> dict[tuple[int, int, int, int], tuple[dict, str]]:
    """(level, problem, epoch, sample) → (verdict record, its file), from eval_results.json and per-sample verdict
    files."""
    records: dict[tuple[int, int, int, int], tuple[dict, str]] = {}

    def add(key, record, source):
        if key in records:
            report.duplicate_verdicts.append(key)  # the later one (appended last) is kept
        records[key] = (record, source)

    path = run_dir / "eval_results.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: cannot read: {err}") from None
        for keys, record in _walk(data, ()):
            key = _verdict_key(keys, record, level, levels, path)
            if key is None:
                report.unkeyed_verdicts += 1
            elif level is None or key[0] == level:
                add(key, record, path.name)
    for key, sample in sorted(found.items()):
        for kind in ("verdict_json", "verdict_text"):
            if kind in sample.files:
                file = sample.files[kind]
                record = _read_verdict_json(file) if kind == "verdict_json" else _read_verdict_text(file)
                if record is not None:
                    add(key, record, file.name)
    return records


def _walk(node, keys: tuple):
    """Every verdict record (a dict with `compiled` or `correctness`) with the numeric keys that lead to it; a list
    element under a problem without a `sample_id` gets its position."""
    if isinstance(node, dict):
        if "correctness" in node or "compiled" in node:
            yield keys, node
            return
        for k, v in node.items():
            if str(k).isdigit():
                yield from _walk(v, (*keys, int(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if keys and isinstance(v, dict) and "sample_id" not in v and ("correctness" in v or "compiled" in v):
                v = {**v, "sample_id": i}
            yield from _walk(v, keys)


def _verdict_key(keys, record, level, levels, path) -> tuple[int, int, int, int] | None:
    """(level, problem, epoch, sample) of a verdict record; None when it names no sample."""
    for name in ("solution_id", "evaluation_id"):  # a record naming its sample wherever it sits
        if isinstance(record.get(name), str) and (match := SOLUTION_ID.fullmatch(record[name])):
            return int(match["level"]), int(match["problem"]), int(match["epoch"] or 0), int(match["sample"])
    named = PROBLEM_ID.fullmatch(record["task_id"]) if isinstance(record.get("task_id"), str) else None
    if named is not None:  # the problem named, the sample by its sample_id
        sample_id = record.get("sample_id")
        if not str(sample_id).isdigit():
            return None
        return int(named["level"]), int(named["problem"]), 0, int(sample_id)
    if len(keys) == 3:  # level → problem → sample
        lvl, pid, idx = keys
    elif len(keys) in (1, 2):  # problem → verdict(s), or problem → sample → verdict
        pid = keys[0]
        idx = keys[1] if len(keys) == 2 else int(record.get("sample_id") or 0)
        lvl = int(record["level"]) if str(record.get("level", "")).isdigit() else level
        if lvl is None:
            if len(levels) != 1:
                named = ", ".join(map(str, sorted(levels))) or "none"
                raise ValueError(f"{path}: records no level and the run's samples have levels {named}: pass --level")
            lvl = next(iter(levels))
    else:
        return None
    return int(lvl), int(pid), 0, int(idx)


def _read_verdict_json(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        log.warning("%s: not valid JSON, left out", path)
        return None
    return record if isinstance(record, dict) else None


def _read_verdict_text(path: Path) -> dict | None:
    """The single-sample script's appended `str(KernelExecResult)`: the last one in the file."""
    text = _text(path).split("Problem Name:")[-1]
    compiled, correct = re.search(r"\bcompiled=(True|False)", text), re.search(r"\bcorrectness=(True|False)", text)
    if compiled is None or correct is None:
        return None
    number = r"=(-?[0-9.]+(?:[eE][-+]?\d+)?)"
    runtime, ref = re.search(r"(?<![\w])runtime" + number, text), re.search(r"\bref_runtime" + number, text)
    hardware = re.search(r"'hardware': '([^']*)'", text)
    return {
        "compiled": compiled[1] == "True",
        "correctness": correct[1] == "True",
        "runtime": float(runtime[1]) if runtime else -1.0,
        "ref_runtime": float(ref[1]) if ref else -1.0,
        "metadata": {"hardware": hardware[1]} if hardware else {},
    }


def _verdict(sample: ImportedSample, record: dict, source: str, baseline_ms: float) -> RecordedVerdict:
    runtime = _ms(record.get("runtime"))
    ref = _ms(record.get("ref_runtime"))
    ref = ref if not math.isnan(ref) else baseline_ms
    compiled, correct = bool(record.get("compiled")), bool(record.get("correctness"))
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    stats = record.get("runtime_stats") if isinstance(record.get("runtime_stats"), dict) else {}
    return RecordedVerdict(
        sample.task_id,
        sample.sample_idx,
        sample.level,
        sample.problem_id,
        compiled,
        compiled and correct,  # KernelBench counts a sample as correct only when it also compiled
        runtime,
        ref,
        ref / runtime if not (math.isnan(ref) or math.isnan(runtime)) else math.nan,
        str(metadata.get("hardware") or stats.get("hardware") or ""),
        _summarise(metadata),
        source,
    )


def _ms(value) -> float:
    """A recorded runtime (KernelBench's timers give ms); -1 and missing mean not measured."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if value > 0 and math.isfinite(value) else math.nan


def _summarise(metadata: dict, each: int = 160, total: int = 600) -> str:
    """The metadata as one line `key=value; …`, each value and the whole cut short."""
    parts = []
    for key, value in metadata.items():
        text = " ".join(str(value if not isinstance(value, list) else ", ".join(map(str, value))).split())
        parts.append(f"{key}={text[: each - 1] + '…' if len(text) > each else text}")
    line = "; ".join(parts)
    return line[: total - 1] + "…" if len(line) > total else line


def _baseline(path: str | Path) -> dict[tuple[int, int], tuple[float, str]]:
    """KernelBench's timing file {"level1": {"1_Name.py": {"mean": ms, "hardware": …}}} → (level, problem) → (mean
    ms, hardware)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read the baseline timing file: {err}") from None
    out = {}
    for level_name, problems in data.items() if isinstance(data, dict) else ():
        if not (level_name.startswith("level") and level_name[5:].isdigit() and isinstance(problems, dict)):
            continue
        for name, stats in problems.items():
            match = re.match(r"(\d+)_", name)
            if match and isinstance(stats, dict):
                out[(int(level_name[5:]), int(match[1]))] = (_ms(stats.get("mean")), str(stats.get("hardware") or ""))
    return out


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _log_skipped(report: ImportReport, run_dir) -> None:
    """One warning a skipped item (the first MAX_LISTED of each kind), then how many more."""
    for what, items in (
        ("file matching no KernelBench run pattern", [(f,) for f in report.unmatched_files]),
        ("problem without a task, its samples skipped: level {} problem {}", report.unmapped_problems),
        ("sample with neither response nor kernel: level {} problem {} sample {}", report.empty_samples),
        ("duplicate sample file, first kept: level {} problem {} sample {}", report.duplicate_samples),
        ("duplicate recorded verdict, last kept: level {} problem {} sample {}", report.duplicate_verdicts),
    ):
        for item in items[:MAX_LISTED]:
            log.warning("%s: %s", run_dir, what.format(*item) if "{}" in what else f"{what}: {item[0]}")
        if len(items) > MAX_LISTED:
            log.warning("%s: … and %d more: %s", run_dir, len(items) - MAX_LISTED, what.split(":")[0])


# comparison with our verdicts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    candidate_id: str
    task_id: str
    sample_idx: int
    recorded: str  # `correct` | `incorrect` (compiled, wrong or failed at run time) | `not_compiled`
    ours: str  # our status
    our_reason: str


@dataclass
class Agreement:
    """The run's recorded correctness against ours, on the samples both judged."""

    recorded: int  # rows of the recorded CSV
    joined: int  # of those, with a candidate and a verdict of ours
    agree: int
    disagree: int
    crosstab: pd.DataFrame  # recorded label (rows) × our status (columns), counts
    disagreements: list[Disagreement]

    def table(self, limit: int = 20) -> str:
        lines = [
            f"recorded verdicts: {self.recorded}; joined with ours: {self.joined}; correctness agrees on "
            f"{self.agree}, disagrees on {self.disagree}",
            "",
            "recorded \\ ours",
            self.crosstab.to_string() if not self.crosstab.empty else "(nothing joined)",
        ]
        if self.disagreements:
            lines += ["", "disagreements (candidate_id, task_id, sample_idx, recorded, ours, our reason):"]
            lines += [
                f"{d.candidate_id}  {d.task_id}  {d.sample_idx}  {d.recorded}  {d.ours}  {d.our_reason}"
                for d in self.disagreements[:limit]
            ]
            if len(self.disagreements) > limit:
                lines.append(f"… and {len(self.disagreements) - limit} more")
        return "\n".join(lines)


def compare_recorded(
    recorded: pd.DataFrame | str | Path, candidates: pd.DataFrame, verdicts: pd.DataFrame
) -> Agreement:
    """Set a `.recorded.csv` against our verdicts: candidates (task_id, sample_idx, candidate_id) join the two, our
    verdicts (candidate_id, status, correct, and reason when present) give ours."""
    rec = pd.read_csv(recorded) if isinstance(recorded, (str, Path)) else recorded.copy()
    for frame, cols, what in (
        (rec, ["task_id", "sample_idx", "compiled", "correct"], "recorded verdicts"),
        (candidates, ["task_id", "sample_idx", "candidate_id"], "candidates"),
        (verdicts, ["candidate_id", "status", "correct"], "verdicts"),
    ):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{what}: missing column(s) {', '.join(missing)}")
    cands = candidates[["task_id", "sample_idx", "candidate_id"]]
    doubled = cands.duplicated(["task_id", "sample_idx"])
    if doubled.any():
        row = cands[doubled].iloc[0]
        raise ValueError(
            f"candidates: {row.task_id} sample {row.sample_idx} appears more than once (one generator's only)"
        )
    ours = verdicts[["candidate_id", "status", "correct"]].assign(
        reason=verdicts["reason"] if "reason" in verdicts.columns else ""
    )
    rec = rec.assign(sample_idx=rec["sample_idx"].astype(int))
    joined = rec.merge(cands.astype({"sample_idx": int}), on=["task_id", "sample_idx"]).merge(
        ours, on="candidate_id", suffixes=("_recorded", "_ours")
    )
    label = pd.Series(
        [
            "correct" if _flag(ok) else "incorrect" if _flag(built) else "not_compiled"
            for ok, built in zip(joined["correct_recorded"], joined["compiled"])
        ],
        index=joined.index,
        dtype=object,
    )
    same = [_flag(a) == _flag(b) for a, b in zip(joined["correct_recorded"], joined["correct_ours"])]
    crosstab = pd.crosstab(label, joined["status"]) if len(joined) else pd.DataFrame()
    if len(joined):
        crosstab.index.name, crosstab.columns.name = "recorded", "ours"
    disagreements = [
        Disagreement(r.candidate_id, r.task_id, int(r.sample_idx), lab, r.status, "" if pd.isna(r.reason) else r.reason)
        for r, lab, ok in zip(joined.itertuples(), label, same)
        if not ok
    ]
    return Agreement(len(rec), len(joined), sum(same), len(same) - sum(same), crosstab, disagreements)


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value) if not pd.isna(value) else False

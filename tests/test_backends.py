"""The openai backend against a local chat-completions server, and resumable generation."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from concur.synthesize import OpenAIBackend, Request, checkpoint_path, generate_candidates

TASK = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
SETTINGS = {"seed": 7, "temperature": 0.5, "top_p": 0.9, "max_new_tokens": 32}


class Server:
    """Chat completions; `script` maps a task marker in the prompt to a list of statuses to answer in turn."""

    def __init__(self):
        self.script: list = []  # statuses (or (status, headers)) for the next requests, then 200
        self.bad_word = None  # prompts containing it get a 400
        self.reasoning = None
        self.delay = 0.0
        self.requests: list[dict] = []
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
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    step = outer.script.pop(0) if outer.script else 200
                try:
                    time.sleep(outer.delay)
                    status, headers = step if isinstance(step, tuple) else (step, {})
                    prompt = body["messages"][0]["content"]
                    if outer.bad_word and outer.bad_word in prompt:
                        status = 400
                    if status != 200:
                        self.send_response(status)
                        for k, v in headers.items():
                            self.send_header(k, v)
                        self.end_headers()
                        self.wfile.write(b'{"error": "no"}')
                        return
                    msg = {"role": "assistant", "content": f"answer seed {body['seed']}"}
                    if outer.reasoning:
                        msg["reasoning_content"] = outer.reasoning
                    data = {"choices": [{"message": msg, "finish_reason": "stop"}],
                            "usage": {"completion_tokens": 5}}
                    raw = json.dumps(data).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


def gen_config(server, **extra):
    return {"backend": "openai", "base_url": server.url, "model": "served", "backoff_s": 0.01,
            "request_timeout_s": 5, **extra}


def test_retry_after_429_and_5xx(server):
    server.script = [(429, {"Retry-After": "0.3"}), 500, 500]
    backend = OpenAIBackend(gen_config(server, max_concurrency=1), SETTINGS)
    start = time.monotonic()
    gens = list(backend.generate([Request("t/a", "p")], samples=1))
    assert time.monotonic() - start >= 0.3  # the Retry-After wait, not the 0.01 s backoff
    assert len(server.requests) == 4
    assert gens[0].response == "answer seed 7" and gens[0].finish_reason == "stop"
    assert gens[0].completion_tokens == 5
    body = server.requests[-1]
    assert body["model"] == "served" and body["n"] == 1 and body["max_tokens"] == 32 and body["top_p"] == 0.9


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


def test_reasoning_content_and_concurrency_bound(server):
    server.reasoning = "thinking hard"
    server.delay = 0.05
    backend = OpenAIBackend(gen_config(server, max_concurrency=3), SETTINGS)
    gens = list(backend.generate([Request(f"t/{i}", "p") for i in range(4)], samples=3))
    assert len(gens) == 12 and {g.reasoning for g in gens} == {"thinking hard"}
    assert sorted({g.seed for g in gens}) == [7, 8, 9]
    assert 1 < server.max_in_flight <= 3


def test_missing_api_key_env(server, monkeypatch):
    monkeypatch.delenv("CONCUR_TEST_KEY", raising=False)
    with pytest.raises(RuntimeError, match="CONCUR_TEST_KEY"):
        OpenAIBackend(gen_config(server, api_key_env="CONCUR_TEST_KEY"), SETTINGS)
    monkeypatch.setenv("CONCUR_TEST_KEY", "secret")
    OpenAIBackend(gen_config(server, api_key_env="CONCUR_TEST_KEY"), SETTINGS)


def test_resume_from_checkpoint(server, tmp_path):
    tasks = pd.DataFrame({"task_id": ["t/a", "t/b", "t/c"],
                          "code": [TASK + "# A\n", TASK + "# BADTASK\n", TASK + "# C\n"]})
    out = tmp_path / "shard-0.parquet"
    ckpt = checkpoint_path(out)
    server.bad_word = "BADTASK"
    config = gen_config(server, max_concurrency=1)
    with pytest.raises(RuntimeError, match="HTTP 400"):
        generate_candidates(tasks, "g", config, {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    done = [json.loads(line) for line in ckpt.read_text().splitlines()]
    assert 0 < len(done) < 6
    with open(ckpt, "a") as fh:
        fh.write('{"task_id": "t/c", "sample_')  # a line cut short by a killed job
    server.bad_word = None
    server.requests.clear()
    frame = generate_candidates(tasks, "g", config, {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    assert len(server.requests) == 6 - len(done)
    assert len(frame) == 6 and set(frame["task_id"]) == {"t/a", "t/b", "t/c"}
    assert (frame["completion_tokens"] == 5).all() and (frame["reasoning_tokens"] == 0).all()


class FakeVLLM:
    """Stands in for the vllm module: records the engine's arguments and answers chat() in vLLM's shapes."""

    def __init__(self):
        self.calls = {}
        fake = self

        class LLM:
            def __init__(self, **kwargs):
                fake.calls["llm"] = kwargs

            def chat(self, conversations, sampling_params, lora_request=None):
                fake.calls["chat"] = (conversations, sampling_params, lora_request)
                return [type("RequestOutput", (), {"outputs": [
                    type("CompletionOutput", (), {"text": f"<think>r{i}</think>code {j}", "token_ids": [1] * (j + 2),
                                                  "finish_reason": "length" if j else "stop"})()
                    for j in range(sampling_params.n)]})() for i in range(len(conversations))]

        class SamplingParams:
            def __init__(self, **kwargs):
                fake.calls["params"] = kwargs
                self.__dict__.update(kwargs)

        class LoRARequest:
            def __init__(self, name, idx, path):
                self.args = (name, idx, path)

        self.LLM, self.SamplingParams, self.LoRARequest = LLM, SamplingParams, LoRARequest


def test_vllm_backend_with_fake_module(monkeypatch, tmp_path):
    import sys
    import types

    fake = FakeVLLM()
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = fake.LLM, fake.SamplingParams
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = fake.LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora_request)

    tasks = pd.DataFrame({"task_id": ["t/a", "t/b"], "code": [TASK, TASK + "# b\n"]})
    specs = {"m": {"path": "org/model", "dtype": "bfloat16"}}
    generator = {"backend": "vllm", "model": "m", "max_model_len": 4096}
    settings = {**SETTINGS, "gpus": 2}
    frame = generate_candidates(tasks, "g", generator, specs, settings, "cuda", 3, adapter=tmp_path / "adapter",
                                checkpoint=tmp_path / "ck.jsonl")
    llm = fake.calls["llm"]
    assert llm["model"] == "org/model" and llm["tensor_parallel_size"] == 2 and llm["dtype"] == "bfloat16"
    assert llm["enable_lora"] is True and llm["max_model_len"] == 4096 and llm["seed"] == 7
    assert fake.calls["params"] == {"n": 3, "temperature": 0.5, "top_p": 0.9, "max_tokens": 32, "seed": 7}
    conversations, _, lora_req = fake.calls["chat"]
    assert conversations[0][0]["role"] == "user" and len(conversations) == 2
    assert lora_req.args == ("adapter", 1, str(tmp_path / "adapter"))
    assert len(frame) == 6 and set(frame["backend"]) == {"vllm"}
    assert list(frame["reasoning"].iloc[:1]) == ["r0"]
    assert list(frame["completion_tokens"].iloc[:3]) == [2, 3, 4]


def test_run_writes_parquet_and_removes_checkpoint(server, tmp_path):
    from concur.synthesize import run

    tasks_path = tmp_path / "train.parquet"
    pd.DataFrame({"task_id": ["t/a", "t/b"], "code": [TASK, TASK + "# b\n"]}).to_parquet(tasks_path)
    out = tmp_path / "candidates" / "shard-0.parquet"
    out.parent.mkdir()
    checkpoint_path(out).write_text(json.dumps({"task_id": "t/a", "sample_idx": 0, "response": "old",
                                                "finish_reason": "stop", "seed": 7}) + "\n" + '{"task_id"')
    config = {"synthesize": {**SETTINGS, "language": "cuda", "samples_per_task": 2},
              "generators": {"g": gen_config(server)}, "models": {}}
    run(str(tasks_path), 0, 1, "g", config, str(out))
    frame = pd.read_parquet(out)
    assert len(frame) == 4 and len(server.requests) == 3
    assert frame.set_index(["task_id", "sample_idx"]).loc[("t/a", 0), "response"] == "old"
    assert not checkpoint_path(out).exists()

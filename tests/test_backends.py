"""Generator backends: openai against a local chat-completions server, vllm against a stand-in module that records
its calls, and resumable generation (checkpoints) for every backend."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import torch

from concur.backends import (
    PROMPT_TOO_LONG,
    Generation,
    OpenAIBackend,
    ReplayBackend,
    Request,
    StreamError,
    TransformersBackend,
    parse_choices,
    read_stream,
)
from concur.synthesize import checkpoint_path, generate_candidates, generate_resumable

ROOT = Path(__file__).resolve().parents[1]
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
        self.usage = None  # the answer's usage instead of {"completion_tokens": 5 * n}; "absent": none
        self.too_long_word = None  # prompts containing it are refused as longer than the context (HTTP 400)
        self.cut_streams = 0  # that many streamed answers stop after their first event
        self.models = ["served"]  # GET /models lists these; None: no such route (404)
        self.models_status = 200
        self.gets: list[str] = []
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
                self.counted = True
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
                    prompt = body["messages"][0]["content"]
                    if over or (outer.bad_word and outer.bad_word in prompt):
                        status = 400
                    if outer.too_long_word and outer.too_long_word in prompt:
                        self.answer(
                            400,
                            {},
                            {
                                "error": {
                                    "message": "This model's maximum context length is 64 "
                                    "tokens. However, you requested 90 tokens",
                                    "code": "context_length_exceeded",
                                }
                            },
                        )
                    elif status == 200 and body.get("stream"):
                        self.answer_stream(body, outer.completion(body))
                    else:
                        self.answer(status, headers, outer.completion(body) if status == 200 else {"error": "no"})
                except OSError:
                    pass  # the client gave up (its timeout) and closed the connection
                finally:
                    self.answered()

            def answered(self):
                """No longer in flight: called right before a request's last bytes go out, since once they are out
                the client may send its next request before this handler returns."""
                if getattr(self, "counted", False):
                    self.counted = False
                    with outer.lock:
                        outer.in_flight -= 1

            def do_GET(self):
                outer.gets.append(self.path)
                if outer.models is None or not self.path.endswith("/models"):
                    self.answer(404, {}, {"detail": "Not Found"})
                elif outer.models_status != 200:
                    self.answer(outer.models_status, {}, {"error": {"message": "Incorrect API key provided"}})
                else:
                    self.answer(
                        200, {}, {"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models]}
                    )

            def answer_stream(self, body, data):
                """The answer as server-sent events: a role event, content and reasoning deltas a few characters at
                a time, the finish reasons, a usage event when asked for, [DONE]."""
                events = [{"choices": [{"index": c["index"], "delta": {"role": "assistant"}} for c in data["choices"]]}]
                for choice in data["choices"]:
                    msg, i = choice["message"], choice["index"]
                    for field in (outer.reasoning_field, "content"):
                        text = msg.get(field) or ""
                        events += [
                            {"choices": [{"index": i, "delta": {field: text[k : k + 4]}}]}
                            for k in range(0, len(text), 4)
                        ]
                    events.append({"choices": [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}]})
                with outer.lock:
                    cut = outer.cut_streams > 0
                    outer.cut_streams -= cut
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b": ping\n\n")
                for event in events[:1] if cut else events:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                if cut:
                    return
                if (body.get("stream_options") or {}).get("include_usage"):
                    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': data.get('usage')})}\n\n".encode())
                self.answered()
                self.wfile.write(b"data: [DONE]\n\n")

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
                self.answered()
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
        if self.usage == "absent":
            return {"choices": choices}
        return {"choices": choices, "usage": self.usage if self.usage is not None else {"completion_tokens": 5 * n}}

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
    backend = OpenAIBackend(gen_config(server, max_retries=2), SETTINGS)
    server.stop()  # nothing listens on the port any more
    with pytest.raises(RuntimeError, match=r"failed after 3 attempts \(last: URLError: .*Connection refused\)") as info:
        list(backend.generate([Request("t/a", "p")], samples=1))
    assert "\n" not in str(info.value)


def test_unreachable_url_fails_before_any_request(server, tmp_path):
    server.stop()
    ckpt = checkpoint_path(tmp_path / "shard-0.parquet")
    ckpt.write_text("kept as it is\n")
    with pytest.raises(
        RuntimeError,
        match=rf"^{server.url}/models: the list of served models failed after 2 "
        r"attempts \(last: URLError: .*Connection refused\)$",
    ) as info:
        generate_candidates(
            shard_tasks("a"), "g", gen_config(server, max_retries=1), {}, SETTINGS, "cuda", 1, checkpoint=ckpt
        )
    assert "\n" not in str(info.value)
    assert ckpt.read_text() == "kept as it is\n"  # the check comes before the checkpoint is opened


def test_model_not_served_is_one_line_naming_what_is(server):
    server.models = ["org/model-a", "org/model-b"]
    with pytest.raises(
        RuntimeError,
        match=rf"^{server.url}/models: the server does not serve model 'served' "
        r"\(it serves: org/model-a, org/model-b\)",
    ) as info:
        OpenAIBackend(gen_config(server), SETTINGS)
    assert "\n" not in str(info.value) and server.requests == []
    OpenAIBackend(gen_config(server, check_model=False), SETTINGS)  # e.g. a deployment name no list shows


def test_model_list_refusing_the_key_fails_but_a_missing_route_is_only_warned_about(server, caplog):
    server.models_status = 401
    with pytest.raises(RuntimeError, match="HTTP 401 for the list of served models: Incorrect API key provided"):
        OpenAIBackend(gen_config(server), SETTINGS)
    server.models = None  # the server has no GET /models
    backend = OpenAIBackend(gen_config(server), SETTINGS)
    assert "model 'served' not checked" in caplog.text
    assert [g.response for g in backend.generate([Request("t/a", "p")], 1)] == ["answer seed 7 choice 0"]


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


def test_server_ignoring_n_is_asked_again_for_the_missing_samples(server, caplog):
    server.ignore_n = True
    backend = OpenAIBackend(gen_config(server, max_concurrency=1), SETTINGS)
    gens = list(backend.generate([Request("t/a", "p"), Request("t/b", "p")], samples=3))
    assert [body["n"] for body in server.requests] == [3, 2, 1] * 2
    assert [body["seed"] for body in server.requests] == [7, 8, 9] * 2
    assert sorted((g.task_id, g.sample_idx, g.seed, g.response) for g in gens) == [
        (t, i, 7 + i, f"answer seed {7 + i} choice 0") for t in ("t/a", "t/b") for i in range(3)
    ]
    assert {g.completion_tokens for g in gens} == {5}  # each answer's own usage, not split
    assert caplog.text.count("ignores `n`") == 1


def test_server_answering_no_choice_or_too_many_is_one_clear_error(server):
    backend = OpenAIBackend(gen_config(server), SETTINGS)
    for choices in ([], [{"message": {"content": "x"}}] * 3):
        with pytest.raises(RuntimeError, match=f"asked for 2 choice\\(s\\), the server returned {len(choices)}"):
            parse_choices({"choices": choices}, Request("t/a", "p"), [0, 1], 7, backend.url)


@pytest.mark.parametrize(
    "usage, tokens, reasoning",
    [
        ({"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}, 12, None),  # llama.cpp, vLLM
        ({"prompt_tokens": 40, "total_tokens": 52}, 12, None),  # a total only
        ({"completion_tokens": 30, "completion_tokens_details": {"reasoning_tokens": 20}}, 30, 20),  # OpenAI reasoning
        ({"completion_tokens": None}, None, None),
        ("absent", None, None),  # no usage at all
    ],
)
def test_token_counts_from_the_usage_a_server_gives(server, tmp_path, usage, tokens, reasoning):
    server.usage = usage
    frame = generate_candidates(shard_tasks("a"), "g", gen_config(server), {}, SETTINGS, "cuda", 1)
    (gen,) = OpenAIBackend(gen_config(server), SETTINGS).generate([Request("t/a", "p")], 1)
    assert (gen.completion_tokens, gen.reasoning_tokens) == (tokens, reasoning)
    assert (frame["completion_tokens"].iloc[0], frame["reasoning_tokens"].iloc[0]) == (tokens or 0, reasoning or 0)


def test_usage_of_several_choices_is_split_with_a_warning(server, caplog):
    server.usage = {"completion_tokens": 31, "completion_tokens_details": {"reasoning_tokens": 9}}
    gens = list(OpenAIBackend(gen_config(server), SETTINGS).generate([Request("t/a", "p")], samples=3))
    assert {(g.completion_tokens, g.reasoning_tokens) for g in gens} == {(10, 3)}
    assert "each sample gets the mean" in caplog.text


def test_prompt_too_long_is_recorded_not_checkpointed_and_asked_again(server, tmp_path, caplog):
    tasks = shard_tasks("a", "b", marker="HUGE")
    ckpt = checkpoint_path(tmp_path / "shard-0.parquet")
    server.too_long_word = "HUGE"
    frame = generate_candidates(tasks, "g", gen_config(server), {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    by_task = frame.set_index("task_id")
    assert list(by_task.loc["t/b", "finish_reason"]) == [PROMPT_TOO_LONG] * 2
    assert list(by_task.loc["t/b", "response"]) == ["", ""] and list(by_task.loc["t/b", "code"]) == ["", ""]
    assert set(by_task.loc["t/a", "finish_reason"]) == {"stop", "length"}
    assert "maximum context length is 64 tokens" in caplog.text
    assert {rec["task_id"] for rec in map(json.loads, ckpt.read_text().splitlines()[1:])} == {"t/a"}
    server.requests.clear()
    server.too_long_word = None  # served with a longer context now
    frame = generate_candidates(tasks, "g", gen_config(server), {}, SETTINGS, "cuda", 2, checkpoint=ckpt)
    assert requested_tasks(server) == ["b"] and PROMPT_TOO_LONG not in set(frame["finish_reason"])


def test_a_failing_request_keeps_the_answers_in_flight(server, tmp_path):
    """One task fails at once (HTTP 400) while another is being answered: the job fails, after checkpointing it."""
    tasks = shard_tasks("a", "b", marker="BADTASK")
    ckpt = checkpoint_path(tmp_path / "shard-0.parquet")
    server.bad_word = "BADTASK"
    server.script = [{"delay": 0.5}]  # the first request (task a) is slow
    with pytest.raises(RuntimeError, match="HTTP 400"):
        generate_candidates(tasks, "g", gen_config(server, max_concurrency=2), {}, SETTINGS, "cuda", 1, checkpoint=ckpt)
    assert [json.loads(line)["task_id"] for line in ckpt.read_text().splitlines()[1:]] == ["t/a"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_streamed_answers_are_gathered_with_usage(server, field):
    server.reasoning, server.reasoning_field = "a long thought", field
    backend = OpenAIBackend(gen_config(server, stream=True), SETTINGS)
    gens = sorted(backend.generate([Request("t/a", "p")], samples=2), key=lambda g: g.sample_idx)
    body = server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["n"] == 2
    assert [(g.response, g.reasoning, g.finish_reason, g.completion_tokens) for g in gens] == [
        ("answer seed 7 choice 0", "a long thought", "stop", 5),
        ("answer seed 7 choice 1", "a long thought", "length", 5),
    ]


def test_a_cut_off_stream_is_retried_and_idle_time_is_what_times_out(server):
    server.cut_streams = 1
    backend = OpenAIBackend(gen_config(server, stream=True), SETTINGS)
    (gen,) = backend.generate([Request("t/a", "p")], samples=1)
    assert len(server.requests) == 2 and gen.response == "answer seed 7 choice 0"
    unfinished = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n'
    with pytest.raises(StreamError, match=r"ended \(closed\) before choice 0 finished"):
        read_stream([unfinished])
    with pytest.raises(StreamError, match=r"ended \(\[DONE\]\) before choice 0 finished"):  # a stream interrupted
        read_stream([unfinished, b"data: [DONE]\n"])
    with pytest.raises(StreamError, match="error event: engine overloaded"):
        read_stream([b'data: {"error": {"message": "engine overloaded"}}\n'])
    # every choice finished: a stream that ends without [DONE] is complete
    plain = read_stream([b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]}\n'])
    assert plain["choices"][0]["message"]["content"] == "x" and plain["usage"] is None


def test_checkpoint_survives_a_new_server_address(server, tmp_path):
    from concur.synthesize import checkpoint_fingerprint

    a = gen_config(server)
    b = {**a, "base_url": "http://elsewhere:8000/v1", "max_concurrency": 3, "stream": True, "request_timeout_s": 9}
    assert checkpoint_fingerprint(a, SETTINGS, 2, "cuda", None) == checkpoint_fingerprint(b, SETTINGS, 2, "cuda", None)
    for changed in ({**a, "model": "other"}, {**a, "request_n": False}):
        assert checkpoint_fingerprint(changed, SETTINGS, 2, "cuda", None) != checkpoint_fingerprint(
            a, SETTINGS, 2, "cuda", None
        )


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

            def get_tokenizer(self):  # counts characters: the engine's own tokenizer, as far as a test needs
                return lambda text, add_special_tokens=False: {"input_ids": list(text)}

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
    assert list(first["reasoning_tokens"]) == [2, 2, 2]  # "r0": the engine's tokenizer (characters here) counted
    assert set(first["tokenizer"]) == {"m (org/model)"}
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


def test_replay_reads_json_lines_whose_strings_hold_line_separators(tmp_path):
    """JSON lets U+2028 and U+0085 stand unescaped in a string (json.dumps with ensure_ascii=False, as
    concur.io.write_jsonl writes imported runs); str.splitlines would cut such a line in two."""
    path = tmp_path / "gen.jsonl"
    responses = ["a\u2028b", "c\x85d", "e\x1cf"]
    records = [{"task_id": "t/a", "sample_idx": i, "response": r} for i, r in enumerate(responses)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records), encoding="utf-8")
    generations = ReplayBackend(path).generate([Request("t/a", "p")], samples=3)
    assert sorted(g.response for g in generations) == responses


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


def test_a_moved_server_reruns_no_finished_generation(server, tmp_path):
    """Snakemake reruns a job whose params changed; the generator's transport settings are not in them: pointing a
    finished evaluation at a server that moved (base_url) and other concurrency plans nothing, another model the
    job again."""
    import subprocess
    import sys

    import yaml

    results = tmp_path / "results"
    (results / "tasks").mkdir(parents=True)
    shard_tasks("a").to_parquet(results / "tasks" / "eval.parquet")
    target = str(results / "eval" / "served" / "candidates.parquet")

    def snakemake(*args, **generator):
        overlay = tmp_path / "overlay.yaml"
        overlay.write_text(
            yaml.safe_dump(
                {
                    "results": str(results),
                    "evaluate": {"baselines": ["served"]},
                    "generators": {"served": gen_config(server, **generator)},
                }
            )
        )
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", target, "--cores", "1", *args, "--configfile", str(overlay)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    snakemake()
    assert len(pd.read_parquet(target)) == 2 and len(server.requests) == 1  # evaluate.samples 2, in one request
    assert "Nothing to be done" in snakemake("-n", base_url="http://127.0.0.1:9/v1", max_concurrency=3, stream=True)
    assert "eval_generate" in snakemake("-n", model="another-model")


# ------------------------------------------------------------------------------------------- refinement turns

REFINE = Request(
    "t/a",
    "It failed to build: fix it.",
    ({"role": "user", "content": "write it"}, {"role": "assistant", "content": "```python\nbroken\n```"}),
    (3,),
    2,
)


@pytest.mark.parametrize("request_n", [True, False])
def test_openai_sends_a_refinement_turn_as_one_chat_for_its_own_sample(server, request_n):
    backend = OpenAIBackend(gen_config(server, request_n=request_n), SETTINGS)
    gens = list(backend.generate([REFINE], samples=5))
    assert [(g.task_id, g.sample_idx, g.seed) for g in gens] == [("t/a", 3, 10)]
    (body,) = server.requests
    assert body["n"] == 1 and [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"].startswith("```python") and body["messages"][2]["content"] == REFINE.prompt


def test_vllm_answers_refinement_turns_one_sample_each(fake_vllm, tmp_path):
    other = Request("t/b", "too slow", REFINE.history, (0,), 2)
    frame = generate_candidates(
        shard_tasks("a", "b"), "g", {"backend": "vllm", "model": "m"}, {"m": {"path": "x"}}, SETTINGS, "cuda", 5
    )
    assert len(frame) == 10  # turn 1: n = samples
    fake_vllm.chats = []
    from concur.backends import VLLMBackend

    backend = VLLMBackend({"backend": "vllm", "model": "m"}, {"path": "x"}, SETTINGS)
    gens = list(backend.generate([REFINE, other], samples=5))
    assert sorted((g.task_id, g.sample_idx) for g in gens) == [("t/a", 3), ("t/b", 0)]
    ((messages, params, _),) = fake_vllm.chats
    assert params.n == 1 and [len(m) for m in messages] == [3, 3] and messages[1][2]["content"] == "too slow"


def test_transformers_encodes_the_whole_chat_and_samples_each_trajectory_alone(tmp_path):
    seen, calls = [], []

    class Tokenizer:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            seen.append(messages)
            return "text"

        def __call__(self, texts, **kwargs):
            class Enc(dict):
                def to(self, device):
                    return self

            return Enc(input_ids=torch.zeros(len(texts), 3), attention_mask=torch.ones(len(texts), 3))

    def fake_sample(batch, rows, enc, prefix, sample_idx):
        calls.append(([batch[k][0].task_id for k in rows], sample_idx))
        for k in rows:
            yield Generation(batch[k][0].task_id, sample_idx, "out", "stop", 7 + sample_idx)

    backend = TransformersBackend.__new__(TransformersBackend)
    backend.settings = {**SETTINGS, "batch_size": 4}
    backend.tokenizer, backend.device = Tokenizer(), "cpu"
    backend._prompt_cache = lambda enc: None
    backend._sample = fake_sample
    other = Request("t/b", "too slow", REFINE.history, (0,), 2)
    gens = list(backend.generate([REFINE, other], samples=5))
    assert sorted((g.task_id, g.sample_idx) for g in gens) == [("t/a", 3), ("t/b", 0)]
    assert calls == [(["t/b"], 0), (["t/a"], 3)]
    assert [len(m) for m in seen] == [3, 3] and seen[0][-1]["content"] == REFINE.prompt

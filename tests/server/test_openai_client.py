"""The official `openai` client against `target/release/starling serve` (SmolLM2-135M, CPU).

Run by scripts/test_server.sh (which .ci/run calls); needs the release binary and the cached
model (`starling model fetch smollm2-135m`).
"""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("STARLING_BIN", REPO / "target" / "release" / "starling"))
MODEL = "smollm2-135m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*extra_args, env=None, grace_s=5):
    """Starts `starling serve` on a free port; returns the process and its base URL once
    /health answers."""
    port = free_port()
    proc = subprocess.Popen(
        [str(BINARY), "serve", "--model", MODEL, "--port", str(port),
         "--max-model-len", "512", "--kv-cache-memory", "32MiB",
         "--shutdown-grace-s", str(grace_s), *extra_args],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail("server did not become healthy in 120 s")
        time.sleep(0.2)
    return proc, base


def stop(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server():
    proc, base = start_server()
    yield proc, base
    stop(proc)


@pytest.fixture(scope="module")
def client(server):
    _, base = server
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_non_stream_and_stream_agree(client):
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    full = client.completions.create(**args)
    text = full.choices[0].text
    assert "Paris" in text
    assert full.usage.completion_tokens == 8
    assert full.choices[0].finish_reason == "length"

    chunks = list(client.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_non_stream_and_stream_agree(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
    answer = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant"
    assert "Paris" in answer

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_extra_body_fields_and_logprobs(client):
    out = client.completions.create(
        model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True, "min_tokens": 4, "top_k": 5, "repetition_penalty": 1.0})
    assert out.usage.completion_tokens == 4
    assert len(out.choices[0].logprobs.tokens) == 4
    assert all(len(top) == 2 for top in out.choices[0].logprobs.top_logprobs)


def test_errors_are_openai_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10**9)
    assert "maximum context length" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", n=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    # Still serving.
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=1).usage.completion_tokens == 1


def test_sigterm_shuts_down_cleanly(server, client):
    proc, _ = server
    # A stream in flight when the signal comes is finished or aborted, never cut mid-chunk.
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stream=True,
        extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices
    proc.send_signal(signal.SIGTERM)
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason in ("length", "abort")
    assert proc.wait(timeout=30) == 0


def test_api_key_from_vllm_api_key_guards_v1(tmp_path):
    env = dict(os.environ, VLLM_API_KEY="sk-from-env")
    proc, base = start_server(env=env)
    try:
        locked = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            locked.models.list()
        good = openai.OpenAI(base_url=base + "/v1", api_key="sk-from-env", max_retries=0,
                             timeout=60)
        assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices
        # As in vLLM, only /v1 needs the key.
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            assert r.status == 200
    finally:
        stop(proc)


def test_a_second_signal_forces_exit():
    proc, base = start_server(grace_s=600)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        stream = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=400, temperature=0, stream=True,
            extra_body={"ignore_eos": True})
        assert next(iter(stream)).choices
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "the first signal drains (the grace period is 600 s)"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        assert code != 0, "a forced exit is not a clean one"
        assert "forced" in proc.stderr.read().lower()
    finally:
        stop(proc)

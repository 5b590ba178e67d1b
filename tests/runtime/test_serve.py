"""lia-serve against the official `openai` client: a real server process (`lia-serve`, uvicorn on loopback) over a
serving plan compiled for liac.tiny's checkpoint (a few dozen training steps: it writes short sentences and stops
at its EOS), run on the CPU in float32 behind the emulated GPU.

References: HF transformers' greedy `generate` of each prompt alone (fp32, the same checkpoint and chat template),
which shares nothing with the server's batching; the OpenAI API's documented shapes for what the client parses.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")  # a test dependency (pyproject's 'test' extra): present in CI

from liac.api import compile_serving  # noqa: E402
from liac.errors import LiacError  # noqa: E402
from liac.models.config import from_hf_config  # noqa: E402
from liac.plan import plan_to_yaml  # noqa: E402
from liac.runtime.serve.cli import main as lia_serve  # noqa: E402
from liac.tiny import make_tiny_checkpoint  # noqa: E402

PROMPTS = ["The GPU is", "Once upon a time", "The plan", "A large model", "The CPU computes", "The compiler",
           "At a small batch,", "Each decoder layer"]
MAX_TOKENS = [24, 9, 30, 5, 17, 12, 28, 3]
QUESTION = "What does the plan say?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(client, base url, model name, checkpoint, server process, its stderr lines, plan): a lia-serve process on a
    free port, 4 rows."""
    root = tmp_path_factory.mktemp("serve")
    checkpoint = make_tiny_checkpoint(root / "tiny-llama", steps=40)
    cfg = from_hf_config(json.loads((checkpoint / "config.json").read_text()), name="tiny-llama")
    plan = compile_serving(cfg, "spr-h100", batches=(1, 2, 4), prompt_len=32, gen_len=32).points[0].plan
    assert plan.spec.serving is not None and len(plan.spec.serving.batches) == 3
    (root / "serve.yaml").write_text(plan_to_yaml(plan))
    process = subprocess.Popen([sys.executable, "-m", "liac.runtime.serve.cli", str(root / "serve.yaml"),
                                "--weights", str(checkpoint), "--port", "0", "--emulate-gpu", "--dtype", "float32",
                                "--log-level", "warning", "--grace-seconds", "60"],
                               stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    port = None
    while port is None:
        line = process.stderr.readline()
        if not line:
            pytest.fail("lia-serve exited before listening:\n" + "".join(lines))
        lines.append(line)
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
        port = int(match.group(1)) if match else None
    drain = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    drain.start()
    base = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
    yield client, base, "tiny-llama", checkpoint, process, lines, root / "serve.yaml"
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)


@pytest.fixture(scope="module")
def hf(served):
    """(greedy text of a prompt alone, its token count), by HF transformers; chat: through the chat template."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

    checkpoint = served[3]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def generate(prompt: str, max_tokens: int, chat: bool = False) -> tuple[str, int]:
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[0, ids.shape[1]:]
        return tokenizer.decode(new, skip_special_tokens=True), len(new)

    return generate


def _metric(base: str, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(base.removesuffix("/v1") + "/metrics").read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_models_lists_the_served_model(served):
    client, _, name, *_ = served
    assert [m.id for m in client.models.list().data] == [name]


def test_completion_is_the_prompts_greedy_text(served, hf):
    client, _, name, *_ = served
    out = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    text, tokens = hf(PROMPTS[0], 24)
    assert out.object == "text_completion" and out.choices[0].text == text and text.strip()
    assert out.choices[0].finish_reason == ("stop" if tokens < 24 else "length")
    assert out.usage.completion_tokens == tokens and out.usage.prompt_tokens == 4  # BOS + 3 words
    assert out.usage.total_tokens == out.usage.prompt_tokens + tokens


def test_streamed_completion_is_the_same_text(served, hf):
    client, _, name, *_ = served
    chunks = list(client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=9, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text, tokens = hf(PROMPTS[1], 9)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) > 2 and "".join(pieces) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ("stop" if tokens < 9 else "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens


def test_chat_completion_goes_through_the_chat_template(served, hf):
    client, _, name, *_ = served
    messages = [{"role": "user", "content": QUESTION}]
    out = client.chat.completions.create(model=name, messages=messages, max_tokens=20, temperature=0)
    text, tokens = hf(QUESTION, 20, chat=True)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text and out.usage.completion_tokens == tokens
    stream = client.chat.completions.create(model=name, messages=messages, max_tokens=20, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason


def test_concurrent_requests_give_each_prompt_its_own_greedy_text(served, hf):
    """Eight clients at once on four rows: requests queue, join and leave the running batch; each one's text is
    its prompt's alone (float32), streamed or not."""
    client, base, name, *_ = served
    steps_before, sequences_before = (_metric(base, "liac_decode_batch_size_count"),
                                      _metric(base, "liac_decode_batch_size_sum"))

    def ask(index: int) -> str:
        kwargs = dict(model=name, prompt=PROMPTS[index], max_tokens=MAX_TOKENS[index], temperature=0)
        if index % 2:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))
        return client.completions.create(**kwargs).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(ask, range(len(PROMPTS))))
    assert texts == [hf(p, n)[0] for p, n in zip(PROMPTS, MAX_TOKENS)]
    steps = _metric(base, "liac_decode_batch_size_count") - steps_before
    sequences = _metric(base, "liac_decode_batch_size_sum") - sequences_before
    assert sequences > steps  # some decode steps ran several requests together


def test_several_prompts_in_one_request(served, hf):
    client, _, name, *_ = served
    out = client.completions.create(model=name, prompt=PROMPTS[2:5], max_tokens=12, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [hf(p, 12)[0] for p in PROMPTS[2:5]]


def test_stop_strings_and_max_tokens(served, hf):
    client, _, name, *_ = served
    full, _ = hf(PROMPTS[0], 24)
    assert " memory" in full
    out = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=[" memory"])
    assert out.choices[0].text == full[:full.index(" memory")] and out.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=name, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=" memory", stream=True))
    assert streamed == out.choices[0].text
    short = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=2, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2


def test_sampling_with_a_seed_is_reproducible(served):
    client, _, name, *_ = served
    kwargs = dict(model=name, prompt="The", max_tokens=16, temperature=1.5, top_p=0.95, seed=11)
    first, second = (client.completions.create(**kwargs).choices[0].text for _ in range(2))
    assert first == second
    others = {client.completions.create(**{**kwargs, "seed": s}).choices[0].text for s in range(6)}
    assert len(others) > 1  # the seed matters: it really samples


@pytest.mark.parametrize("kwargs, param", [
    (dict(max_tokens=1000), "max_tokens"),                      # past the plan's context (32 + 32 tokens)
    (dict(prompt="word " * 40), "prompt"),                      # past spec.workload.prompt_len
    (dict(temperature=3.0), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(n=2), "n"),
    (dict(logprobs=2), "logprobs"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(prompt=None), "prompt"),
])
def test_bad_requests_get_a_400_naming_the_field(served, kwargs, param):
    client, _, name, *_ = served
    request = dict(model=name, prompt="The GPU", max_tokens=4) | kwargs
    if request["prompt"] is None:
        del request["prompt"]
        with pytest.raises(openai.BadRequestError) as error:
            client.post("/completions", body=request, cast_to=object)
    else:
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(**request)
    assert error.value.status_code == 400
    body = error.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == param and body["message"]


def test_another_model_or_no_chat_messages(served):
    client, base, name, *_ = served
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert error.value.body["code"] == "model_not_found" and name in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=name, messages=[], max_tokens=2)
    assert error.value.body["param"] == "messages"
    import urllib.error
    import urllib.request

    bad = urllib.request.Request(base + "/completions", data=b"{not json", headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(bad)
    assert http.value.code == 400 and json.loads(http.value.read())["error"]["type"] == "invalid_request_error"


def test_a_client_that_leaves_frees_its_row(served):
    client, base, name, *_ = served
    before = _metric(base, 'liac_requests_total{finish_reason="cancelled"}')
    stream = client.completions.create(model=name, prompt="The", max_tokens=60, temperature=1.0, seed=3,
                                       stream=True)
    next(iter(stream))
    stream.close()  # the connection goes: the server cancels the request
    import urllib.request

    for _ in range(600):  # until the server saw it (no speed assumed: up to a minute of polling)
        health = json.loads(urllib.request.urlopen(base.removesuffix("/v1") + "/health").read())
        if _metric(base, 'liac_requests_total{finish_reason="cancelled"}') > before and health["live"] == 0:
            break
        time.sleep(0.1)
    assert _metric(base, 'liac_requests_total{finish_reason="cancelled"}') == before + 1
    assert health["live"] == 0 and health["waiting"] == 0 and health["in_flight"] == 0


def test_a_bounded_load_test_ends_by_itself_with_every_request_answered(served, tmp_path):
    """bench/serve_load.py on loopback: four streaming clients for a few seconds, then it drains and stops; every
    request completes (none cut, no errors), and its summary has the latencies it reports."""
    _, base, name, *_ = served
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from serve_load import main as load

    out = tmp_path / "load.json"
    status = load(["--url", base, "--model", name, "--clients", "4", "--seconds", "2", "--drain", "300",
                   "--prompt-len", "2:12", "--max-tokens", "4:16", "--json", str(out),
                   "--burst", "0.002"])  # the tiny model's steps take milliseconds
    summary = json.loads(out.read_text())["summary"]
    assert status == 0 and summary["errors"] == {} and summary["completed"] == summary["requests"] >= 4
    assert summary["output_tokens"] > 0 and summary["ttft_seconds"]["p99"] >= summary["ttft_seconds"]["p50"] > 0
    assert summary["itl_seconds"]["p50"] > 0
    split = summary["itl_without_prefill_seconds"]["count"] + summary["itl_beside_prefill_seconds"]["count"]
    assert 0 < split <= summary["itl_seconds"]["count"]


def test_the_load_test_splits_inter_token_gaps_by_a_newcomers_prefill():
    """Two streams, times by hand: A's gaps ending when B's (then C's) first token arrives spanned a prefill; its
    other gaps did not; B's second token, in the iteration that prefilled B, is in neither."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from serve_load import Record, split_by_prefill

    a = Record(0.0, 8, 5, chunks=[(1.0, 1), (1.5, 1), (2.3, 1), (2.8, 1), (3.9, 1)])
    b = Record(1.6, 8, 3, chunks=[(2.31, 1), (2.32, 1), (2.8, 1)])
    c = Record(3.0, 8, 1, status="cut", chunks=[(3.88, 1)])  # a newcomer whose stream was cut still prefilled
    beside, without = split_by_prefill([a, b, c], burst=0.05)
    assert beside == pytest.approx([0.8, 1.1])           # A: 1.5 → 2.3 (B's prefill), 2.8 → 3.9 (C's)
    assert without == pytest.approx([0.5, 0.5, 0.48])    # A: 1.0 → 1.5, 2.3 → 2.8; B: 2.32 → 2.8


def test_ctrl_c_finishes_the_streams_in_flight_and_exits_130(served, hf):
    """Last of the module: SIGINT with a stream in flight; it still ends (its whole greedy text), new requests
    are refused, the server exits 130 with one line."""
    client, base, name, _, process, lines, _ = served
    stream = client.completions.create(model=name, prompt=PROMPTS[6], max_tokens=28, temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    process.send_signal(signal.SIGINT)
    rest = list(chunks)
    assert first.choices[0].text + "".join(c.choices[0].text for c in rest) == hf(PROMPTS[6], 28)[0]
    assert rest[-1].choices[0].finish_reason in ("stop", "length")
    assert process.wait(timeout=120) == 130
    time.sleep(0.5)  # the drain thread's last lines
    assert "lia-serve: interrupted" in "".join(lines)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_past_the_queue_limit_a_request_gets_429_with_retry_after(served):
    """In process, over the same plan: while the batcher cannot step (its lock held), one request waits and fills
    the queue (max_waiting 1); the next one, through the HTTP app, gets 429 and Retry-After; the first still
    completes once the batcher runs."""
    import asyncio

    try:
        import httpx
    except ImportError:  # newer openai releases bring their fork of it
        import httpx2 as httpx
    from liac.runtime import Engine
    from liac.runtime.serve.app import create_app
    from liac.runtime.serve.engine import AsyncEngine, GenerateRequest

    async def main():
        engine = AsyncEngine(Engine.from_plan(served[6], served[3], emulate_gpu=True, dtype=torch.float32),
                             max_waiting=1)
        app = create_app(engine, "tiny-llama")
        body = {"model": "tiny-llama", "prompt": "The GPU", "max_tokens": 4}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://liac") as client:
            with engine._wake:  # the batcher's thread waits for this lock before it steps
                first = engine.open(GenerateRequest((1, 50, 60), 3))
                refused = await client.post("/v1/completions", json=body)
                health = (await client.get("/health")).json()
            done = await first.collect()
            again = await client.post("/v1/completions", json=body)
        await engine.shutdown(5)
        return refused, health, done, again

    refused, health, done, again = asyncio.run(main())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "queue_full" and health["waiting"] == 1
    assert done.finish_reason in ("stop", "length") and again.status_code == 200


def test_missing_extra_and_busy_port_are_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the 'serve' extra were not installed
    assert lia_serve(["plan.yaml", "--weights", "x"]) == 2
    assert capsys.readouterr().err == ("lia-serve: server: needs the optional package 'fastapi': "
                                       "pip install 'liac[serve]'\n")
    monkeypatch.undo()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert lia_serve([str(Path("plan.yaml")), "--weights", "x", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--port: 127.0.0.1:{port} is in use" in err


def test_a_mixture_of_experts_plan_is_refused_in_one_line(capsys, tmp_path):
    """lia-serve serves dense models: a Mixtral plan (the checked-in one) is refused before any weights load, and
    the batcher refuses one too."""
    import shutil

    from liac.plan import load_plan
    from liac.runtime.batching import check_servable

    source = Path(__file__).resolve().parents[2] / "plans" / "mixtral-8x7b.spr-h100" / \
        "mixtral-8x7b.spr-h100.b1-p128-g32.yaml"
    plan_file = tmp_path / "moe.yaml"
    shutil.copy(source, plan_file)
    assert lia_serve([str(plan_file), "--random-weights", "0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == (f"lia-serve: {plan_file}: model 'mixtral-8x7b' is a mixture of experts (8 experts): lia-serve and "
                   "continuous batching serve dense models only; run this plan with lia-run\n")
    with pytest.raises(LiacError, match="plan: model 'mixtral-8x7b' is a mixture of experts"):
        check_servable(load_plan(plan_file))


def test_a_negative_seed_is_one_line(capsys, tmp_path):
    """--random-weights takes what lia-run takes: a seed torch's generators accept (0 ≤ seed < 2⁶³)."""
    assert lia_serve([str(tmp_path / "plan.yaml"), "--random-weights", "-1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lia-serve: argument --random-weights: must be an integer at least 0, got '-1'")
    assert err.count("\n") == 1

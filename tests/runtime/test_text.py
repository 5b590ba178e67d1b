"""Text in, text out, through the checkpoint's own tokenizer: a BPE tokenizer trained here with the `tokenizers`
library and saved beside a tiny random Llama; every output is compared with HF `generate` + the tokenizer's decode
on the same checkpoint."""

from __future__ import annotations

import pytest
import torch
from runtime_plans import TEXT, hf_text_generate, make_plan, make_test_backend

from liac.errors import LiacError
from liac.runtime import Engine
from liac.runtime.text import encode_prompts, eos_token_ids


def _engine(text_checkpoint, policy="cpu", batch=3):
    directory, cfg, _, _ = text_checkpoint
    plan = make_plan(cfg, policy, batch=batch, prompt_len=32, gen_len=10)
    return Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32)


def test_tokenizer_round_trip(text_checkpoint):
    _, _, _, tokenizer = text_checkpoint
    rows = encode_prompts(tokenizer, TEXT[:2])
    assert all(row[0] == 1 for row in rows)  # '<s>' from the trained post-processor
    assert [tokenizer.decode(r, skip_special_tokens=True) for r in rows] == TEXT[:2]
    assert eos_token_ids(tokenizer) == (2,)
    assert tokenizer.padding_side == "left"


@pytest.mark.parametrize("policy", ("cpu", "mixed"))
def test_text_in_text_out_matcheshf_text_generate(text_checkpoint, policy):
    _, _, model, tokenizer = text_checkpoint
    engine = _engine(text_checkpoint, policy)
    prompts = ["the cat", "birds sing in the", "a dog ran in"]
    want_text, want_ids = hf_text_generate(model, tokenizer, prompts, 10)
    out = engine.generate(prompts, 10, eos_token_id=None)
    assert list(out.text) == want_text
    assert torch.equal(out.token_ids, want_ids)
    single = engine.generate(prompts[1], 10, eos_token_id=None)  # one string, alone
    assert single.text == (want_text[1],)


def test_eos_stops_text_and_batch_encoding_input(text_checkpoint):
    _, _, model, tokenizer = text_checkpoint
    engine = _engine(text_checkpoint, "partial")
    prompts = ["the sun", "the plan says where"]
    free, free_ids = hf_text_generate(model, tokenizer, prompts, 10)
    eos = int(free_ids[0, 3])  # make a token the first sequence produces the stop token
    want_text, want_ids = hf_text_generate(model, tokenizer, prompts, 10, eos=eos)
    out = engine.generate(prompts, 10, eos_token_id=eos)
    assert list(out.text) == want_text and torch.equal(out.token_ids, want_ids)
    assert out.finish_reasons[0] == "eos" and out.lengths[0] == 4
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)  # a BatchEncoding
    again = engine.generate(encoded, 10, eos_token_id=eos)
    assert again.text == out.text and torch.equal(again.token_ids, out.token_ids)


def test_default_eos_is_the_tokenizers_for_text_only(text_checkpoint, monkeypatch):
    engine = _engine(text_checkpoint, "cpu", batch=1)
    ids = torch.tensor([[1, 50, 60]])
    free = engine.generate(ids, 10).token_ids[0].tolist()  # token ids: no EOS stop by default
    assert len(free) == 10
    monkeypatch.setattr(engine.text, "eos_ids", lambda: (free[2],))
    text = engine.tokenizer.decode(ids[0, 1:])
    prompt = engine.tokenizer(text)["input_ids"]
    assert prompt == ids[0].tolist()  # the text encodes back to the same ids
    out = engine.generate(text, 10)
    assert out.lengths == (3,) and out.finish_reasons == ("eos",)


def test_chat_template(text_checkpoint):
    _, _, model, tokenizer = text_checkpoint
    engine = _engine(text_checkpoint, "cpu")
    want, _ = hf_text_generate(model, tokenizer, ["hello there"], 6, chat=True)
    assert list(engine.generate("hello there", 6, chat=True, eos_token_id=None).text) == want


def test_streamer_gets_the_prompt_then_each_token(text_checkpoint):
    engine = _engine(text_checkpoint, "cpu")

    class Recorder:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(value.tolist())

        def end(self):
            self.calls.append("end")

    recorder = Recorder()
    out = engine.generate("the cat sat", 5, eos_token_id=None, streamer=recorder)
    assert recorder.calls[0] == [engine.tokenizer("the cat sat")["input_ids"]]
    assert recorder.calls[1:-1] == [[t] for t in out.token_ids[0].tolist()] and recorder.calls[-1] == "end"
    with pytest.raises(LiacError, match="streams one sequence"):
        engine.generate(["a", "b"], 5, streamer=recorder)


def test_text_errors_are_one_line(text_checkpoint, checkpoints, tmp_path):
    directory, cfg = checkpoints("llama")  # a checkpoint without tokenizer files
    engine = Engine.from_plan(make_plan(cfg, "cpu"), directory, backend=make_test_backend("emulated"))
    with pytest.raises(LiacError, match="holds no tokenizer transformers can load"):
        engine.generate("hello", 2)
    text_engine = _engine(text_checkpoint, "cpu")
    text_engine.text.tokenizer().chat_template = None
    with pytest.raises(LiacError, match="--chat needs a chat template"):
        text_engine.generate("hello", 2, chat=True)
    with pytest.raises(LiacError, match="chat: applies to text prompts"):
        text_engine.generate([[1, 2]], 2, chat=True)

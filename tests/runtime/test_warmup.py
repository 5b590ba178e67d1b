"""The warm-up at load (runtime/engine.py `Engine.warm_up`, runtime/executor.py `Executor.warm_up`): one prefill and
one decode step at the request's shapes through the first layer of every layer group, then one whole request of two
tokens, so the first request pays no one-off costs. What it runs is derived by hand from the plans' groups; it must change no result, no transfer count
and no stream order of later requests."""

from __future__ import annotations

import torch
from runtime_plans import make_plan

from liac.models.config import ModelConfig
from liac.runtime import Engine, RandomWeights
from liac.runtime.backend import EmulatedBackend
from liac.runtime.executor import Executor
from liac.runtime.metrics import build_metrics, summary_lines

TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=4,
                   head_dim=8, ffn_dim=64, vocab_size=50, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)


def test_it_runs_the_first_layer_of_each_group_then_a_whole_request(monkeypatch):
    ran = []
    compile_op = Executor._compile

    def watched(self, op, stream_unit):
        step = compile_op(self, op, stream_unit)

        def record(frame):
            ran.append((op.layer_class, op.layer, frame.length))
            step(frame)
        return record

    monkeypatch.setattr(Executor, "_compile", watched)
    # layer 0 resident on the GPU (its own group), layers 1-3 one streamed group: the warm-up runs layers 0 and 1
    plan = make_plan(TINY, "mixed", resident_layers=1, batch=2, prompt_len=6)
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), warm_up=(2, 5))
    def layers(entries):  # (class, layer) in the order first run (ops are per sublayer: a layer runs several)
        return list(dict.fromkeys((cls, layer) for cls, layer, _ in entries))

    # first the layer-at-a-time pass over layers 0 and 1: a prefill of the request's 5 tokens, then one decode step
    cut = next(i for i, e in enumerate(ran) if e[2] == 1)  # the alone pass's decode step
    again = next(i for i in range(cut, len(ran)) if ran[i][2] == 5)  # the whole request begins
    first = [("embed", 0), ("decoder", 0), ("decoder", 1), ("head", 0)]
    assert layers(ran[:cut]) == first and layers(ran[cut:again]) == first
    # then a whole request of two tokens: every layer's prefill, then one decode step (its second token)
    whole = [("embed", 0)] + [("decoder", layer) for layer in range(4)] + [("head", 0)]
    second = next(i for i in range(again, len(ran)) if ran[i][2] == 1)
    assert layers(ran[again:second]) == whole and layers(ran[second:]) == whole
    assert {e[2] for e in ran[again:second]} == {5} and {e[2] for e in ran[second:]} == {1}
    assert engine.warmup_request == (2, 5) and engine.warmup_seconds > 0


def test_it_changes_no_result_count_or_stream_order():
    plan = make_plan(TINY, "mixed", resident_layers=1, batch=2, prompt_len=8)
    ids = torch.randint(0, TINY.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1))
    outs = {}
    for warm in (False, True):
        log: list = []
        # warmed at a longer prompt than the request's: its K, V stay past the request's positions
        engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), dtype=torch.float32,
                                  stream_log=log, warm_up=(2, 8) if warm else False)
        assert log == [] and engine.backend.transfers.totals() == dict.fromkeys(engine.backend.transfers.totals(), 0)
        out = engine.generate(ids, 5, return_logits=True)
        outs[warm] = (out.token_ids, out.logits, out.transfers, list(log))
    assert torch.equal(outs[False][0], outs[True][0])
    torch.testing.assert_close(outs[False][1], outs[True][1])
    assert outs[False][2:] == outs[True][2:]


def test_load_and_warm_up_are_reported_apart():
    plan = make_plan(TINY, "gpu", batch=2, prompt_len=8)
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend())
    metrics = build_metrics(engine, engine.generate(torch.zeros(2, 8, dtype=torch.long), 2), {})
    assert metrics["warmup"] == {"batch_size": 2, "prompt_len": 8}  # the plan's workload by default
    assert metrics["load_seconds"] > 0 and metrics["warmup_seconds"] > 0
    assert any(line.startswith("loaded in ") and "warmed up in" in line for line in summary_lines(metrics))
    cold = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), warm_up=False)
    metrics = build_metrics(cold, cold.generate(torch.zeros(2, 8, dtype=torch.long), 2), {})
    assert metrics["warmup"] is None and metrics["warmup_seconds"] == 0

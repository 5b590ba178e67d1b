"""Continuous batching (runtime/batching.py): a request's greedy tokens are HF's for that prompt alone, whether it
runs alone or joins a busy batch, under every placement kind (float32).

The reference is HF transformers' forward pass over the whole sequence at every step (`hf_greedy`, no KV cache) for
each prompt alone: it shares nothing with the batcher's rows, per-row write columns, masks, row moves and
interleaved prefills. Requests arrive at different iterations, have prompts and lengths of their own, leave at
different times (their rows are reused by later ones), and are prefilled in groups with left padding.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runtime_plans import BACKENDS, hf_greedy, hf_model_class, make_plan, make_test_backend

from liac.errors import LiacError
from liac.plan import ComputePlacement, GroupPlacement, Serving, ServingBatch, ServingBatchStatus, ServingStatus
from liac.runtime import Engine
from liac.runtime.batching import ContinuousBatcher, QueueFull, Request
from liac.runtime.sampling import SamplingParams

PROMPTS = [[5, 9, 17, 33, 4, 60, 71, 8], [44, 12, 3], [7, 7, 19, 100, 2], [81, 6], [23, 45, 67, 89, 10, 11],
           [3], [50, 51, 52, 53]]
MAX_TOKENS = [9, 12, 4, 7, 10, 6, 3]
ARRIVALS = [0, 0, 1, 3, 3, 4, 9]  # the iteration at which each request is submitted
POLICIES = ("gpu", "cpu", "partial", "mixed", "crossed", "split")
PLAN_ARGS = {"mixed": {"resident_layers": 1, "cxl_layers": 1}}


def _engine(checkpoints, family, policy, backend="emulated", batch=4):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, policy, batch=batch, prompt_len=8, gen_len=12, **PLAN_ARGS.get(policy, {}))
    return Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)


def run(batcher: ContinuousBatcher, requests, arrivals, cancel_at=None):
    """Drive the batcher: submit request i at iteration arrivals[i]; cancel (iteration, i) pairs. Returns per
    request its tokens and finish reason, and the live batch size of every decode step."""
    handles, tokens, reasons, batches = {}, {}, {}, []
    cancel_at = dict(cancel_at or {})
    iteration = 0
    while iteration <= max(arrivals) or batcher.busy:
        for index, at in enumerate(arrivals):
            if at == iteration:
                handles[index] = batcher.submit(requests[index])
        if iteration in cancel_at:
            handles[cancel_at[iteration]].cancel()
        by_id = {h.id: i for i, h in handles.items()}
        for event in batcher.step():
            index = by_id[event.request]
            if event.token is not None:
                tokens.setdefault(index, []).append(event.token)
            if event.finish_reason is not None:
                reasons[index] = event.finish_reason
        batches.append(batcher.last.decode_batch)
        iteration += 1
        assert iteration < 200
    return tokens, reasons, batches


@pytest.fixture(scope="module")
def alone(checkpoints):
    """family → HF's greedy tokens of each prompt alone (fp32, full recomputation)."""
    cache = {}

    def get(family):
        if family not in cache:
            model = hf_model_class(family).from_pretrained(checkpoints(family)[0], dtype=torch.float32).eval()
            cache[family] = [hf_greedy(model, torch.tensor([p]), n)[0][0].tolist()
                             for p, n in zip(PROMPTS, MAX_TOKENS)]
        return cache[family]
    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ("opt", "llama"))
@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_gives_its_greedy_tokens_alone_or_in_a_busy_batch(checkpoints, alone, family, policy, backend):
    requests = [Request(tuple(p), n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    with _engine(checkpoints, family, policy, backend) as engine:
        batcher = ContinuousBatcher(engine, max_prefill_tokens=16)
        tokens, reasons, batches = run(batcher, requests, ARRIVALS)
        assert [tokens[i] for i in range(len(PROMPTS))] == alone(family)
        assert all(reasons[i] == "length" for i in range(len(PROMPTS)))
        assert max(batches) == 4 and batches.count(4) > 1  # a full batch, and rows reused as requests left
        for index, request in enumerate(requests):  # and each alone through the batcher
            single = ContinuousBatcher(engine)
            assert run(single, [request], [0])[0][0] == alone(family)[index]


def test_newcomers_are_prefilled_within_the_token_budget_between_decode_steps(checkpoints):
    requests = [Request(tuple(p), n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    with _engine(checkpoints, "llama", "crossed") as engine:
        batcher = ContinuousBatcher(engine, max_prefill_tokens=8)
        for request in requests[:5]:
            batcher.submit(request)
        reports = []
        while batcher.busy:
            batcher.step()
            reports.append(dataclasses.replace(batcher.last))
    prefills = [r for r in reports if r.prefill_sequences]
    assert len(prefills) >= 3  # five arrivals at once are admitted over several iterations
    assert all(r.prefill_tokens <= 8 or r.prefill_sequences == 1 for r in prefills)
    assert all(r.decode_batch for r in reports[:-1])  # running streams decode at every iteration


def test_a_cancelled_request_frees_its_row_and_the_others_are_unaffected(checkpoints, alone):
    requests = [Request(tuple(p), n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    with _engine(checkpoints, "opt", "crossed") as engine:
        batcher = ContinuousBatcher(engine)
        tokens, reasons, _ = run(batcher, requests, ARRIVALS, cancel_at={2: 1})
    assert reasons[1] == "cancelled" and len(tokens[1]) < MAX_TOKENS[1]
    assert tokens[1] == alone("opt")[1][:len(tokens[1])]
    assert all(tokens[i] == alone("opt")[i] for i in range(len(PROMPTS)) if i != 1)


def test_stop_tokens_end_a_sequence_and_a_waiting_request_can_be_cancelled(checkpoints, alone):
    expected = alone("llama")
    stop = expected[0][3]
    with _engine(checkpoints, "llama", "gpu", batch=1) as engine:
        batcher = ContinuousBatcher(engine)
        first = batcher.submit(Request(tuple(PROMPTS[0]), MAX_TOKENS[0], stop_ids=(stop,)))
        second = batcher.submit(Request(tuple(PROMPTS[1]), MAX_TOKENS[1]))
        second.cancel()
        events = []
        while batcher.busy:
            events += batcher.step()
    mine = [e for e in events if e.request == first.id]
    assert [e.token for e in mine] == expected[0][:expected[0].index(stop) + 1]
    assert mine[-1].finish_reason == "stop"
    assert [(e.token, e.finish_reason) for e in events if e.request == second.id] == [(None, "cancelled")]


def test_sampled_tokens_do_not_depend_on_the_batch(checkpoints):
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=3)
    request = Request(tuple(PROMPTS[0]), 8, sampling)
    with _engine(checkpoints, "opt", "partial") as engine:
        own = engine.generate(torch.tensor([PROMPTS[0]]), 8, sampling=[sampling]).token_ids[0].tolist()
        busy = [Request(tuple(p), n) for p, n in zip(PROMPTS[1:4], MAX_TOKENS[1:4])]
        tokens, _, _ = run(ContinuousBatcher(engine), busy + [request], [0, 0, 1, 2])
    assert tokens[3] == own


def test_the_queue_limit_and_the_plan_limits(checkpoints):
    with _engine(checkpoints, "opt", "gpu") as engine:
        batcher = ContinuousBatcher(engine, max_waiting=2)
        batcher.submit(Request((1, 2), 3))
        batcher.submit(Request((1, 2), 3))
        with pytest.raises(QueueFull):
            batcher.submit(Request((1, 2), 3))
        with pytest.raises(LiacError, match="max_tokens: must be between 1 and 18"):
            batcher.check(Request((1, 2), 19))
        with pytest.raises(LiacError, match="prompt: must have 1 to 8 tokens"):
            batcher.check(Request(tuple(range(9)), 2))


def _serving(plan, small: int, decode_device: str):
    """`plan` as a serving plan: batch `small` computes every decoder sublayer on `decode_device` in decode (its
    weights and KV stay where the plan puts them), the plan's batch as the plan places it."""
    def placed(group, device=None):
        return GroupPlacement(group.name, tuple(
            ComputePlacement(s.name, s.prefill, device if device and group.layer_class == "decoder" else s.decode,
                             s.prefill_cpu_permille,
                             ({"cpu": 1000, "gpu": 0}[device] if device and group.layer_class == "decoder"
                              else s.decode_cpu_permille))
            for s in group.sublayers))

    top = plan.spec.workload.batch_size
    batches = (ServingBatch(small, 1, tuple(placed(g, decode_device) for g in plan.spec.layer_groups)),
               ServingBatch(top, 1, tuple(placed(g) for g in plan.spec.layer_groups)))
    rows = tuple(ServingBatchStatus(b.batch_size, 0.5, 0.1, 0.1, 0.1, 0.1) for b in batches)
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, serving=Serving(batches)),
                               status=dataclasses.replace(plan.status, serving=ServingStatus(rows)))


def test_each_step_runs_the_placement_planned_for_the_live_batch_size(checkpoints, alone):
    directory, cfg = checkpoints("opt")
    plan = _serving(make_plan(cfg, "crossed", batch=4, prompt_len=8, gen_len=12), 2, "cpu")
    used = []
    with Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32) as engine:
        plain = engine.executor_for

        def spy(live):
            executor = plain(live)
            used.append((live, executor.schedule.phases["decode"].ops))
            return executor

        engine.executor_for = spy
        requests = [Request(tuple(p), n) for p, n in zip(PROMPTS, MAX_TOKENS)]
        tokens, _, _ = run(ContinuousBatcher(engine), requests, ARRIVALS)
    assert [tokens[i] for i in range(len(PROMPTS))] == alone("opt")
    small = {live for live, _ in used if live <= 2}
    assert small and any(live > 2 for live, _ in used)
    for live, ops in used:
        decoder = [op.device for op in ops if op.layer_class == "decoder" and op.kind not in ("wait", "release")]
        if live <= 2:
            assert set(decoder) == {"cpu"}      # batch 2's placement: all on the CPU
        else:
            assert "gpu" in decoder             # the plan's own


def test_static_batching_admits_only_into_an_empty_batch(checkpoints, alone):
    """The baseline (`static=True`): a batch is admitted whole (up to its rows, past the prefill-token budget) only
    when no sequence is live, and runs until its last sequence is done; the tokens are the same as alone."""
    requests = [Request(tuple(p), n) for p, n in zip(PROMPTS, MAX_TOKENS)]
    with _engine(checkpoints, "llama", "crossed") as engine:
        batcher = ContinuousBatcher(engine, max_prefill_tokens=8, static=True)
        live_at_admission, reports = [], []
        for request in requests[:6]:
            batcher.submit(request)
        while batcher.busy:
            live_at_admission.append(sum(seq.finish is None for seq in batcher.live))  # still running
            batcher.step()
            reports.append(dataclasses.replace(batcher.last))
        tokens, _, _ = run(ContinuousBatcher(engine, static=True), requests, ARRIVALS)
    admitted = [(live, r.prefill_sequences) for live, r in zip(live_at_admission, reports) if r.prefill_sequences]
    assert admitted == [(0, 4), (0, 2)]  # four rows at once (32 prompt tokens past the budget of 8), then the rest
    assert [tokens[i] for i in range(len(PROMPTS))] == alone("llama")

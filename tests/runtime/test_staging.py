"""runtime/staging.py on its own, with hand-made stream units: what lands in a staging buffer (packed row blocks, the
past tokens of a KV window) and in which order the copies are issued against the compute stream's waits and
releases. The whole runtime's prefetch order is checked in test_schedule.py, through Engine."""

from __future__ import annotations

import pytest
import torch

from liac.runtime.backend import EmulatedBackend
from liac.runtime.kvcache import KVCache
from liac.runtime.schedule import ParamInfo, Piece, StreamUnit
from liac.runtime.staging import Streamer


class _Memory:
    """TierMemory's `take`, from plain tensors."""

    def take(self, tier, shape, dtype):
        return torch.zeros(shape, dtype=dtype)


def _streamer(buffers: int, host: dict, kv_shape=(2, 1, 5, 2), log=None) -> Streamer:
    backend = EmulatedBackend()
    kv = KVCache(backend, _Memory(), ("ddr",), kv_shape, torch.float32)
    staging = [torch.zeros(1024, dtype=torch.uint8) for _ in range(buffers)]
    return Streamer(backend, staging, lambda canonical, tier: host[(canonical, tier)], kv, torch.float32, log)


def _unit(index: int, slot: int, pieces=(), kv=()) -> StreamUnit:
    return StreamUnit(index, slot, "decoder", index, tuple(pieces), tuple(kv))


def test_a_split_units_row_blocks_are_packed_into_one_staged_tensor():
    host = torch.arange(24, dtype=torch.float32).reshape(8, 3)  # gate rows 0..3, up rows 4..7 of a gate_up
    param = ParamInfo("proj.weight", "layers.0.gate_up.proj.weight", (8, 3))
    piece = Piece(param, "ddr", 0, ((2, 2), (6, 2)))  # the GPU part: features 2..3 of both halves
    streamer = _streamer(1, {(param.canonical, "ddr"): host})
    streamer.start((_unit(0, 0, [piece]),), batch=1, past=0)
    staged = streamer.view(0, piece.offset, piece.shape)
    assert piece.shape == (4, 3)
    assert torch.equal(staged, torch.cat((host[2:4], host[6:8])))
    assert streamer.backend.transfers.streamed_bytes == 4 * 3 * 4  # the rows copied, nothing else


def test_a_kv_window_receives_the_past_tokens_of_the_batch_only():
    streamer = _streamer(1, {})
    cache = streamer.kv.k[0]  # [B=2, G=1, C=5, E=2]
    cache.copy_(torch.arange(20, dtype=torch.float32).reshape(2, 1, 5, 2) + 1)
    streamer.start((_unit(0, 0, kv=[("k", 256)]),), batch=1, past=3)
    window = streamer.window(_unit(0, 0, kv=[("k", 256)]), "k")
    assert window.shape == cache.shape
    assert torch.equal(window[0, :, :3], cache[0, :, :3])  # the past of the one sequence that runs
    assert not window[0, :, 3:].any() and not window[1].any()  # nor the future, nor the sequence beyond the batch
    assert streamer.backend.transfers.streamed_bytes == 1 * 1 * 3 * 2 * 4
    new = torch.full((1, 1, 1, 2), -1.0)
    assert torch.equal(streamer.kv.write_window(window, new, 3)[0, :, 3], new[0, :, 0])  # this step's token at the end


@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_unit_i_plus_n_is_issued_only_when_unit_i_releases_its_buffer(buffers):
    log = []
    streamer = _streamer(buffers, {}, log=log)
    units = tuple(_unit(i, i % buffers) for i in range(5))
    streamer.start(units, batch=1, past=0)
    assert log == [("start", 0)] + [("issue", i) for i in range(buffers)]  # the first n copies in flight
    for i in range(5):
        log.clear()
        streamer.wait(i)
        streamer.release(i)
        follow = [("issue", i + buffers)] if i + buffers < 5 else []
        assert log == [("wait", i), ("release", i)] + follow


def test_a_primed_pass_does_not_copy_its_first_units_again():
    log = []
    streamer = _streamer(2, {}, log=log)
    decode = tuple(_unit(i, i % 2) for i in range(3))
    streamer.prime(decode, batch=2, past=7)  # at the end of the previous pass
    assert log == [("issue", 0), ("issue", 1)]
    log.clear()
    streamer.start(decode, batch=2, past=7)
    assert log == [("start", 2)]  # nothing issued again
    streamer.prime(decode, batch=2, past=8)
    log.clear()
    streamer.start(decode, batch=2, past=9)  # primed for another step: its windows would be stale
    assert log == [("start", 0), ("issue", 0), ("issue", 1)]

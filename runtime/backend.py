"""Backends: what the plan's 'cpu' and 'gpu' devices are, and the streams, events and copies between them.

    CudaBackend       'gpu' is cuda:0: a dedicated copy stream, CUDA events, page-locked host memory.
    EmulatedBackend   'gpu' is torch.device('cpu') behind the same interface: streams and events do nothing and
                      copies are plain memcpys. For tests and CI without a GPU; never chosen silently: only
                      `make_backend(emulate_gpu=True)`, `lia-run --emulate-gpu` or LIAC_EMULATE_GPU=1 select it.

The executor only talks to this interface, so one executor serves both; the transfer counters here are what the
tests use to check that activations cross PCIe exactly where the plan says.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from liac.sizes import GIB

__all__ = ["Backend", "CudaBackend", "EmulatedBackend", "CpuOnlyBackend", "TransferCounts", "make_backend",
           "EMULATE_ENV", "host_available_bytes"]

EMULATE_ENV = "LIAC_EMULATE_GPU"


@dataclass
class TransferCounts:
    """Bytes and copies that crossed between the 'cpu' and 'gpu' devices (activations, KV writes, streaming)."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    h2d_copies: int = 0
    d2h_copies: int = 0
    streamed_bytes: int = 0  # weights and KV copied into staging buffers (a subset of h2d_bytes)
    by_value: dict[str, int] = field(default_factory=dict)  # activation name ('x', 'q', ...) → copies

    def totals(self) -> dict[str, int]:
        """The byte and copy counters (not `by_value`), for differences around one call."""
        return {"h2d_bytes": self.h2d_bytes, "d2h_bytes": self.d2h_bytes, "h2d_copies": self.h2d_copies,
                "d2h_copies": self.d2h_copies, "streamed_bytes": self.streamed_bytes}

    def count(self, nbytes: int, to_gpu: bool, value: str = "") -> None:
        if to_gpu:
            self.h2d_bytes += nbytes
            self.h2d_copies += 1
        else:
            self.d2h_bytes += nbytes
            self.d2h_copies += 1
        if value:
            self.by_value[value] = self.by_value.get(value, 0) + 1


class _NullEvent:
    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


class Backend:
    """The interface the executor uses. `devices['cpu']` / `devices['gpu']` are the torch devices of the plan's
    devices; `pin_memory` says whether host tiers are page-locked (then host→GPU copies are asynchronous)."""

    name = "abstract"
    emulated = False
    pin_memory = False
    mapped_crossings = False  # CudaBackend: small crossings to the GPU read in place by a kernel (`transfer`)

    def __init__(self, gpu: torch.device):
        self.devices = {"cpu": torch.device("cpu"), "gpu": gpu}
        self.transfers = TransferCounts()

    # streams and events ------------------------------------------------------------------------------------------
    def copy_stream(self):
        """The stream that streams weights and KV into staging buffers (None when there are no streams)."""
        return None

    def new_copy_stream(self):
        """Another copy stream of its own (routed experts, copied while the prefetch stream is busy); None when
        there are no streams."""
        return None

    def on_stream(self, stream):
        return contextlib.nullcontext()

    def compute_stream(self):
        """The calling thread's current stream on the GPU (None without streams): another host thread that launches
        work for this one enters it (`on_stream`), since the current stream is per thread."""
        return None

    def event(self):
        return _NullEvent()

    def timing_event(self):
        """An event that can time GPU work (profiling only: timing events cost more)."""
        return _NullEvent()

    def synchronize(self) -> None:
        pass

    # copies ----------------------------------------------------------------------------------------------------
    def transfer(self, tensor: torch.Tensor, dst: str, value: str = "") -> torch.Tensor:
        """Move an activation to the plan device `dst` ('cpu' or 'gpu'), counting the bytes."""
        self.transfers.count(tensor.numel() * tensor.element_size(), dst == "gpu", value)
        return tensor.to(self.devices[dst])

    def transfer_many(self, tensors: list[torch.Tensor], dst: str, values: list[str]) -> list[torch.Tensor]:
        """`transfer` of each tensor to `dst`, in order; the GPU's backend waits once for all of them (an MoE
        experts op's routing: the normalised input, the expert indices and their weights, read on the host)."""
        return [self.transfer(tensor, dst, value) for tensor, value in zip(tensors, values)]

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor, to_gpu: bool, value: str = "",
                  beside: bool = False) -> None:
        """`dst.copy_(src)` across devices, counted; asynchronous where the memory allows it. `beside`: a GPU → host
        copy may run on the store stream, beside the compute that follows (then `join_stores` before reading)."""
        self.transfers.count(src.numel() * src.element_size(), to_gpu, value)
        dst.copy_(src)

    def join_stores(self) -> None:
        """Order the compute stream after every copy issued `beside` so far (no-op without streams)."""

    def wait_stores(self) -> None:
        """Return once every copy issued `beside` so far has landed (the host reads their destinations next)."""

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised host tensor that a CPU op writes and a crossing to the GPU reads: page-locked where
        the backend pins host memory (`transfer` then sends it as it is), from torch's caching host allocator."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.pin_memory)

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Host → GPU `dst.copy_(src)` for [R, L, E] views whose rows are each contiguous but strided apart (the
        past tokens of a KV cache, one row per sequence and head): ONE copy on the current stream, not R."""
        dst.copy_(src)

    # memory ----------------------------------------------------------------------------------------------------
    def gpu_free_bytes(self) -> int | None:
        """Free GPU memory, or None when the 'gpu' shares host memory (emulated)."""
        return None

    def gpu_peak_bytes(self) -> int | None:
        return None

    def gpu_peak_reserved_bytes(self) -> int | None:
        return None

    def gpu_allocated_bytes(self) -> int | None:
        return None

    def reset_peak(self) -> None:
        pass

    def gpu_context_bytes(self) -> int | None:
        """GPU memory this process holds outside torch's caching allocator (CUDA context, loaded kernels, library
        handles), or None without a real GPU."""
        return None

    def reserve(self, nbytes: int) -> None:
        """Check, at start, that `nbytes` more of GPU memory can be had now (allocated, then handed back to the
        driver); raises torch.cuda.OutOfMemoryError when it cannot. The memory is not held as one cached block:
        activations carved from one block leave the allocator's small pool (< 1 MiB requests, 2 MiB segments) and
        the side streams' pools no room under the cap, and its fragments cannot be freed while part of it is live;
        the allocator then behaves as when `liac profile` measured the activation peak (no block, no cap)."""

    def cap(self, nbytes: int | None) -> None:
        """Forbid the caching allocator to hold more than `nbytes` (None: lift the cap): past it, an allocation
        first frees cached blocks, then fails with torch.cuda.OutOfMemoryError."""

    def release_cached(self) -> None:
        """Hand cached, unused GPU memory back to the driver (after an engine closes)."""

    def pin(self, tensor: torch.Tensor) -> bool:
        """Page-lock a host tensor in place; False when it stays pageable (no CUDA, or the OS refused)."""
        return False

    def unpin(self, tensor: torch.Tensor) -> None:
        pass

    def describe(self) -> str:
        return self.name


class EmulatedBackend(Backend):
    """'gpu' is the CPU: same interface, no streams, synchronous copies. Test mode only."""

    name = "emulated"
    emulated = True

    def __init__(self):
        super().__init__(torch.device("cpu"))

    def transfer(self, tensor, dst, value=""):
        # Both devices are the host: count the crossing the plan asks for, keep the tensor.
        self.transfers.count(tensor.numel() * tensor.element_size(), dst == "gpu", value)
        return tensor

    def describe(self) -> str:
        return "emulated GPU on the CPU (test mode: 'gpu' sublayers run on the host)"


class CudaBackend(Backend):
    """'gpu' is cuda:0; the compute stream is the current stream, copies into staging use their own stream."""

    name = "cuda"
    pin_memory = True

    def __init__(self, index: int = 0):
        super().__init__(torch.device("cuda", index))
        self._copy_stream = torch.cuda.Stream(device=self.devices["gpu"])
        self._store_stream = torch.cuda.Stream(device=self.devices["gpu"])  # GPU → host K, V writes of a prefill
        self._stores_pending = False
        self.mapped_crossings = True  # small crossings to the GPU read in place by a kernel (`transfer`)
        self.mapped_note: str | None = None  # why they are not, where that was found out
        self._mapped_held: collections.deque = collections.deque()  # (event, host block) until its reader has run

    def copy_stream(self):
        return self._copy_stream

    def new_copy_stream(self):
        return torch.cuda.Stream(device=self.devices["gpu"])

    def on_stream(self, stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def compute_stream(self):
        return torch.cuda.current_stream(self.devices["gpu"])

    def event(self):
        return torch.cuda.Event()

    def timing_event(self):
        return torch.cuda.Event(enable_timing=True)

    def transfer(self, tensor, dst, value=""):
        """Activations cross through page-locked host memory both ways, as the cost model prices them (Eq. 2, at
        the profile's pinned PCIe rates): a copy from or into pageable memory runs through the driver's own bounce
        buffer at a fraction of that rate and holds the host thread for all of it. To the GPU the copy is then
        queued on the compute stream and the host thread goes on; to the host it is waited for (the CPU reads it
        next). The pinned blocks come from torch's caching host allocator, which keeps one until the copies that
        use it have run.

        To the GPU, an activation of at most `MAPPED_MAX_BYTES` (a decode step's crossings) is not copied by the
        copy engine: a kernel on the compute stream reads it from the page-locked block itself (`_read_mapped`),
        so it never queues behind the staging copies that engine runs in the order they were issued (a layer's
        CPU output waited for the whole next weight copy: docs/benchmarks.md, "The gap to the floor")."""
        self.transfers.count(tensor.numel() * tensor.element_size(), dst == "gpu", value)
        if dst == "gpu":
            host = _pinned(tensor)
            if self.mapped_crossings and host.numel() * host.element_size() <= MAPPED_MAX_BYTES:
                mapped = self._read_mapped(host)
                if mapped is not None:
                    return mapped
            return host.to(self.devices["gpu"], non_blocking=True)
        out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        out.copy_(tensor, non_blocking=True)  # a strided source is made contiguous on the GPU first
        torch.cuda.current_stream(self.devices["gpu"]).synchronize()
        return out

    def transfer_many(self, tensors, dst, values):
        """To the host: every copy queued on the compute stream, then one wait for all of them (`transfer` would
        wait after each: three host synchronisations per MoE layer for its routing, where one does)."""
        if dst == "gpu":
            return super().transfer_many(tensors, dst, values)
        outs = []
        for tensor, value in zip(tensors, values):
            self.transfers.count(tensor.numel() * tensor.element_size(), False, value)
            out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            out.copy_(tensor, non_blocking=True)
            outs.append(out)
        torch.cuda.current_stream(self.devices["gpu"]).synchronize()
        return outs

    def _read_mapped(self, host: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor | None:
        """`host` (page-locked, contiguous) on the GPU, read by a kernel on the compute stream through the host
        block's device mapping (unified addressing: a page-locked block's address is valid on the device), not by
        the copy engine: into a new tensor, or into `into` (a GPU view of `host`'s shape that is not contiguous, so
        that torch's copy is a kernel, never a memcpy). The block is held until an event after that kernel has
        passed (torch's host allocator only tracks the copies it issues). None where the block cannot be read so
        (then the caller copies it), and from then on for good if this torch cannot alias it (`mapped_note`)."""
        if not host.is_contiguous() or not host.numel() or not _mapped_in_place(host.data_ptr()):
            return None  # a block the device cannot read at its host address: the copy engine copies it
        gpu = self.devices["gpu"]
        try:
            alias = _alias(host, gpu)
            if into is None:
                into = torch.empty(host.shape, dtype=host.dtype, device=gpu)
                _byte_copy(into, alias)
            else:
                into.copy_(alias.view(host.dtype).view(host.shape))
        except (RuntimeError, TypeError, AttributeError) as e:  # this torch cannot alias it: copies from now on
            self.mapped_crossings = False
            self.mapped_note = f"small crossings to the GPU go through the copy engine (no mapped read: {e})"
            logging.getLogger("liac.runtime").warning("liac.runtime: %s", self.mapped_note)  # once: off from now on
            return None
        event = torch.cuda.Event()
        event.record()
        held = self._mapped_held
        held.append((event, host))
        while held and (len(held) > MAPPED_HELD_MAX or held[0][0].query()):
            if len(held) > MAPPED_HELD_MAX:
                held[0][0].synchronize()
            held.popleft()
        return into

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.devices["gpu"])
        self._mapped_held.clear()

    def copy_into(self, dst, src, to_gpu, value="", beside=False):
        if beside and not to_gpu and dst.is_pinned():
            # On the store stream, after what the compute stream has queued (the K, V being written); `src` is kept
            # alive for that stream, and `join_stores` puts the compute stream behind it before anyone reads `dst`.
            store = self._store_stream
            store.wait_stream(torch.cuda.current_stream(self.devices["gpu"]))
            with torch.cuda.stream(store):
                self._copy_into(dst, src, to_gpu, value, store)
            self._stores_pending = True
            return
        self._copy_into(dst, src, to_gpu, value, None)

    def join_stores(self):
        if self._stores_pending:
            torch.cuda.current_stream(self.devices["gpu"]).wait_stream(self._store_stream)
            self._stores_pending = False

    def wait_stores(self):
        if self._stores_pending:
            self._store_stream.synchronize()

    def _copy_into(self, dst, src, to_gpu, value, stream):
        self.transfers.count(src.numel() * src.element_size(), to_gpu, value)
        if to_gpu and src.device.type == "cpu":
            # A KV write from the CPU into an HBM cache: from page-locked memory, queued on the compute stream; a
            # decode step's (small, into a strided slice of the cache) read in place, off the copy engine
            host = _pinned(src)
            if self.mapped_crossings and stream is None and not dst.is_contiguous() \
                    and host.numel() * host.element_size() <= MAPPED_MAX_BYTES \
                    and self._read_mapped(host, dst) is not None:
                return
            dst.copy_(host, non_blocking=True)
            return
        # GPU → pinned host: asynchronous on the current stream (the compute stream, or with `stream` the store
        # stream, which `join_stores` joins). A CPU reader of `dst` always first receives an activation from the GPU
        # through a blocking `transfer`, which waits for this copy (same stream, or joined).
        if not to_gpu and not dst.is_contiguous() and dst.is_pinned():
            # A KV write into a host cache: [B, G, Q, E] of [B, G, C, E], B·G runs of Q·E elements each. torch's
            # copy_ would stage it in pageable memory (synchronous) and scatter it with one host thread: ~90 ms a
            # layer for a 4096-token prefill on the H200 machine. One cudaMemcpy2DAsync from a contiguous copy
            # on the GPU instead (stream-ordered, so the temporary lives until the copy has run).
            layout = _row_layout(dst)
            if layout is not None:
                src = src.contiguous()
                if stream is not None:
                    src.record_stream(stream)  # the allocator must not reuse it before the copy has run there
                itemsize = src.element_size()
                if _memcpy_2d(dst.data_ptr(), layout.pitch * itemsize, src.data_ptr(), layout.length * itemsize,
                              layout.length * itemsize, layout.rows, _DEVICE_TO_HOST):
                    return
        if stream is not None and src.is_cuda:
            src.record_stream(stream)
        dst.copy_(src, non_blocking=dst.is_pinned() or src.is_pinned())

    def copy_rows(self, dst, src):
        rows, length, width = src.shape
        itemsize = src.element_size()
        if rows and length and src.is_pinned() and dst.stride()[1:] == (width, 1) \
                and src.stride()[1:] == (width, 1):
            # cudaMemcpy2DAsync: `rows` runs of length·E elements, each at its own pitch, asynchronous from pinned
            # memory. torch's copy_ of a strided host view would first gather it into pageable memory (a host
            # memcpy, then a synchronous copy).
            if _memcpy_2d(dst.data_ptr(), dst.stride(0) * itemsize, src.data_ptr(), src.stride(0) * itemsize,
                          length * width * itemsize, rows, _HOST_TO_DEVICE):
                return
        for row in range(rows):  # no usable libcudart: one contiguous copy per row
            dst[row].copy_(src[row], non_blocking=True)

    def gpu_free_bytes(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.devices["gpu"])
        return int(free)

    def gpu_peak_bytes(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.devices["gpu"]))

    def gpu_peak_reserved_bytes(self) -> int:
        return int(torch.cuda.max_memory_reserved(self.devices["gpu"]))

    def gpu_allocated_bytes(self) -> int:
        return int(torch.cuda.memory_allocated(self.devices["gpu"]))

    def release_cached(self) -> None:
        torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.devices["gpu"])

    def gpu_context_bytes(self) -> int:
        # Everything in use on the device that the allocator does not hold: this process's context, kernels and
        # library handles (and, on a shared GPU, other processes' memory: then an overestimate).
        free, total = torch.cuda.mem_get_info(self.devices["gpu"])
        return max(0, int(total - free) - int(torch.cuda.memory_reserved(self.devices["gpu"])))

    def reserve(self, nbytes):
        if nbytes > 0:
            block = torch.empty(int(nbytes), dtype=torch.uint8, device=self.devices["gpu"])
            del block
            torch.cuda.empty_cache()

    def cap(self, nbytes):
        device = self.devices["gpu"]
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if nbytes is None else min(1.0, max(0.0, nbytes / total)),
                                                   device)

    def pin(self, tensor):
        # cudaHostRegister pins exactly these pages; torch's pinned allocator would round large sizes up to a
        # power of two (up to 2x the host memory for a big weight arena).
        if tensor.numel() == 0:
            return False
        err = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
        if int(err) != 0:
            _clear_cuda_error()
            return False
        if not tensor.is_pinned():  # CUDA must see the pages as page-locked, or copies from them stay synchronous
            self.unpin(tensor)
            return False
        return True

    def unpin(self, tensor):
        if tensor.numel():
            torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())

    def describe(self) -> str:
        props = torch.cuda.get_device_properties(self.devices["gpu"])
        return f"{self.devices['gpu']} ({props.name}, {props.total_memory / GIB:.0f} GiB)"


MAPPED_MAX_BYTES = 1 << 20  # crossings to the GPU up to this size are read in place (a decode step's, to batch 64)
MAPPED_HELD_MAX = 256  # host blocks held for their readers before the oldest is waited for


_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost


def _mapped_in_place(address: int) -> bool:
    """Whether the device reads the host block at `address` at that same address: page-locked host memory
    (cudaPointerGetAttributes: type host) whose device pointer is its host pointer (unified addressing). False
    where libcudart cannot be reached through ctypes or the call fails."""
    get = _cudart_function("cudaPointerGetAttributes")
    if get is None:
        return False
    # struct cudaPointerAttributes {int type; int device; void *devicePointer; void *hostPointer; ...}: read the
    # four fields from a buffer larger than any version's struct
    buffer = (ctypes.c_char * 256)()
    if int(get(buffer, ctypes.c_void_p(address))) != 0:
        _clear_cuda_error()
        return False
    kind = ctypes.c_int.from_buffer(buffer, 0).value
    device_pointer = ctypes.c_void_p.from_buffer(buffer, 8).value
    return kind == _MEMORY_TYPE_HOST and device_pointer == address


def _alias(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A uint8 tensor on `device` over `host`'s bytes (no copy, not owning them): the address of a page-locked
    host block is valid on a CUDA device with unified addressing."""
    nbytes = host.numel() * host.element_size()
    storage = torch._C._construct_storage_from_data_pointer(host.data_ptr(), device, nbytes)
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def _byte_copy(out: torch.Tensor, source: torch.Tensor) -> None:
    """`out`'s bytes (contiguous) from the uint8 tensor `source`, by an elementwise kernel (`bitwise_or` with 0:
    bit-exact for any dtype), never a memcpy: on the GPU that would go to the copy engine again."""
    torch.bitwise_or(source, 0, out=out.reshape(-1).view(torch.uint8))


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor in page-locked memory: itself when it is, else a contiguous pinned copy (the host's copy_ runs
    on every intra-op thread, several times the rate of the driver's bounce buffer for a pageable source)."""
    if tensor.is_pinned():
        return tensor
    staged = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    staged.copy_(tensor)
    return staged


_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost
_CUDART: list = []   # [the ctypes libcudart torch loaded, or None], looked up once


def _loaded_cudart_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as handle:
            paths = {line.split()[-1] for line in handle if "libcudart" in line}
    except OSError:
        return []
    major = (torch.version.cuda or "").split(".")[0]
    # the runtime torch itself uses first (another package may have loaded a second one)
    return sorted(paths, key=lambda p: (f"libcudart.so.{major}" not in p, p))


_CUDART_FUNCTIONS: dict = {}  # name → the ctypes function of the libcudart torch loaded, or None


def _cudart_function(name: str):
    """A libcudart function taking and returning C ints and pointers (ctypes' defaults), or None (a static build, no
    CUDA); looked up once per name."""
    if name not in _CUDART_FUNCTIONS:
        function = None
        for path in _loaded_cudart_paths():
            try:
                function = getattr(ctypes.CDLL(path), name)
            except (OSError, AttributeError):
                continue
            function.restype = ctypes.c_int
            break
        _CUDART_FUNCTIONS[name] = function
    return _CUDART_FUNCTIONS[name]


def _cudart_memcpy_2d():
    """cudaMemcpy2DAsync of the libcudart torch loaded (through ctypes), or None (a static build, no CUDA)."""
    if not _CUDART:
        function = None
        for path in _loaded_cudart_paths():
            try:
                function = ctypes.CDLL(path).cudaMemcpy2DAsync
            except (OSError, AttributeError):
                continue
            function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            function.restype = ctypes.c_int
            break
        _CUDART.append(function)
    return _CUDART[0]


def _memcpy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, kind: int) -> bool:
    """cudaMemcpy2DAsync on the current stream (byte addresses and sizes); False when it is unavailable or failed
    (the caller falls back to torch's copy)."""
    memcpy_2d = _cudart_memcpy_2d()
    if memcpy_2d is None or not width or not height:
        return False
    if int(memcpy_2d(dst, dst_pitch, src, src_pitch, width, height, kind,
                     torch.cuda.current_stream().cuda_stream)) == 0:
        return True
    _clear_cuda_error()
    return False


class _RowLayout(NamedTuple):
    """`rows` runs of `length` contiguous elements that start `pitch` elements apart."""

    rows: int
    length: int
    pitch: int


def _row_layout(tensor: torch.Tensor) -> _RowLayout | None:
    """The row layout of `tensor` when it is one (e.g. [B, G, Q, E] of a [B, G, C, E] cache: B·G runs of Q·E, pitch
    C·E), else None."""
    dims = [(size, stride) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1]
    length = 1
    while dims and dims[-1][1] == length:  # the contiguous tail: one run
        length *= dims.pop()[0]
    if not dims:
        return _RowLayout(1, length, length)
    rows, pitch = dims[-1][0], dims[-1][1]
    for size, stride in reversed(dims[:-1]):  # the leading dims must collapse into one evenly strided index
        if stride != pitch * rows:
            return None
        rows *= size
    return _RowLayout(rows, length, pitch)


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a failed (non-sticky) call, or torch's next kernel-launch check
    would report it. libcudart is found among the loaded libraries; a static build has nothing to reset."""
    for path in _loaded_cudart_paths():
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            continue


def make_backend(emulate_gpu: bool | None = None) -> Backend:
    """CUDA when present; the emulated backend only when asked for (argument, or LIAC_EMULATE_GPU=1).

    Returns a CudaBackend when CUDA is available and emulation was not asked for; an EmulatedBackend when it was;
    otherwise a backend with no GPU at all (`devices['gpu']` is None), which only runs all-CPU plans.
    """
    if emulate_gpu is None:
        emulate_gpu = os.environ.get(EMULATE_ENV, "") not in ("", "0")
    if emulate_gpu:
        return EmulatedBackend()
    if torch.cuda.is_available():
        return CudaBackend()
    return CpuOnlyBackend()


class CpuOnlyBackend(Backend):
    """No GPU at all: runs all-CPU plans; a plan with a 'gpu' sublayer is refused before anything is allocated."""

    name = "cpu-only"

    def __init__(self):
        super().__init__(None)  # type: ignore[arg-type]

    def describe(self) -> str:
        return "no GPU (CUDA not available): CPU sublayers only"


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (bytes); falls back to total physical memory."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

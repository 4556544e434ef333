"""What crosses between the referee and a contestant: tensors as dtype, shape, strides and bytes in shared memory.

The referee owns every shared buffer ("arena"): on the CPU a memfd it hands over with the message, on CUDA a raw
driver allocation (not from torch's caching allocator, so nothing else of the referee's shares its pages) exported
as an IPC handle. A tensor crosses as a spec, {"t": "tensor", "dtype", "shape", "stride", "span", "off"}: the
contestant builds a view of the arena from it, so a Tensor subclass, a lazy object or an overridden method never
crosses, only the bytes it was made to write. Other values cross as JSON ({"t": "value", "v"}).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os

ALIGN = 256
OUT_SLACK = 64 << 10  # a hand-off lands at a random offset in this much room: it cannot be written in advance
ARENA_BUDGET = 1 << 30  # inputs and outputs of one timed batch, at most (a GPU's: see arena_budget)
ARENA_BUDGET_MAX = 12 << 30
# a timed batch whose input tensors average at most this is staged (Referee.staged): below it, writing a tensor
# takes the host's launch (about 20 µs) longer than the device's copy; above it a batch holds few tensors
STAGE_TENSOR_BYTES = 16 << 20


def arena_budget(device_bytes: int | None) -> int:
    """Bytes of one timed batch's inputs and outputs: a sixth of the GPU, within 1-12 GiB, so that a fast kernel's
    batch can last timing.TARGET_BATCH_MS (on an 80 GB GPU, 60 calls of two 64 MB inputs and one output)."""
    if not device_bytes:
        return ARENA_BUDGET
    return max(ARENA_BUDGET, min(ARENA_BUDGET_MAX, device_bytes // 6))


# ---------------------------------------------------------------- the CUDA driver, through ctypes


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class Driver:
    """The few CUDA driver calls the exchange needs. The calling thread must have torch's context current."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"CUDA driver call {what} failed with error {code}")

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))

    def export(self, ptr: int) -> str:
        handle = _Handle()
        self._check(self.lib.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(ptr)), "cuIpcGetMemHandle")
        return bytes(handle).hex()

    def open(self, handle_hex: str, nbytes: int) -> int:
        raw = bytes.fromhex(handle_hex)
        if len(raw) != 64:
            raise ValueError("bad IPC handle")
        handle = _Handle()
        ctypes.memmove(ctypes.byref(handle), raw, 64)
        ptr = ctypes.c_uint64()
        self._check(self.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, ctypes.c_uint(1)), "cuIpcOpenMemHandle")
        base, size = self.address_range(ptr.value)
        if base != ptr.value or size < nbytes:
            self.close(ptr.value)
            raise ValueError(f"shared buffer holds {size} bytes, {nbytes} announced")
        return ptr.value

    def close(self, ptr: int) -> None:
        self.lib.cuIpcCloseMemHandle(ctypes.c_uint64(ptr))

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        code = self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        self._check(code, "cuMemGetAddressRange")
        return base.value, size.value

    def reset_persisting_l2(self) -> None:
        """Persisting L2 lines (a candidate's access policy window) would survive the flush: make them normal."""
        self.lib.cuCtxResetPersistingL2Cache()


_DRIVER: Driver | None = None


def driver() -> Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver()
    return _DRIVER


class _DeviceMemory:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def _device_bytes(ptr: int, nbytes: int):
    import torch

    return torch.as_tensor(_DeviceMemory(ptr, nbytes), device="cuda")


# ---------------------------------------------------------------- arenas


class Arena:
    """A shared buffer owned by the referee (`nbytes` rounded up to 2 MiB)."""

    def __init__(self, device: str, nbytes: int):
        import torch

        self.device, self.nbytes = device, max(1, math.ceil(nbytes / (2 << 20))) * (2 << 20)
        if device == "cuda":
            self.ptr = driver().alloc(self.nbytes)
            self.bytes = _device_bytes(self.ptr, self.nbytes)
        else:
            self.fd = os.memfd_create("concur-arena", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, self.nbytes)
            self.map = mmap.mmap(self.fd, self.nbytes)
            self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)

    def share(self) -> tuple[dict, list[int]]:
        """The message (and descriptors) from which a contestant maps this arena."""
        if self.device == "cuda":
            return {"kind": "cuda", "nbytes": self.nbytes, "handle": driver().export(self.ptr)}, []
        return {"kind": "cpu", "nbytes": self.nbytes}, [self.fd]

    def close(self) -> None:
        self.bytes = None
        if self.device == "cuda":
            driver().free(self.ptr)
        else:
            self.map.close()
            os.close(self.fd)


class Mapped:
    """A contestant's view of an arena the referee shared."""

    def __init__(self, message: dict, fds: list[int]):
        import torch

        self.kind, self.nbytes = message["kind"], int(message["nbytes"])
        if self.kind == "cuda":
            self.ptr = driver().open(message["handle"], self.nbytes)
            self.bytes = _device_bytes(self.ptr, self.nbytes)
        else:
            if len(fds) != 1 or os.fstat(fds[0]).st_size < self.nbytes:
                raise ValueError("bad shared memory descriptor")
            self.map = mmap.mmap(fds[0], self.nbytes)
            os.close(fds[0])
            self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)

    def close(self) -> None:
        self.bytes = None
        if self.kind == "cuda":
            driver().close(self.ptr)
        else:
            try:
                self.map.close()
            except BufferError:  # a view of it is still alive: the mapping goes with the process
                pass


# ---------------------------------------------------------------- specs


def dtype_of(name: str):
    import torch

    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def tensor_spec(value) -> dict:
    """Spec of one tensor: its storage span (elements from its first to its last) is what crosses."""
    if any(s < 0 for s in value.stride()):
        raise ValueError("negative strides cannot cross")
    span = 0 if value.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride()))
    return {
        "t": "tensor",
        "dtype": str(value.dtype),
        "shape": list(value.shape),
        "stride": list(value.stride()),
        "span": span,
        "device": value.device.type,
    }


def value_spec(value) -> dict:
    """A plain value (number, string, None, or a list/tuple of them); anything else cannot cross."""
    if _plain_value(value):
        return {"t": "value", "v": list(value) if isinstance(value, tuple) else value}
    raise TypeError(f"a value of type {type(value).__name__} cannot cross between processes")


def _plain_value(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_plain_value(v) for v in value)


def specs_of(values) -> list[dict]:
    import torch

    return [tensor_spec(v) if isinstance(v, torch.Tensor) else value_spec(v) for v in values]


def nbytes(spec: dict) -> int:
    return spec["span"] * dtype_of(spec["dtype"]).itemsize if spec["t"] == "tensor" else 0


def place(specs: list[dict], base: int = 0) -> int:
    """Give each tensor spec an aligned offset from `base`; returns the end of the last one."""
    end = base
    for spec in specs:
        if spec["t"] == "tensor":
            spec["off"] = aligned(end)
            end = spec["off"] + nbytes(spec)
    return end


def aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def view(arena_bytes, spec: dict):
    """The tensor a spec describes, as a view of the arena's bytes."""
    import torch

    dtype = dtype_of(spec["dtype"])
    start, size = int(spec["off"]), nbytes(spec)
    if start < 0 or start + size > arena_bytes.numel() or start % ALIGN:
        raise ValueError("tensor spec outside its arena")
    flat = arena_bytes[start : start + size].view(dtype)
    if spec["span"] == 0:
        return torch.empty(spec["shape"], dtype=dtype, device=arena_bytes.device)
    return flat.as_strided(spec["shape"], spec["stride"])


def write(arena_bytes, specs: list[dict], values: list) -> None:
    """Copy each tensor's storage span (strides kept as they are) into the arena at its spec's offset. On a GPU by
    kernels, never a memcpy, which a copy engine might run beside a contestant's kernels: integer words plus zero,
    bit for bit, as fast as a memcpy (1.38 TB/s on an H100)."""
    import torch

    for spec, value in zip(specs, values):
        if spec["t"] == "tensor" and spec["span"]:
            source = value.as_strided((spec["span"],), (1,), value.storage_offset()).view(torch.uint8)
            target = arena_bytes[spec["off"] : spec["off"] + nbytes(spec)]
            word = widest_word(source, target)
            torch.add(source.view(word), 0, out=target.view(word))


def staging(specs: list[dict], values: list, end: int, device):
    """A batch's inputs laid out in a buffer of `end` bytes of this process as `write` lays them out in an arena, so
    that one copy of the whole span writes them there (write_span). Zeroed first: the gaps between tensors reach
    the contestant too, and memory this process freed may hold what it judged."""
    import torch

    buffer = torch.zeros(end, dtype=torch.uint8, device=device)
    write(buffer, specs, values)
    return buffer


def write_span(arena_bytes, buffer) -> None:
    """A staged batch (`staging`) into the arena's first bytes by one kernel, as `write` copies each tensor: its
    time is the device's, not the host's launches (about 20 µs of Python a tensor in `write`)."""
    import torch

    target = arena_bytes[: buffer.numel()]
    word = widest_word(buffer, target)
    torch.add(buffer.view(word), 0, out=target.view(word))


def widest_word(*tensors):
    """The widest integer type that tiles these byte tensors (their sizes and addresses)."""
    import torch

    for dtype in (torch.int64, torch.int32, torch.int16):
        if all(t.numel() % dtype.itemsize == 0 and t.data_ptr() % dtype.itemsize == 0 for t in tensors):
            return dtype
    return torch.uint8


def values_of(arena_bytes, specs: list[dict]) -> list:
    return [view(arena_bytes, s) if s["t"] == "tensor" else s["v"] for s in specs]


def hex_bytes(tensor) -> str:
    """A tensor's elements as bytes in hex, bit for bit whatever its dtype (contestant.take and what the referee
    compares it with)."""
    import torch

    return tensor.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy().tobytes().hex()


def handoff_layouts(calls: list[list[dict]], start: int = 0, base: int = 0) -> tuple[list[list[dict]], int]:
    """Where a hand-off puts the outputs of each call (leaf metadata per call): contiguous from `start`, call after
    call, everything shifted by `base`. Returns the layouts and where the last one ends before the shift. A
    contestant on the doorbell lays its own outputs out by the same rule (Contestant.landing)."""
    layouts, end = [], aligned(start)
    for metas in calls:
        layout = output_layout(metas, end)
        end = max([end] + [s["off"] + nbytes(s) for s in layout if s["t"] == "tensor"])
        for spec in layout:
            if spec["t"] == "tensor":
                spec["off"] += base
        layouts.append(layout)
    return layouts, end


def output_layout(metas: list[dict], base: int) -> list[dict]:
    """Contiguous specs for output leaves described by their metadata (dtype, shape), placed from `base`."""
    specs = []
    for meta in metas:
        if meta["t"] != "tensor":
            specs.append(meta)
            continue
        shape = [int(n) for n in meta["shape"]]
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        numel = math.prod(shape)
        specs.append({"t": "tensor", "dtype": meta["dtype"], "shape": shape, "stride": strides, "span": numel})
    place(specs, base)
    return specs

"""The doorbell: one page of shared memory on which the referee and a contestant signal the timed steps of a batch.

A timed batch has two clocked spans: `go` until the forward's end, and the hand-off until the outputs have landed.
Over the socket each end of a span is a system call, a wake-up and JSON on both sides, which moved a batch of 2 ms
by ±0.1 ms from process to process (H100 node). On the bell the referee rings a slot (a random token, its payload,
a checksum) and spins on the answering slot; the contestant spins on the ringing slot. Every command still travels
over the socket as well, right after its ring, and every reply too: a side that does not spin (fewer than 4 cores)
answers from the socket, and the socket keeps both in lockstep.

The referee spins only so long (a batch of seconds gains nothing from it): when it stops, it marks the answering
slot's LEFT twin with the token and reads the reply from the socket. A contestant that finds that mark after
ringing `done` writes its reply at once instead of waiting on the bell for a hand-off that will come by the socket:
a batch longer than the spin must not be timed until the contestant's own wait ran out.

A candidate can write this page. A token is random, so `done` cannot be rung before `go` was read; ringing it
early only moves the work into the hand-off, which is timed too (concur.verify.timing); marking LEFT itself only
sends its own hand-off over the socket.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import select
import struct
import time

PAGE = 4096
MAX_PAYLOAD = 64  # words: a batch's seeds (timing.MAX_BATCH)
GO, DONE, HANDOFF, HANDED = 0, 1024, 2048, 3072  # byte offsets of the slots, each on lines of its own
LEFT = 512  # from an answering slot: where the referee marks that it stopped spinning on it (a token, no payload)
_HEAD = struct.Struct("<qqq")  # token, payload length (-1: none), checksum
IDLE_SHARE = 0.5  # of the quickest answer to a step so far, slept through before spinning on the next one
IDLE_SLACK_S = 0.0003  # what a sleep may overrun (timer slack, a halted core's wake-up)
CHECK_EVERY = 4096  # spins between looks at the socket (a reply there means the other side gave up on the bell)


def _checksum(token: int, words: list[int] | None) -> int:
    body = struct.pack(f"<qq{len(words or [])}q", token, -1 if words is None else len(words), *(words or []))
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "little", signed=True)


class Bell:
    """The page: made by the referee (`Bell()`), mapped by a contestant from its descriptor (`Bell(fd)`)."""

    def __init__(self, fd: int | None = None):
        if fd is None:
            fd = os.memfd_create("concur-bell", os.MFD_CLOEXEC)
            os.ftruncate(fd, PAGE)
        elif os.fstat(fd).st_size < PAGE:
            raise ValueError("bad doorbell descriptor")
        self.fd = fd
        self.map = mmap.mmap(fd, PAGE)

    def ring(self, slot: int, token: int, payload: list[int] | None = None) -> None:
        """Payload first, the checksum last: a reader that sees the token before the rest checks and reads again."""
        words = None if payload is None else [int(w) for w in payload]
        if words is not None and len(words) > MAX_PAYLOAD:
            raise ValueError(f"a doorbell carries at most {MAX_PAYLOAD} words")
        if words:
            struct.pack_into(f"<{len(words)}q", self.map, slot + _HEAD.size, *words)
        struct.pack_into("<q", self.map, slot + 8, -1 if words is None else len(words))
        struct.pack_into("<q", self.map, slot, token)
        struct.pack_into("<q", self.map, slot + 16, _checksum(token, words))

    def read(self, slot: int) -> tuple[int, list[int] | None] | None:
        """(token, payload) when the slot is whole, else None."""
        token, count, check = _HEAD.unpack_from(self.map, slot)
        if not -1 <= count <= MAX_PAYLOAD:
            return None
        words = None if count < 0 else list(struct.unpack_from(f"<{count}q", self.map, slot + _HEAD.size))
        return (token, words) if _checksum(token, words) == check else None

    def token(self, slot: int) -> int:
        return struct.unpack_from("<q", self.map, slot)[0]

    def await_new(
        self, slot: int, last: int | None, spin_s: float, left: tuple[int, int] | None = None
    ) -> tuple[int, list[int] | None] | None:
        """Spin until the slot holds a whole ring other than `last` (the contestant's side); None after spin_s, or
        as soon as `left` = (answering slot, token) says the referee stopped spinning on that answer."""
        end = time.perf_counter() + spin_s
        while True:
            if self.token(slot) != last:
                found = self.read(slot)
                if found is not None and found[0] != last:
                    return found
            if time.perf_counter() > end or (left is not None and self.token(left[0] + LEFT) == left[1]):
                return None

    def await_token(self, slot: int, token: int, spin_s: float, sock=None) -> float | None:
        """Spin until the slot holds `token` (the referee's side): when it did, or None after spin_s or as soon as
        something arrives on `sock` (the other side answered there instead, or is gone). Giving up, it marks LEFT
        first and looks once more: an answer rung before the mark is still taken."""
        if spin_s <= 0:
            return time.perf_counter() if self.token(slot) == token else None
        end, spins = time.perf_counter() + spin_s, 0
        while True:
            if self.token(slot) == token:
                return time.perf_counter()
            spins += 1
            if spins % CHECK_EVERY == 0:
                if time.perf_counter() > end or (sock is not None and select.select([sock], [], [], 0)[0]):
                    struct.pack_into("<q", self.map, slot + LEFT, token)
                    return time.perf_counter() if self.token(slot) == token else None

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def idle_s(fastest: float | None) -> float:
    """How long the referee may sleep after ringing before it spins: half the quickest answer to this step so far,
    less what a sleep may overrun; nothing until one was answered. A side that answers sooner than that is read
    late by the overrun at most: it can only lengthen its own time, and an honest batch is not twice as fast as
    the quickest before it."""
    if fastest is None:
        return 0.0
    return max(0.0, IDLE_SHARE * fastest - IDLE_SLACK_S)

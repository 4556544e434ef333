"""Processes of the verifier: message channels, the zygote that forks sandboxed children, and their cleanup.

A zygote (`python -m concur.verify.zygote`) imports torch once and never touches CUDA; it forks one child per
request, each in a session of its own, dying with the zygote, sandboxed (concur.verify.sandbox) before any
candidate code runs, and talking to its requester over a socket of its own that the zygote hands back. A sandboxed
child runs in a PID namespace of its own where the kernel allows it (the namespace, and everything in it, ends with
it); either way the child is a subreaper of its own descendants and the zygote of its children's, and a child is
killed with its whole process tree (`kill_tree`), however its processes detached. The CPU time, memory and process
count of a child are those of its whole tree. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

HEADER = struct.Struct("!I")
MAX_MESSAGE = 64 << 20
MAX_FDS = 8


class ChannelClosed(EOFError):
    """The other end of a channel is gone."""


class Channel:
    """Length-prefixed JSON messages over a Unix stream socket; file descriptors may ride along with a message."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.send_lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict, fds: list[int] = ()) -> None:
        body = json.dumps(message, separators=(",", ":"), default=_plain).encode()
        with self.send_lock:
            head = HEADER.pack(len(body))
            if fds:
                socket.send_fds(self.sock, [head], list(fds))
                self.sock.sendall(body)
            else:
                self.sock.sendall(head + body)

    def recv(self, timeout: float | None = None, spin_s: float = 0.0) -> tuple[dict, list[int]]:
        """The next message and the descriptors sent with it. Raises TimeoutError, or ChannelClosed at EOF.

        `spin_s`: poll without sleeping for up to this long first. A process woken from a blocking wait starts tens
        of microseconds late, by an amount that varies with its core's idle state: on a timed window of a
        millisecond that alone moves a speedup by several percent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if spin_s > 0:
            self._spin(min(spin_s, timeout) if timeout is not None else spin_s)
        head, fds = self._read(HEADER.size, deadline, with_fds=True)
        (size,) = HEADER.unpack(head)
        if size > MAX_MESSAGE:
            raise ValueError(f"message of {size} bytes")
        body, _ = self._read(size, deadline, with_fds=False)
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("message is not an object")
        return message, fds

    def _spin(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while not select.select([self.sock], [], [], 0)[0] and time.perf_counter() < end:
            pass

    def _read(self, size: int, deadline: float | None, with_fds: bool) -> tuple[bytes, list[int]]:
        data, fds = b"", []
        while len(data) < size:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], wait)[0]:
                raise TimeoutError("no message in time")
            if with_fds and not data:
                chunk, got, _, _ = socket.recv_fds(self.sock, size, MAX_FDS)
                fds += got
            else:
                chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ChannelClosed("channel closed")
            data += chunk
        return data, fds

    def close(self) -> None:
        # shutdown first: a close alone leaves the socket open while another thread is blocked reading it, and the
        # peer (a zygote waiting for EOF to exit) would never hear of it
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                end()
            except OSError:
                pass


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# ---------------------------------------------------------------- the requester's end of a zygote


class Zygote:
    """Start children through a zygote process. Thread-safe: several threads may spawn and wait at once."""

    def __init__(self, log_path: str | None = None, env: dict | None = None, clean: bool = False):
        """`clean`: the zygote gets `env` alone, not this process's environment with `env` on top."""
        full_env = {**({} if clean else os.environ), **(env or {}), "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        self.proc, self.channel = start_module("concur.verify.zygote", full_env, log_path)
        self.lock = threading.Lock()
        self.next_ref = 0
        self.spawned: dict[int, queue.Queue] = {}
        self.exits: dict[int, queue.Queue] = {}
        self.ended: dict[int, int] = {}  # pid -> exit code, once reported
        self.live: set[int] = set()  # children spawned whose exit is not reported yet
        threading.Thread(target=self._read, daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, spec: dict, timeout: float = 120.0) -> tuple[int, Channel]:
        """Fork a child for `spec` (see zygote.start_child); returns its pid and its channel."""
        with self.lock:
            self.next_ref += 1
            ref = self.next_ref
            answer = self.spawned[ref] = queue.Queue()
        self.channel.send({"op": "spawn", "ref": ref, "spec": spec})
        try:
            pid, fd = answer.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("the zygote did not start a child in time") from None
        finally:
            with self.lock:
                self.spawned.pop(ref, None)
        with self.lock:
            if pid not in self.ended:
                self.live.add(pid)
        return pid, Channel(socket.socket(fileno=fd))

    def kill(self, pid: int) -> None:
        """Kill a child's whole session, and whatever it left behind."""
        _kill_group(pid)
        try:
            self.channel.send({"op": "kill", "pid": pid})
        except OSError:
            pass

    def wait(self, pid: int, timeout: float) -> int | None:
        """The child's exit code (minus the signal that ended it), or None while it still runs."""
        with self.lock:
            if pid in self.ended:
                return self.ended[pid]
        try:
            code = self._exit_queue(pid).get(timeout=timeout)
        except queue.Empty:
            return None
        with self.lock:
            self.exits.pop(pid, None)
            self.ended[pid] = code
            self.live.discard(pid)
        forget(pid)
        return code

    def leftovers(self) -> list[int]:
        """Processes under the zygote that belong to no child still running (nor to the first process of its PID
        namespace, where it has one): what an ended child left behind."""
        with self.lock:
            live = set(self.live)
        keep = set(live)
        for pid in live:
            keep.update(tree(pid))
            stat = _stat(str(pid))
            if stat and int(stat[1]) != self.proc.pid:
                keep.add(int(stat[1]))  # the init of the child's PID namespace
        return [pid for pid in tree(self.proc.pid) if pid not in keep and alive(pid)]

    def clear_leftovers(self, wait_s: float = 2.0) -> list[int]:
        """Kill every leftover (`leftovers`) with its tree; returns those still alive after `wait_s` (none, unless
        one cannot be killed: nothing may be timed beside it)."""
        end = time.monotonic() + wait_s
        while True:
            left = self.leftovers()
            if not left or time.monotonic() > end:
                return left
            for pid in left:
                kill_tree(pid, max(0.05, end - time.monotonic()))

    def end(self, pid: int, timeout: float = 30.0) -> int | None:
        """Kill a child and wait until it is gone (a GPU context is released only then)."""
        self.kill(pid)
        return self.wait(pid, timeout)

    def close(self) -> None:
        self.channel.close()  # the zygote kills its children and exits at EOF
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc.pid)

    def _exit_queue(self, pid: int) -> queue.Queue:
        with self.lock:
            return self.exits.setdefault(pid, queue.Queue())

    def _read(self) -> None:
        while True:
            try:
                message, fds = self.channel.recv()
            except (ChannelClosed, OSError, ValueError):
                return
            if message.get("op") == "spawned":
                with self.lock:
                    target = self.spawned.get(message["ref"])
                if target is None or not fds:
                    for fd in fds:
                        os.close(fd)
                    continue
                target.put((message["pid"], fds[0]))
            elif message.get("op") == "exit":
                with self.lock:
                    self.live.discard(message["pid"])
                self._exit_queue(message["pid"]).put(message["code"])


def start_module(module: str, env: dict, log_path) -> tuple[subprocess.Popen, Channel]:
    """`python -m <module> <fd>` in a session of its own, talking over a socket on <fd>; its output to `log_path`."""
    mine, theirs = socket.socketpair()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    finally:
        theirs.close()
        if log_path:
            log.close()
    return proc, Channel(mine)


class Stopped(Exception):
    """A child stopped answering: `kind` is timeout, crash, memory or processes."""

    def __init__(self, kind: str, detail: str, seconds: float = 0.0):
        super().__init__(detail)
        self.kind, self.detail, self.seconds = kind, detail, seconds


def await_reply(
    channel: Channel,
    zygote: Zygote,
    pid: int,
    timeout: float,
    memory_kb: int,
    max_processes: int,
    poll_s: float = 0.2,
    spin_s: float = 0.0,
    after_launch: float | None = None,
) -> dict:
    """The child's reply, within `timeout` and its limits (memory and processes of its session, read from /proc
    every `poll_s`); over a limit the child is killed. `spin_s`: see Channel.recv. `after_launch`: the command's
    forward says when it has returned and when the device is done (notices `launched` and `ran` before the reply);
    between the two only the device is waited for, and the wait may last this many seconds; the reply never comes
    later than `timeout`. Raises Stopped."""
    start, whole = time.monotonic(), timeout
    while True:
        try:
            reply, extra = channel.recv(
                timeout=min(poll_s, max(0.0, start + timeout - time.monotonic())), spin_s=spin_s
            )
            for fd in extra:
                os.close(fd)
            if after_launch is not None and set(reply) <= {"launched", "ran", "nonce"}:
                if reply.get("launched") is True:
                    timeout = min(whole, time.monotonic() - start + after_launch)
                elif reply.get("ran") is True:
                    timeout = whole
                continue
            return reply
        except TimeoutError:
            spin_s = 0.0  # only the first wait spins: a long call gains nothing from it
        except (ChannelClosed, ConnectionResetError, OSError):
            raise Stopped("crash", describe_exit(zygote.wait(pid, 5.0)) + " before replying") from None
        if time.monotonic() - start >= timeout:
            raise Stopped("timeout", "no reply", timeout)
        processes, used_kb = session_usage(pid)
        if processes > max_processes:
            zygote.end(pid)
            raise Stopped("processes", f"{processes} processes (limit {max_processes})")
        if used_kb > memory_kb:
            zygote.end(pid)
            raise Stopped("memory", f"out of memory: {used_kb // 1024} MB in use (limit {memory_kb // 1024} MB)")


# ---------------------------------------------------------------- process trees


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    stat = _stat(str(pid))
    return stat is not None and stat[0] not in ("Z", "X")


def kill_tree(root: int, wait_s: float = 2.0) -> list[int]:
    """SIGKILL a process and every descendant, however it detached (a new session or process group, a double fork:
    orphans stay in the tree, the sandboxed child and the zygote being subreapers). The tree is frozen first
    (SIGSTOP, again for whatever was forked meanwhile), so that nothing forks or is reparented out of it while it is
    killed; then all of it is killed, again until none is left. Returns those still alive after `wait_s`."""
    end = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(root, signal.SIGSTOP)
        stop_descendants(root, max(0.0, min(0.5, end - time.monotonic())))  # a stopped process does not fork
        doomed = [root, *tree(root)]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        while time.monotonic() < end and any(alive(pid) for pid in doomed):
            time.sleep(0.001)
        left = [pid for pid in [root, *tree(root)] if alive(pid)]
        if not left or time.monotonic() > end:
            return left


STOPPED = ("T", "t", "Z", "X")  # process states: stopped, traced, dead


def stop_all(pids: list[int], wait_s: float = 0.5) -> list[int]:
    """SIGSTOP these processes and wait (briefly) until each is stopped: a signal is delivered asynchronously.
    Returns those that were alive to be stopped."""
    stopped = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        except ProcessLookupError:
            pass
    end = time.monotonic() + wait_s
    for pid in stopped:
        while time.monotonic() < end and (_stat(str(pid)) or ["T"])[0] not in STOPPED:
            time.sleep(0.0005)
    return stopped


def stop_descendants(root: int, wait_s: float = 0.5) -> list[int]:
    """SIGSTOP every running descendant of `root` and wait until each of their threads has stopped; again for any
    process forked meanwhile. Orphans count: the zygote, the usual root, is its children's subreaper. Returns the
    pids it stopped (those stopped already, as the waiting pool, are left to whoever stopped them)."""
    stopped: list[int] = []
    while True:
        fresh = [pid for pid in tree(root) if pid not in stopped and not all_stopped(pid)]
        if not fresh:
            return stopped
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped += fresh
        end = time.monotonic() + wait_s
        for pid in fresh:
            while time.monotonic() < end and not all_stopped(pid):
                time.sleep(0.0001)


def stop_tree(root: int, wait_s: float = 0.5) -> list[int]:
    """SIGSTOP a process, wait until each of its threads has stopped, then its descendants (stop_descendants);
    the pids stopped, to resume (nothing where it is gone or was stopped already)."""
    if all_stopped(root):
        return stop_descendants(root, wait_s)
    try:
        os.kill(root, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    end = time.monotonic() + wait_s
    while time.monotonic() < end and not all_stopped(root):
        time.sleep(0.0001)
    return [root, *stop_descendants(root, wait_s)]


def tree(root: int) -> list[int]:
    """Every descendant of a process."""
    found, queue_ = [], descendants(root)
    while queue_:
        pid = queue_.pop()
        if pid not in found:
            found.append(pid)
            queue_ += descendants(pid)
    return found


def descendants(pid: int) -> list[int]:
    """The direct children of every thread of a process (/proc/<pid>/task/<tid>/children)."""
    children = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                children += [int(c) for c in f.read().split()]
    return children


def all_stopped(pid: int) -> bool:
    """Every thread of the process stopped (or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all((_stat(f"{pid}/task/{tid}") or ["T"])[0] in STOPPED for tid in tids)


def resume_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _stat(pid: str) -> list[str] | None:
    """Fields of /proc/<pid>/stat (or <pid>/task/<tid>) after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_usage(sid: int) -> tuple[int, int]:
    """(processes, memory KB) of the process `sid`: its session and its whole tree (a process in a session of its
    own is still a descendant), read from /proc.

    Memory is the proportional set size: forked children share their parent's pages, and summing resident sizes
    would count those pages once per child."""
    processes = memory_kb = 0
    members = set(tree(sid))
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if not stat or (int(stat[3]) != sid and int(entry.name) not in members):
            continue
        processes += 1
        memory_kb += pss_kb(entry.name, int(stat[21]))
    return processes, memory_kb


def move_threads(pid: int, cpus: list[int]) -> None:
    """Move every thread of a process to these cores (a process's own affinity covers only its main thread)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass
    except OSError:
        pass


# per process read by cpu_seconds: its descendants ever seen, by (pid, start time), and the CPU time last read of each
_SEEN: dict[int, dict[tuple[int, str], float]] = {}


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of everything it started: all its threads (exited ones too), the children it reaped
    (its cutime and cstime), and every descendant ever seen here, however detached, with its own reaped children,
    by the last reading of each (one that exited keeps it). A helper process doing part of the work counts as the
    process's own. The process's own time is read on its CPU-time clock, to the nanosecond; its descendants' on
    theirs; reaped children's in clock ticks. A child that both starts and ends between two readings counts where
    its parent reaps it, or as a zombie; a side's processes cannot have the kernel reap it unseen (SIGCHLD ignored,
    or SA_NOCLDWAIT: sandbox.tree_filter's keep_children)."""
    total = own_cpu_seconds(pid) + reaped_seconds(str(pid))
    seen = _SEEN.setdefault(pid, {})
    for child in tree(pid):
        stat = _stat(str(child))
        if stat is None:
            continue
        key = (child, stat[19])
        seen[key] = max(seen.get(key, 0.0), own_cpu_seconds(child) + reaped_seconds(str(child)))
    return total + sum(seen.values())


def forget(pid: int) -> None:
    """Drop what cpu_seconds remembers of a process that ended."""
    _SEEN.pop(pid, None)


def reaped_seconds(pid: str) -> float:
    stat = _stat(pid)
    return (int(stat[13]) + int(stat[14])) * cpu_tick_s() if stat else 0.0


def own_cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads together (exited ones too): its CPU-time clock, to the nanosecond,
    else /proc in clock ticks. Ticks are too coarse for windows of milliseconds: summed over 20 such windows, their
    rounding alone read a one-thread loop as 1.9 cores."""
    try:
        return time.clock_gettime(process_cpu_clock(pid))
    except (OSError, OverflowError):
        stat = _stat(str(pid))
        return (int(stat[11]) + int(stat[12])) * cpu_tick_s() if stat else 0.0


def process_cpu_clock(pid: int) -> int:
    """Linux's clock id for the CPU time of a whole process (what clock_getcpuclockid(3) returns)."""
    return ((~pid) << 3) | 2


def cpu_resolution_s(pid: int) -> float:
    """How finely cpu_seconds reads this process."""
    try:
        time.clock_gettime(process_cpu_clock(pid))
        return 1e-6
    except (OSError, OverflowError):
        return cpu_tick_s()


def cpu_tick_s() -> float:
    return 1.0 / os.sysconf("SC_CLK_TCK")


def pss_kb(pid: str, rss_pages: int = 0) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return rss_pages * (os.sysconf("SC_PAGE_SIZE") // 1024)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"

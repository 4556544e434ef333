"""The zygote: `python -m concur.verify.zygote <fd>` forks sandboxed children on request (see concur.verify.procs).

Requests on the control socket: {"op": "spawn", "ref", "spec"} forks a child and answers {"op": "spawned", "ref",
"pid"} with the parent's end of the child's own socket; {"op": "kill", "pid"} kills a child's whole process tree
and every orphan adopted here, each with its tree; each exit is reported as {"op": "exit", "pid", "code"}. At EOF
(the requester died) every child is killed and the zygote exits.

A sandboxed child is forked into a PID namespace of its own where the kernel allows it (root or CAP_SYS_ADMIN;
`CONCUR_NO_PIDNS` turns it off): the namespace's first process is a small reaper forked from here, and the child
(the builder or contestant, the pid the requester knows) its only child. Processes of the namespace see no process
outside it, so they cannot re-nice, re-prioritise or pin one (ESRCH), and when the child ends its reaper exits and
the kernel kills everything left in the namespace. Elsewhere the child is a subreaper of its own descendants and the
zygote kills its whole tree (procs.kill_tree); and it installs a seccomp filter first (sandbox.watch_others)
whose listener it hands here: the zygote lets a scheduling call (and, where Landlock cannot scope signals, a
signal) aimed at another process through only when that process is in the child's own tree (`CONCUR_FENCE_SIGNALS`
fences signals where Landlock could). In both cases a sandboxed child cannot start a process outside its own tree
(sandbox.stay_in_tree) nor keep any privilege (sandbox.drop_privileges).

A child's spec: role (contestant | builder | trusted), cwd, env, log, sandbox ({write, read, hidden, devices} or
null for trusted work), limits ({address_space_mb}).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import socket
import sys
import time
import traceback

from concur.verify import procs, sandbox

SWEEP_S = 0.5
# where Landlock cannot keep a candidate's signals within its sandbox (ABI < 6), the seccomp filter does
FENCE_SIGNALS = sandbox.landlock_abi() < 6 or bool(os.environ.get("CONCUR_FENCE_SIGNALS"))


def main(fd: int) -> int:
    if os.environ.get("CONCUR_CPUS"):  # contestants start on spare cores; the referee moves the one it judges
        os.sched_setaffinity(0, [int(c) for c in os.environ["CONCUR_CPUS"].split(",")])
    import torch  # noqa: F401  (preloaded for the children; CUDA is never initialised here)
    import torch.utils.cpp_extension  # noqa: F401

    if os.environ.get("CONCUR_PRELOAD_INDUCTOR"):  # the profiler's first start imports it: 4-8 s per contestant
        import torch._inductor  # noqa: F401

    sandbox.hide_memory()
    sandbox.become_subreaper()
    namespaces = None if os.environ.get("CONCUR_NO_PIDNS") else sandbox.PidNamespaces()
    control = procs.Channel(socket.socket(fileno=fd))
    known: dict[int, int] = {}  # the pid waited for (a child, or its namespace's reaper) -> the child's pid
    listeners: dict[int, int] = {}  # a child outside a PID namespace -> its filter's listener
    last_sweep = 0.0
    while True:
        ready = select.select([control, *listeners.values()], [], [], 0.05)[0]
        for pid, listener in list(listeners.items()):
            if listener in ready and not sandbox.answer_others(listener, functools.partial(_tree_of, pid)):
                os.close(listeners.pop(pid))
        if control in ready:
            try:
                message, fds = control.recv()
            except (procs.ChannelClosed, OSError, ValueError):
                break
            for extra in fds:
                os.close(extra)
            if message.get("op") == "spawn":
                waited, pid, parent_end, listener = fork_child(message["spec"], control, namespaces)
                known[waited] = pid
                if listener is not None:
                    listeners[pid] = listener
                control.send({"op": "spawned", "ref": message["ref"], "pid": pid}, [parent_end.fileno()])
                parent_end.close()
            elif message.get("op") == "kill":
                pid = int(message["pid"])
                procs._kill_group(pid)
                for waited in [w for w, p in known.items() if p == pid]:
                    procs.kill_tree(waited, 1.0)
                sweep(known)
        for waited, code in reap():
            if waited in known:
                pid = known.pop(waited)
                if pid in listeners:
                    os.close(listeners.pop(pid))
                if waited != pid and code > 128:  # the reaper exits with 128 + the signal that ended the child
                    code = 128 - code
                control.send({"op": "exit", "pid": pid, "code": code})
        if time.monotonic() - last_sweep > SWEEP_S:
            sweep(known)
            last_sweep = time.monotonic()
    for waited in list(known):
        procs.kill_tree(waited, 1.0)
    sweep({})
    return 0


def _tree_of(child: int) -> set[int]:
    """The child and every process it started: what its calls aimed at other processes may reach."""
    return {child, *procs.tree(child)}


def sweep(known: dict[int, int]) -> None:
    """Kill every child of this process that it did not fork itself, with its whole tree: orphans a child left
    behind (the zygote is their subreaper), however they detached."""
    for pid in procs.descendants(os.getpid()):
        if pid not in known and procs.alive(pid):
            procs.kill_tree(pid, 1.0)


def reap() -> list[tuple[int, int]]:
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)))


def fork_child(spec: dict, control: procs.Channel, namespaces) -> tuple[int, int, socket.socket, int | None]:
    """Fork a child for `spec`: (the pid to wait for, the child's pid, the parent's end of its socket, the listener
    of its filter or None). A sandboxed child goes into a PID namespace of its own where `namespaces` can
    make one (see the module docstring): the pid waited for is then its namespace's reaper. Elsewhere it installs a
    filter of the calls aimed at other processes (sandbox.watch_others) before anything else and hands its
    listener here."""
    parent_end, child_end = socket.socketpair()
    zygote = os.getpid()
    isolated = spec.get("sandbox") is not None and namespaces is not None and namespaces.enter()
    watched = spec.get("sandbox") is not None and not isolated
    filter_end, filter_child_end = socket.socketpair() if watched else (None, None)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if isolated and pid != 0:  # in the parent: its later children back in its own namespace
            namespaces.leave()
    if pid == 0:
        code = 1
        try:
            sandbox.die_with_parent()
            if isolated:  # the namespace's first process: the reaper; the child is its only child
                worker = os.fork()
                if worker != 0:
                    os.closerange(3, 1 << 16)
                    code = reap_namespace(worker)
                    os._exit(code)
                sandbox.die_with_parent()
            elif os.getppid() != zygote:
                os._exit(1)
            if watched:
                filter_end.close()
                listener = sandbox.watch_others(signals=FENCE_SIGNALS)
                socket.send_fds(filter_child_end, [b"l"], [] if listener is None else [listener])
                if listener is not None:
                    os.close(listener)
                filter_child_end.close()
            os.setsid()
            parent_end.close()
            control.sock.detach()
            code = start_child(spec, child_end) or 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    child_end.close()
    listener = None
    if watched:
        filter_child_end.close()
        listener = _received_listener(filter_end)
    return pid, worker_of(pid) if isolated else pid, parent_end, listener


def _received_listener(sock: socket.socket, wait_s: float = 10.0) -> int | None:
    """The listener a child sends as it starts (None: it has no filter, or it failed before sending)."""
    try:
        sock.settimeout(wait_s)
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        return fds[0] if fds else None
    except OSError:
        return None
    finally:
        sock.close()


def worker_of(reaper: int, wait_s: float = 10.0) -> int:
    """The child a namespace's reaper forked (its pid as this process sees it)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        children = procs.descendants(reaper)
        if children:
            return children[0]
        time.sleep(0.0005)
    return reaper


def reap_namespace(worker: int) -> int:
    """The reaper of a child's PID namespace: reap whatever is orphaned in it until the child ends, then exit with
    the child's exit code, or 128 + the signal that killed it; the kernel then kills whatever is left there."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == worker:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def start_child(spec: dict, sock: socket.socket) -> int:
    """In the child: its socket on fd 3, log on 1 and 2, every other descriptor closed, its folder, environment,
    limits and sandbox; then its role's entry point."""
    os.dup2(sock.fileno(), 3, inheritable=False)
    sock.detach() if sock.fileno() == 3 else sock.close()
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.closerange(4, 1 << 16)
    os.chdir(spec["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    sandbox.limit_resources((spec.get("limits") or {}).get("address_space_mb"))
    sandbox.become_subreaper()  # whatever its descendants orphan stays in its tree, to be counted and killed with it
    confined = "off"
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored SIGCHLD would be inherited from whatever started us
    if spec.get("sandbox") is not None:
        sandbox.stay_in_tree(keep_children=spec["role"] == "contestant")
        sandbox.drop_privileges()
        box = spec["sandbox"]
        box["around"] = sandbox.readable_around(box["hidden"])  # kept for a later layer (contestant.own_build)
        confined = sandbox.confine(box["write"], box["read"], box["hidden"], box["devices"], box["around"])
    channel = procs.Channel(socket.socket(fileno=3))
    _allow_cuda_after_fork()
    if spec["role"] == "contestant":
        from concur.verify import contestant

        return contestant.serve(channel, spec, confined)
    from concur.verify import build

    return build.build_child(channel, spec, confined)


def _allow_cuda_after_fork() -> None:
    """torch marks every fork child of a process that asked about CUDA as unable to use it; the zygote never
    initialised CUDA (its queries go through NVML), so its children may."""
    import torch

    if not torch.cuda.is_initialized():
        torch.cuda._is_in_bad_fork = lambda: False


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))

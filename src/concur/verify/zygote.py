"""The zygote: `python -m concur.verify.zygote <fd>` forks sandboxed children on request (see concur.verify.procs).

Requests on the control socket: {"op": "spawn", "ref", "spec"} forks a child and answers {"op": "spawned", "ref",
"pid"} with the parent's end of the child's own socket; {"op": "kill", "pid"} kills a child's session and every
orphan adopted here; each exit is reported as {"op": "exit", "pid", "code"}. At EOF (the requester died) every
child is killed and the zygote exits.

A child's spec: role (contestant | builder | trusted), cwd, env, log, sandbox ({write, read, hidden, devices} or
null for trusted work), limits ({address_space_mb}).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
import traceback

from concur.verify import procs, sandbox

SWEEP_S = 0.5


def main(fd: int) -> int:
    if os.environ.get("CONCUR_CPUS"):  # contestants start on spare cores; the referee moves the one it judges
        os.sched_setaffinity(0, [int(c) for c in os.environ["CONCUR_CPUS"].split(",")])
    import torch  # noqa: F401  (preloaded for the children; CUDA is never initialised here)
    import torch.utils.cpp_extension  # noqa: F401

    if os.environ.get("CONCUR_PRELOAD_INDUCTOR"):  # the profiler's first start imports it: 4-8 s per contestant
        import torch._inductor  # noqa: F401

    sandbox.hide_memory()
    sandbox.become_subreaper()
    control = procs.Channel(socket.socket(fileno=fd))
    known: set[int] = set()
    last_sweep = 0.0
    while True:
        if select.select([control], [], [], 0.05)[0]:
            try:
                message, fds = control.recv()
            except (procs.ChannelClosed, OSError, ValueError):
                break
            for extra in fds:
                os.close(extra)
            if message.get("op") == "spawn":
                pid, parent_end = fork_child(message["spec"], control)
                known.add(pid)
                control.send({"op": "spawned", "ref": message["ref"], "pid": pid}, [parent_end.fileno()])
                parent_end.close()
            elif message.get("op") == "kill":
                procs._kill_group(int(message["pid"]))
                sweep(known)
        for pid, code in reap():
            if pid in known:
                known.discard(pid)
                control.send({"op": "exit", "pid": pid, "code": code})
        if time.monotonic() - last_sweep > SWEEP_S:
            sweep(known)
            last_sweep = time.monotonic()
    for pid in list(known):
        procs._kill_group(pid)
    sweep(set())
    return 0


def sweep(known: set[int]) -> None:
    """Kill every child of this process that it did not fork itself: orphans a child left behind."""
    for pid in procs.children_of(os.getpid()):
        if pid not in known:
            procs._kill_group(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


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


def fork_child(spec: dict, control: procs.Channel) -> tuple[int, socket.socket]:
    parent_end, child_end = socket.socketpair()
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            sandbox.die_with_parent()
            if os.getppid() != zygote:
                os._exit(1)
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
    return pid, parent_end


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
    confined = "off"
    if spec.get("sandbox") is not None:
        box = spec["sandbox"]
        confined = sandbox.confine(box["write"], box["read"], box["hidden"], box["devices"])
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

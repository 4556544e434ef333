"""What confines an untrusted process (a candidate's build or run) before its code starts.

Landlock (Linux ≥ 5.13, unprivileged, root included) is the boundary: the process may write only its own folders;
it may read everything except the verifier's work and cache trees (other candidates' folders, verdict tables),
where it reads only what it is given; it cannot open TCP connections, signal or ptrace processes outside its
sandbox (the referee, the job), open their memory or descriptors under /proc, or connect to their abstract sockets,
nor (ABI 9) to named Unix sockets outside its own folders and NVIDIA's (`socket_folders`).
(Their /proc/<pid>/environ stays readable: the trusted processes are started with a scrubbed environment.) Where
Landlock is missing the process still runs, limited by rlimits only, and its verdict says so (`sandbox:none`).
Stdlib only: it runs in the forked child before anything else.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import struct
from pathlib import Path

_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same numbers on x86_64 and aarch64
_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE, _PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 38, 4, 1, 36
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_SETPCAP, _CAP_VERSION_3 = 8, 0x20080522
_CLONE_NEWPID = 0x20000000
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

# filesystem rights by the ABI version that introduced them
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_DIR_WRITES = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV, _RESOLVE_UNIX = 1 << 13, 1 << 14, 1 << 15, 1 << 16
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_ALL = (1 << 0) | (1 << 1)  # bind and connect TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets and signals
DEVICE_FILES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/urandom",
    "/dev/random",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
# where NVIDIA's services listen on named Unix sockets a CUDA client may connect to: the MPS control daemon's pipe
# folder (CUDA_MPS_PIPE_DIRECTORY, else its default) and nvidia-persistenced
NVIDIA_SOCKET_FOLDERS = ("/tmp/nvidia-mps", "/run/nvidia-persistenced", "/var/run/nvidia-persistenced")

_libc = ctypes.CDLL(None, use_errno=True)


def gpu_nodes(minor: int | None, dev: str = "/dev") -> list[str]:
    """The device files a process on the GPU of this minor number (`gpu_minor`) may open: every NVIDIA node except
    other GPUs' own (`/dev/nvidia<minor>`), so that it cannot start work on a GPU its referee does not hold. Where
    the GPU is unknown (None: a MIG instance, no driver listing), or its node is not in `dev` (a container that
    renamed it), every GPU's node."""
    try:
        names = sorted(name for name in os.listdir(dev) if name.startswith("nvidia"))
    except OSError:
        return []
    if f"nvidia{minor}" not in names:
        minor = None
    return [
        f"{dev}/{name}"
        for name in names
        if minor is None or not name[len("nvidia") :].isdigit() or name == f"nvidia{minor}"
    ]


def cuda_name(uuid: str) -> str:
    """The GPU with `uuid` as CUDA_VISIBLE_DEVICES names it. A process confined to one GPU's node must be given it
    this way: the driver numbers only the GPUs it can open, so any other GPU's index names a different one or
    none ("No CUDA GPUs are available")."""
    return "GPU-" + uuid.removeprefix("GPU-").removeprefix("gpu-")


def gpu_minor(uuid: str, proc: str = "/proc/driver/nvidia/gpus") -> int | None:
    """The minor number of the GPU with `uuid` (its /dev/nvidia<minor>), as the driver lists it under `proc`."""
    wanted = uuid.lower().removeprefix("gpu-")
    try:
        folders = os.listdir(proc)
    except OSError:
        return None
    for folder in folders:
        try:
            lines = Path(proc, folder, "information").read_text().splitlines()
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        if (
            fields.get("GPU UUID", "").lower().removeprefix("gpu-") == wanted
            and fields.get("Device Minor", "").isdigit()
        ):
            return int(fields["Device Minor"])
    return None


def _syscall(number: int, *args) -> int:
    return _libc.syscall(ctypes.c_long(number), *args)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    version = _syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, version)


def _handled_fs(abi: int) -> int:
    rights = _EXECUTE | _WRITE_FILE | _READ_FILE | _READ_DIR | _DIR_WRITES
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    if abi >= 9:
        rights |= _RESOLVE_UNIX  # connect/sendmsg to a named Unix socket (Linux 7.1)
    return rights


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _add_path(ruleset: int, path: str, rights: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist grants nothing
    try:
        is_dir = Path(f"/proc/self/fd/{fd}").is_dir()
        allowed = (rights if is_dir else rights & _FILE_RIGHTS) & handled
        rule = _PathBeneath(allowed, fd)
        if allowed and _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def readable_around(hidden: list[str]) -> list[str]:
    """Paths that together cover the whole filesystem except the `hidden` trees: every sibling of each folder on
    the way from / down to a hidden path (Landlock only grants; it cannot take a subtree back)."""
    hidden_real = {os.path.realpath(h) for h in hidden}
    ancestors = {str(p) for h in hidden_real for p in Path(h).parents}
    granted, todo = [], ["/"]
    while todo:
        folder = todo.pop()
        try:
            entries = [os.path.join(folder, e) for e in os.listdir(folder)]
        except OSError:
            continue
        for entry in entries:
            real = os.path.realpath(entry)
            if real in hidden_real or entry in hidden_real:
                continue
            if entry in ancestors and not os.path.islink(entry):
                todo.append(entry)
            elif real not in ancestors:
                granted.append(entry)
    return granted


def confine(
    write: list[str], read: list[str], hidden: list[str], devices: list[str], around: list[str] | None = None
) -> str:
    """Apply the Landlock sandbox to this process (irreversible; inherited by its children).

    write: folders it may change; read: paths inside `hidden` it may still read; hidden: trees it may not see;
    devices: the GPU device files it may open (`gpu_nodes`), besides the common ones (DEVICE_FILES); around:
    readable_around(hidden), when computed already. Returns "landlock" or "none" (no Landlock here)."""
    abi = landlock_abi()
    if abi < 1:
        return "none"
    handled = _handled_fs(abi)
    attr = (ctypes.c_uint64 * 3)(handled, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    read_rights = _EXECUTE | _READ_FILE | _READ_DIR
    grants = [(path, read_rights) for path in (readable_around(hidden) if around is None else around) + list(read)]
    # CUDA's initialisation names its threads through /proc/self/task/<tid>/comm: the process's own threads only
    grants += [(path, handled) for path in [*write, "/proc/self/task"]]
    grants += [(path, _READ_FILE | _WRITE_FILE | _IOCTL_DEV) for path in [*DEVICE_FILES, *devices]]
    grants += [(path, _RESOLVE_UNIX) for path in socket_folders()]
    _restrict(attr, size, handled, grants)
    return "landlock"


def socket_folders() -> list[str]:
    """The folders outside its own where a confined process may connect to named Unix sockets (from Landlock ABI
    9; below it, to any the user may): NVIDIA's services' only. Sockets in its own folders, and any it made itself,
    stay reachable; a service the user runs elsewhere (an ssh agent, munge, a container daemon) does not."""
    mps = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    return [*NVIDIA_SOCKET_FOLDERS, *([mps] if mps else [])]


def confine_reads(read: list[str], around: list[str], write: list[str] = ()) -> bool:
    """One more Landlock layer, on reads alone: only `around` (readable_around of the hidden trees, computed before
    the first layer, which hides the folders on the way to them), `read` and `write` stay readable (a process
    already confined keeps its first layer's rules: a layer only ever takes rights away). A contestant forked before
    its job is known adds it as it loads its program, for its own build. Every layer denies moving a file to another
    folder unless it grants that (Landlock's REFER, from ABI 2), so `write` (the folders the first layer lets it
    change) keeps it here: Triton and inductor write their caches by renaming. False without Landlock."""
    abi = landlock_abi()
    if abi < 1:
        return False
    reads = _EXECUTE | _READ_FILE | _READ_DIR
    handled = reads | (_REFER if abi >= 2 else 0)
    grants = [(path, reads) for path in [*around, *read]] + [(path, handled) for path in write]
    _restrict(ctypes.c_uint64(handled), 8, handled, grants)
    return True


def _no_new_privileges() -> None:
    """This process and whatever it executes gain no privilege from set-user-ID files or file capabilities (what
    Landlock and seccomp ask of an unprivileged process first)."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _restrict(attr, size: int, handled: int, grants: list[tuple[str, int]]) -> None:
    """One Landlock layer on this process: a ruleset handling `handled` (and what `attr` adds), `grants` (path,
    rights) its only exceptions."""
    ruleset = _syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, rights in grants:
            _add_path(ruleset, path, rights, handled)
        _no_new_privileges()
        if _syscall(_SYS_RESTRICT, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


class PidNamespaces:
    """Children forked into PID namespaces of their own (root, or CAP_SYS_ADMIN): a sandboxed child then sees no
    process outside its namespace, so it cannot name one to re-nice, re-prioritise or pin it (ESRCH), and when the
    namespace's first process ends the kernel kills every process left in it, however it detached.

    `enter()` before a fork puts the next child into a new namespace (False where the kernel refuses: unprivileged,
    or namespaces disabled); `leave()` after it puts later children back into this process's own."""

    def __init__(self):
        try:
            self.own: int | None = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.own = None

    def enter(self) -> bool:
        if self.own is None:
            return False
        if _libc.unshare(_CLONE_NEWPID) != 0:
            os.close(self.own)
            self.own = None  # not allowed here: never asked again
            return False
        return True

    def leave(self) -> None:
        if _libc.setns(self.own, _CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "setns(CLONE_NEWPID)")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges() -> None:
    """No privilege left, for a process run as root (a container, a cloud GPU machine) as for one that is not: every
    capability dropped (from the bounding set where CAP_SETPCAP allows it, and from the effective, permitted,
    inheritable and ambient sets), so it cannot set or slew the clocks the referee times with, lock the GPU's
    clocks (NVML's calls for administrators), load a kernel module, reconfigure the network, read physical memory,
    reboot, bypass file permissions, or re-nice or pin any process; and no raising of its own priority
    (RLIMIT_NICE and RLIMIT_RTPRIO at 0). No new privileges either, so a program it executes, root's included,
    gains none back. Raising its nice value stays allowed; its cores are the referee's (tree_filter); what else it
    may aim at is watch_others'."""
    for limit in (resource.RLIMIT_NICE, resource.RLIMIT_RTPRIO):
        resource.setrlimit(limit, (0, 0))
    _no_new_privileges()
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):  # fails without CAP_SETPCAP: then the bounding set stays, and no-new-privs holds
        if cap != _CAP_SETPCAP:
            _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(_PR_CAPBSET_DROP, _CAP_SETPCAP, 0, 0, 0)  # the right to drop the others goes last
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if _libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")


# seccomp: the calls a process aims at another process: its scheduling, limits and memory placement, and (where
# Landlock cannot scope them, ABI < 6) its signals. A sandboxed process may aim them at itself freely; any other
# target is asked of the zygote (a user notification), which lets the call through only for a thread, process or
# process group of the child's own tree (watch_others, answer_others).
_CALLS = {  # machine: (audit arch, the seccomp syscall, {call: number})
    "x86_64": (0xC000003E, 317, dict(setpriority=141, sched_setparam=142, sched_setscheduler=144,
                                     sched_setaffinity=203, ioprio_set=251, migrate_pages=256, move_pages=279,
                                     prlimit64=302, sched_setattr=314, kill=62, tkill=200, tgkill=234,
                                     rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, pidfd_send_signal=424)),
    "aarch64": (0xC00000B7, 277, dict(ioprio_set=30, sched_setparam=118, sched_setscheduler=119,
                                      sched_setaffinity=122, setpriority=140, migrate_pages=238, move_pages=239,
                                      prlimit64=261, sched_setattr=274, kill=129, tkill=130, tgkill=131,
                                      rt_sigqueueinfo=138, rt_tgsigqueueinfo=240, pidfd_send_signal=424)),
}  # fmt: skip
SIGNALS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal")
_ONE_PROCESS = {"setpriority": 0, "ioprio_set": 1}  # PRIO_PROCESS, IOPRIO_WHO_PROCESS: the target is then args[1]
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF: load a word of seccomp_data, jump if equal / if >=, return
_ALLOW, _NOTIFY, _DENY = 0x7FFF0000, 0x7FC00000, 0x00050000 | errno.EPERM
_NOTIF_RECV, _NOTIF_SEND, _NOTIF_CONTINUE, _NEW_LISTENER = 0xC0502100, 0xC0182101, 1, 1 << 3


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _Notification(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("nr", ctypes.c_int32),
        ("arch", ctypes.c_uint32),
        ("ip", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * 6),
    ]


class _Response(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32)]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _native_calls_only(machine: str) -> list[bytes]:
    """The start of every filter here: calls through another architecture's entry point (i386, x32) refused, then
    the call's number loaded."""
    program = [_op(_LD, 4), _op(_JEQ, _CALLS[machine][0], 1, 0), _op(_RET, _DENY), _op(_LD, 0)]
    if machine == "x86_64":
        program += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, _DENY)]
    return program


def _install(program: bytes, flags: int) -> int:
    """Install a BPF program on this process and whatever it starts (no new privileges first, as seccomp asks of an
    unprivileged process): what the seccomp call returned, -1 where it could not be made."""
    code = ctypes.create_string_buffer(program)
    compiled = _Program(len(code.raw) // 8, ctypes.cast(code, ctypes.c_void_p))
    try:
        _no_new_privileges()
    except OSError:
        return -1
    return _syscall(_CALLS[os.uname().machine][1], ctypes.c_uint(1), ctypes.c_uint(flags), ctypes.byref(compiled))


def others_filter(machine: str, own: int, signals: bool) -> bytes:
    """The BPF program of watch_others for a process whose pid is `own`: calls through another architecture's entry
    point (i386, x32) refused; each call of _CALLS allowed when aimed at itself (0 or `own`), otherwise notified.
    Refused outright: setpriority and ioprio_set on a process group or a user, kill(-1) (every process the user
    may signal), pidfd_send_signal (its target cannot be read from outside). Everything else allowed."""
    numbers = _CALLS[machine][2]
    program = _native_calls_only(machine)
    for name, number in numbers.items():
        if name in SIGNALS and not signals:
            continue
        if name == "pidfd_send_signal":
            block = [_op(_RET, _DENY)]
        else:
            block = [_op(_LD, 16)]  # the target: args[0], or args[1] once args[0] names one process
            if name in _ONE_PROCESS:
                block += [_op(_JEQ, _ONE_PROCESS[name], 1, 0), _op(_RET, _DENY), _op(_LD, 24)]
            if name == "kill":
                block += [_op(_JEQ, 0xFFFFFFFF, 0, 1), _op(_RET, _DENY)]
            block += [_op(_JEQ, 0, 2, 0), _op(_JEQ, own, 1, 0), _op(_RET, _NOTIFY), _op(_RET, _ALLOW)]
        program += [_op(_LD, 0), _op(_JEQ, number, 0, len(block)), *block]
    return b"".join([*program, _op(_RET, _ALLOW)])


_CLONE_PARENT, _JSET, _NO_SYSCALL = 0x00008000, 0x45, 0x00050000 | errno.ENOSYS
_CLONES = {"x86_64": (56, 435), "aarch64": (220, 435)}  # machine: (clone, clone3)
_SOCKETS = {"x86_64": (41, 425), "aarch64": (198, 425)}  # machine: (socket, io_uring_setup)
_SIGACTION, _SIGCHLD = {"x86_64": 13, "aarch64": 134}, 17  # rt_sigaction; SIGCHLD is 17 on both
_AF_UNIX, _AF_NETLINK, _NO_ACCESS, _PRETEND = 1, 16, 0x00050000 | errno.EACCES, 0x00050000  # errno 0: "done"


def tree_filter(machine: str, keep_children: bool = False) -> bytes:
    """The BPF program of stay_in_tree: clone with CLONE_PARENT refused (EPERM), clone3 answered ENOSYS (its flags
    lie in memory a filter cannot read; the C library then falls back to clone, as it does under container
    runtimes), calls through another architecture's entry point refused. No network: a socket of any family but Unix
    and netlink (the kernel's own, for reading interfaces) refused with EACCES, as Landlock refuses a connect, so
    no IPv4 or IPv6 of any kind, TCP, UDP or raw; io_uring refused (EPERM: its operations open and connect sockets
    past any filter). Cores are the referee's to choose: sched_setaffinity, on any thread, returns success and
    changes nothing, so no thread moves onto a neighbour's cores and no caller that pins its threads (OpenMP,
    pthread_create with an affinity) fails. `keep_children` (a side, whose CPU time is judged): no action set for
    SIGCHLD (rt_sigaction with one, EPERM; a query goes through), so no child is reaped by the kernel unseen: with
    SIGCHLD ignored, or SA_NOCLDWAIT, a child's CPU time would vanish at its exit instead of going to its parent's.
    Everything else allowed."""
    clone, clone3 = _CLONES[machine]
    sock, uring = _SOCKETS[machine]
    program = _native_calls_only(machine) + [_op(_JEQ, clone3, 0, 1), _op(_RET, _NO_SYSCALL)]
    program += [_op(_JEQ, _CALLS[machine][2]["sched_setaffinity"], 0, 1), _op(_RET, _PRETEND)]
    if keep_children:
        program += [
            _op(_JEQ, _SIGACTION[machine], 0, 8),  # not rt_sigaction: on
            _op(_LD, 16),  # the signal
            _op(_JEQ, _SIGCHLD, 0, 5),
            _op(_LD, 24),  # the new action's address, low half then high: NULL asks, anything else sets
            _op(_JEQ, 0, 0, 2),
            _op(_LD, 28),
            _op(_JEQ, 0, 1, 0),
            _op(_RET, _DENY),
            _op(_LD, 0),  # the call's number again, for the checks below
        ]
    program += [_op(_JEQ, uring, 0, 1), _op(_RET, _DENY)]
    program += [
        _op(_JEQ, sock, 0, 5),  # not socket(): on to clone's check
        _op(_LD, 16),  # the family
        _op(_JEQ, _AF_UNIX, 2, 0),
        _op(_JEQ, _AF_NETLINK, 1, 0),
        _op(_RET, _NO_ACCESS),
        _op(_RET, _ALLOW),
    ]
    program += [_op(_JEQ, clone, 0, 3), _op(_LD, 16), _op(_JSET, _CLONE_PARENT, 0, 1), _op(_RET, _DENY)]
    return b"".join([*program, _op(_RET, _ALLOW)])


def stay_in_tree(keep_children: bool = False) -> bool:
    """Keep every process this one starts in its own process tree, off the network and on the cores it is given:
    CLONE_PARENT would make a process its parent's child (the zygote's, or its namespace's reaper's), outside the
    tree that is stopped while the other side is timed, counted in its CPU time and killed with it; sockets, cores
    and (`keep_children`) SIGCHLD as tree_filter says. False where the filter cannot be installed (another
    architecture, no seccomp)."""
    machine = os.uname().machine
    return machine in _CLONES and _install(tree_filter(machine, keep_children), 0) == 0


def watch_others(signals: bool) -> int | None:
    """Install the filter of the calls aimed at other processes (`signals`: signals too) on this process and
    whatever it starts; the listener's descriptor, for the zygote to answer (answer_others). None where seccomp's
    user notifications are missing (Linux < 5.5, another architecture): the referee's guard is then all there is."""
    machine = os.uname().machine
    if machine not in _CALLS:
        return None
    listener = _install(others_filter(machine, os.getpid(), signals), _NEW_LISTENER)
    return listener if listener >= 0 else None


def answer_others(listener: int, tree) -> bool:
    """Answer one notified call: through when its target is in `tree()` (the pids of the child and of everything
    it started): a thread of one of them, one of them, or (kill with a negative pid) a process group one of them is
    in; else EPERM. False when the listener has nothing more to say (its processes are gone)."""
    note = _Notification()
    if _libc.ioctl(listener, _NOTIF_RECV, ctypes.byref(note)) != 0:
        return ctypes.get_errno() in (errno.ENOENT, errno.EINTR)  # the caller died meanwhile: more may come
    arch, _, numbers = _CALLS[os.uname().machine]
    index = 1 if note.nr in (numbers["setpriority"], numbers["ioprio_set"]) else 0
    target = ctypes.c_int32(note.args[index] & 0xFFFFFFFF).value
    if note.arch != arch or target in (0, -1):
        allowed = False
    elif target < 0:
        allowed = note.nr == numbers["kill"] and any(_group_of(pid) == -target for pid in tree())
    else:
        allowed = _thread_group(target) in tree()
    reply = _Response(note.id, 0, 0 if allowed else -errno.EPERM, _NOTIF_CONTINUE if allowed else 0)
    _libc.ioctl(listener, _NOTIF_SEND, ctypes.byref(reply))  # ENOENT: the caller died meanwhile
    return True


def _thread_group(tid: int) -> int | None:
    """The process a thread belongs to (its Tgid), None when it is gone."""
    try:
        with open(f"/proc/{tid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("Tgid:"))
    except (OSError, StopIteration, ValueError):
        return None


def _group_of(pid: int) -> int | None:
    """A process's process group, None when it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it ends (call right after fork, from a main loop)."""
    _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants (a candidate's double fork) are reparented here, where they can be found and killed:
    the zygote for what its children leave, and each sandboxed child for what its own descendants leave, so that
    the child's process tree holds everything it started while it lives (procs.tree)."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def hide_memory() -> None:
    """Without Landlock, a same-user process could still read a trusted process's memory through ptrace or
    /proc/<pid>/mem; a non-dumpable process refuses both to anyone but root."""
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def limit_resources(address_space_mb: int | None = None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if address_space_mb:
        limit = address_space_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

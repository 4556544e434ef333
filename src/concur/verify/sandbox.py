"""What confines an untrusted process (a candidate's build or run) before its code starts.

Landlock (Linux ≥ 5.13, unprivileged, root included) is the boundary: the process may write only its own folders;
it may read everything except the verifier's work and cache trees (other candidates' folders, verdict tables),
where it reads only what it is given; it cannot open TCP connections, signal or ptrace processes outside its
sandbox (the referee, the job), open their memory or descriptors under /proc, or connect to their abstract sockets.
(Their /proc/<pid>/environ stays readable: the trusted processes are started with a scrubbed environment.) Where
Landlock is missing the process still runs, limited by rlimits only, and its verdict says so (`sandbox:none`).
Stdlib only: it runs in the forked child before anything else.
"""

from __future__ import annotations

import ctypes
import os
import resource
from pathlib import Path

_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same numbers on x86_64 and aarch64
_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE, _PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 38, 4, 1, 36
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

# filesystem rights by the ABI version that introduced them
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_DIR_WRITES = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
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

_libc = ctypes.CDLL(None, use_errno=True)


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


def confine(write: list[str], read: list[str], hidden: list[str], devices: bool) -> str:
    """Apply the Landlock sandbox to this process (irreversible; inherited by its children).

    write: folders it may change; read: paths inside `hidden` it may still read; hidden: trees it may not see.
    Returns "landlock" or "none" (no Landlock here)."""
    abi = landlock_abi()
    if abi < 1:
        return "none"
    handled = _handled_fs(abi)
    attr = (ctypes.c_uint64 * 3)(handled, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = _syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        read_rights = _EXECUTE | _READ_FILE | _READ_DIR
        for path in readable_around(hidden) + list(read):
            _add_path(ruleset, path, read_rights, handled)
        # CUDA's initialisation names its threads through /proc/self/task/<tid>/comm: the process's own threads only
        for path in [*write, "/proc/self/task"]:
            _add_path(ruleset, path, handled, handled)
        device_paths = list(DEVICE_FILES)
        if devices:
            device_paths += [f"/dev/{name}" for name in os.listdir("/dev") if name.startswith("nvidia")]
        for path in device_paths:
            _add_path(ruleset, path, _READ_FILE | _WRITE_FILE | _IOCTL_DEV, handled)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(_SYS_RESTRICT, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return "landlock"


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it ends (call right after fork, from a main loop)."""
    _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants (a candidate's double fork) are reparented here, where they can be found and killed."""
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

"""Containment across processes (CPU, no GPU): what a build child or contestant starts dies with it, cannot touch
the judges' scheduling, counts in its CPU time, and reads only its own build.

Each attack runs at import in a real sandboxed builder child of a real zygote (no extension is built: a few seconds
each), once in a PID namespace of its own and once without (`CONCUR_NO_PIDNS`, the fallback where the kernel
refuses namespaces); each has an honest twin that must keep working.
"""

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from concur.verify import compiling, procs, sandbox
from concur.verify.orchestrate import trusted_env

SETTINGS = {"device": "cpu", "timeout_s": 60, "memory_limit_mb": 8192, "max_processes": 64}
LANDLOCK = sandbox.landlock_abi() >= 1


def pid_namespaces_allowed() -> bool:
    spaces = sandbox.PidNamespaces()
    if not spaces.enter():
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    spaces.leave()
    os.waitpid(pid, 0)
    return True


PIDNS = pid_namespaces_allowed()


def seccomp_notifications() -> bool:
    """Whether a process here can install the scheduling filter (in a throwaway child: the filter stays for life)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if sandbox.watch_others(signals=False) is not None else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


SECCOMP = seccomp_notifications()


@pytest.fixture(scope="module", params=["pidns", "fallback"])
def zygote(request):
    if request.param == "pidns" and not PIDNS:
        pytest.skip("PID namespaces not allowed here")
    # the fallback also fences signals, which Landlock scopes here already (ABI >= 6)
    fallback = {"CONCUR_NO_PIDNS": "1", "CONCUR_FENCE_SIGNALS": "1"}
    env = {**trusted_env(), **(fallback if request.param == "fallback" else {})}
    zygote = procs.Zygote(env=env, clean=True)
    zygote.mode = request.param
    yield zygote
    zygote.close()


def build(zygote, program: str, tmp_path: Path) -> tuple[dict, Path]:
    """Run `program` at import in a sandboxed builder child; its row and its scratch folder (where it writes)."""
    cache, scratch = tmp_path / "cache", tmp_path / "scratch" / "mine"
    cache.mkdir(exist_ok=True)
    row = compiling.build(zygote, textwrap.dedent(program), SETTINGS, cache, scratch, 1)
    return row, scratch


def host_pid() -> str:
    return "int(os.readlink('/proc/self'))"  # the pid as the judges see it, inside a PID namespace too


CHAIN = f"""
import os, time
def record(name):
    open(name, "a").write(f"{{{host_pid()}}}\\n")
def chain(depth):
    if depth == 0:
        while True:
            time.sleep(0.05)
    if os.fork() == 0:
        if depth % 2:
            os.setsid()
        else:
            os.setpgid(0, 0)
        record("chain.pids")
        if os.fork() == 0:
            chain(depth - 1)
        if depth % 3 == 0:
            os._exit(0)  # the rest of the chain is orphaned
        while True:
            time.sleep(0.05)
chain(5)
time.sleep(0.3)
"""


def test_a_detached_process_chain_dies_with_its_build(zygote, tmp_path):
    """Forked, setsid'd, in new process groups, orphaned at every third link: every process of the chain is gone
    once the build is done."""
    row, scratch = build(zygote, CHAIN, tmp_path)
    assert row["status"] == "no_build", row
    pids = [int(p) for p in (scratch / "chain.pids").read_text().split()]
    assert len(pids) == 5
    end = time.monotonic() + 3
    while time.monotonic() < end and any(procs.alive(p) for p in pids):
        time.sleep(0.02)
    assert [p for p in pids if procs.alive(p)] == []
    assert zygote.clear_leftovers() == []


ESCAPE = f"""
import ctypes, errno, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE_PARENT, SIGCHLD = 0x8000, 17
clone, clone3 = {{"x86_64": (56, 435), "aarch64": (220, 435)}}[os.uname().machine]
got = []
def outcome(returned):
    if returned == 0:  # the new process, its parent's sibling: it notes itself and stays
        open("escaped.pids", "a").write(f"{{{host_pid()}}}\\n")
        time.sleep(30)
        os._exit(0)
    got.append("ok" if returned > 0 else errno.errorcode[ctypes.get_errno()])
outcome(libc.syscall(clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0))
class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("flags", "pidfd", "child", "parent", "signal", "stack", "size", "tls")]
outcome(libc.syscall(clone3, ctypes.byref(Args(flags=CLONE_PARENT, signal=SIGCHLD)), ctypes.c_size_t(64)))
thread = threading.Thread(target=lambda: got.append("thread"))
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
got.append("fork" if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7 else "no fork")
open("escape.txt", "w").write(" ".join(got))
"""


def test_nothing_a_build_starts_leaves_its_tree(zygote, tmp_path):
    """clone with CLONE_PARENT would start a process as its parent's child (the zygote's, or its namespace
    reaper's): outside the tree that is stopped while the other side is timed, counted and killed. Refused, and
    clone3 (whose flags a filter cannot read) answered ENOSYS; threads and fork work as before."""
    row, scratch = build(zygote, ESCAPE, tmp_path)
    assert row["status"] == "no_build", row
    assert (scratch / "escape.txt").read_text() == "EPERM ENOSYS thread fork"
    assert not (scratch / "escaped.pids").exists()


# a lower nice value and a real-time policy for the program itself, each noted in `own` where it was allowed
RAISE_OWN = """with contextlib.suppress(OSError):
    os.setpriority(os.PRIO_PROCESS, 0, -10)
    own.append("nice")
with contextlib.suppress(OSError):
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    own.append("fifo")
"""
JUDGES = (
    """
import contextlib, os
mine, hit, own = set(), [], []
for entry in os.listdir("/proc"):
    with contextlib.suppress(OSError):
        if entry.isdigit() and (b"concur" in open(f"/proc/{entry}/cmdline", "rb").read()
                                or b"pytest" in open(f"/proc/{entry}/cmdline", "rb").read()):
            mine.add(int(entry))
mine.discard(int(os.readlink("/proc/self")))
for pid in mine:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a hit only if it moved: the filter answers "done" and does nothing
            cores = os.sched_getaffinity(int(tid))
            os.sched_setaffinity(int(tid), {0} if cores != {0} else {1})
            if os.sched_getaffinity(int(tid)) != cores:
                hit.append(("affinity", tid))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
            hit.append(("nice", tid))
"""
    + RAISE_OWN
    + """with contextlib.suppress(OSError):
    os.setpriority(os.PRIO_USER, 0, 19)
    own.append("user")
open("hit.txt", "w").write(f"{len(mine)} {len(hit)} {len(own)}")
"""
)


# a judge as an unprivileged user's would be: the same user, no capabilities (as root, the kernel alone refuses a
# candidate that dropped CAP_SYS_NICE the right to re-nice a process holding more capabilities than it has)
VICTIM = """
import ctypes, time
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
ctypes.CDLL(None).capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())
print("ready", flush=True)
time.sleep(120)
"""


def test_a_candidate_cannot_renice_or_pin_the_judges(zygote, tmp_path):
    """Re-nicing or pinning each thread of every process of the verifier (the zygote, the test itself, a judge of no
    capabilities) fails, and so does re-nicing the user's processes or raising its own priority: from inside a PID
    namespace no judge can be named; without one, the scheduling filter refuses every target outside the
    candidate's own tree (without it, the capability-less judge is re-niced and pinned)."""
    if zygote.mode == "fallback" and not SECCOMP:
        pytest.skip("no seccomp user notifications here: the referee's guard is all there is")
    judge = subprocess.Popen([sys.executable, "-c", VICTIM, "concur-judge"], stdout=subprocess.PIPE, text=True)
    try:
        assert judge.stdout.readline().strip() == "ready"
        before = [(os.sched_getaffinity(p), os.getpriority(os.PRIO_PROCESS, p)) for p in (0, judge.pid)]
        build(zygote, JUDGES, tmp_path)
        found, hit, own = map(int, (tmp_path / "scratch" / "mine" / "hit.txt").read_text().split())
        assert found >= (2 if zygote.mode == "pidns" else 3) and hit == 0 and own == 0
        assert [(os.sched_getaffinity(p), os.getpriority(os.PRIO_PROCESS, p)) for p in (0, judge.pid)] == before
    finally:
        judge.kill()
        judge.wait()


FENCED = """
import contextlib, errno, os, signal, subprocess, threading, time
os.setsid()  # as the zygote's children: a process group of its own
result = []
def attempt(name, call):
    try:
        call()
        result.append(name + ":ok")
    except OSError as error:
        result.append(name + ":" + errno.errorcode[error.errno])
judge, cpus = int(os.environ["JUDGE"]), os.sched_getaffinity(0)
helper = subprocess.Popen(["sleep", "30"])
attempt("judge-signal", lambda: os.kill(judge, 0))
attempt("judge-group", lambda: os.killpg(os.getpgid(judge), 0))
attempt("everyone", lambda: os.kill(-1, 0))
attempt("judge-pidfd", lambda: signal.pidfd_send_signal(os.pidfd_open(judge), 0))
attempt("judge-cores", lambda: os.sched_setaffinity(judge, cpus))
attempt("self-signal", lambda: os.kill(os.getpid(), 0))
attempt("own-group", lambda: os.killpg(0, 0))
attempt("helper-cores", lambda: os.sched_setaffinity(helper.pid, cpus))
attempt("helper-signal", lambda: os.kill(helper.pid, signal.SIGTERM))
def pin():
    attempt("thread-cores", lambda: os.sched_setaffinity(threading.get_native_id(), cpus))
thread = threading.Thread(target=pin)
thread.start()
thread.join()
helper.wait()
print(" ".join(result), flush=True)
"""


@pytest.mark.skipif(not SECCOMP, reason="no seccomp user notifications here")
def test_the_filter_keeps_signals_and_scheduling_within_the_tree(tmp_path):
    """sandbox.watch_others with signals, answered by sandbox.answer_others as the zygote answers (no Landlock, so
    the kernel alone would allow all of it): a process outside the tree cannot be signalled, by pid, by group or
    by pidfd, nor pinned; kill(-1) is refused; the process itself, its group, a helper it started and its threads
    can be. The judge: a same-user process of no capabilities, as an unprivileged user's."""
    import socket

    judge = subprocess.Popen([sys.executable, "-c", VICTIM, "concur-judge"], stdout=subprocess.PIPE, text=True)
    assert judge.stdout.readline().strip() == "ready"
    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(read)
        listener = sandbox.watch_others(signals=True)
        socket.send_fds(theirs, [b"l"], [listener])
        os.dup2(write, 1)
        os.environ["JUDGE"] = str(judge.pid)
        os.execv(sys.executable, [sys.executable, "-c", FENCED])
    theirs.close()
    os.close(write)
    listener = socket.recv_fds(ours, 1, 1)[1][0]
    try:
        out, end = b"", time.monotonic() + 30
        while time.monotonic() < end and not out.endswith(b"\n"):
            import select

            ready = select.select([listener, read], [], [], 0.05)[0]
            if listener in ready:
                sandbox.answer_others(listener, lambda: {pid, *procs.tree(pid)})
            if read in ready:
                out += os.read(read, 4096) or b"\n"
        assert out.decode().split() == [
            "judge-signal:EPERM",
            "judge-group:EPERM",
            "everyone:EPERM",
            "judge-pidfd:EPERM",
            "judge-cores:EPERM",
            "self-signal:ok",
            "own-group:ok",
            "helper-cores:ok",
            "helper-signal:ok",
            "thread-cores:ok",
        ]
    finally:
        os.waitpid(pid, 0)
        os.close(listener)
        os.close(read)
        judge.kill()
        judge.wait()


SECOND_LISTENER = """
from concur.verify import sandbox
open("listener.txt", "w").write("refused" if sandbox.watch_others(signals=True) is None else "installed")
"""


def test_a_candidate_cannot_answer_its_own_scheduling_calls(zygote, tmp_path):
    """A filter of its own whose listener a thread of its own answers would let its calls through: the kernel
    allows one listener in a process's filter chain, the zygote's (EBUSY)."""
    if zygote.mode != "fallback" or not SECCOMP:
        pytest.skip("the scheduling filter is installed outside PID namespaces, where seccomp allows it")
    _, scratch = build(zygote, SECOND_LISTENER, tmp_path)
    assert (scratch / "listener.txt").read_text() == "refused"


OWN = (
    """
import contextlib, os
own = []
"""
    + RAISE_OWN
    + """open("own.txt", "w").write(" ".join(own) or "none")
"""
)


def test_a_candidate_cannot_raise_its_own_priority(zygote, tmp_path):
    """A lower nice value or a real-time policy would take cores from the judges: refused, root or not."""
    _, scratch = build(zygote, OWN, tmp_path)
    assert (scratch / "own.txt").read_text() == "none"


PRIVILEGES = """
import ctypes, errno, os, subprocess
def caps(text):
    return [line.split()[1] for line in text.splitlines() if line.startswith("Cap")]
got = caps(open("/proc/self/status").read())
got += caps(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)  # what exec gains
libc = ctypes.CDLL(None, use_errno=True)
timex = (ctypes.c_long * 32)()  # struct timex: modes first, the tick at word 11
libc.adjtimex(timex)  # read
timex[0] = 0x4000  # ADJ_TICK, to the tick it has: a change of nothing, allowed only with CAP_SYS_TIME
got.append("tick:" + ("set" if libc.adjtimex(timex) >= 0 else errno.errorcode[ctypes.get_errno()]))
try:
    open(LOCKED).read()  # mode 000: readable by root only through CAP_DAC_OVERRIDE
    got.append("locked:read")
except OSError as error:
    got.append("locked:" + errno.errorcode[error.errno])
open("privileges.txt", "w").write(" ".join(got))
"""


def test_a_candidate_keeps_no_privilege(zygote, tmp_path):
    """A candidate run as root (a container, a cloud GPU machine) keeps no capability, nor gains one back by
    executing a program: it cannot slew the clock the referee times with or read a file through root's override.
    Run as another user, it had none to lose."""
    locked = tmp_path / "locked"
    locked.write_text("secret")
    locked.chmod(0)
    row, scratch = build(zygote, f"LOCKED = {str(locked)!r}\n" + PRIVILEGES, tmp_path)
    assert row["status"] == "no_build", row
    *caps, tick, read = (scratch / "privileges.txt").read_text().split()
    assert caps == ["0000000000000000"] * 10, caps
    assert (tick, read) == ("tick:EPERM", "locked:EACCES")


HONEST = """
import os, subprocess, threading
done = []
os.sched_setaffinity(0, os.sched_getaffinity(0))
def worker():
    os.sched_setaffinity(threading.get_native_id(), sorted(os.sched_getaffinity(0))[:1])  # as OpenMP pins its own
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
    done.append("thread")
thread = threading.Thread(target=worker)
thread.start()
thread.join()
os.setpriority(os.PRIO_PROCESS, 0, 1)
helper = subprocess.Popen(["sleep", "30"])  # a process it started: its own to pin and re-nice
os.sched_setaffinity(helper.pid, sorted(os.sched_getaffinity(0))[:1])
os.setpriority(os.PRIO_PROCESS, helper.pid, 3)
helper.kill()
done.append("helper")
if subprocess.run(["c++", "--version"], capture_output=True).returncode == 0:
    done.append("compiler")
open("honest.txt", "w").write(" ".join(done))
"""


def test_an_honest_build_pins_its_own_threads_and_runs_compilers(zygote, tmp_path):
    row, scratch = build(zygote, HONEST, tmp_path)
    assert row["status"] == "no_build", row
    assert (scratch / "honest.txt").read_text() == "thread helper compiler"


READS = """
import os
from pathlib import Path
cache = Path(os.environ["TORCH_EXTENSIONS_DIR"]).parent
got = []
for path in [cache / "other" / "main.cpp", Path.cwd().parent / "theirs" / "solution.py"]:
    try:
        got.append(path.read_text())
    except OSError:
        got.append("refused")
try:
    got.append(str(len(os.listdir(cache))))
except OSError:
    got.append("refused")
Path(os.environ["TORCH_EXTENSIONS_DIR"], "mine.txt").write_text("own entry")
got.append(Path(os.environ["TORCH_EXTENSIONS_DIR"], "mine.txt").read_text())
got.append(str(Path(os.environ["CXX"]).is_file()))
open("reads.txt", "w").write("|".join(got))
"""


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock")
def test_a_build_reads_only_its_own_entry(zygote, tmp_path):
    """Another candidate's cache entry and scratch folder are out of reach; its own entry and the shared PCH
    folder (the compiler front) are not."""
    (tmp_path / "cache" / "other").mkdir(parents=True)
    (tmp_path / "cache" / "other" / "main.cpp").write_text("their kernel")
    (tmp_path / "scratch" / "theirs").mkdir(parents=True)
    (tmp_path / "scratch" / "theirs" / "solution.py").write_text("their solution")
    _, scratch = build(zygote, READS, tmp_path)
    assert (scratch / "reads.txt").read_text() == "refused|refused|refused|own entry|True"


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock")
def test_a_contestant_reads_only_its_own_build(tmp_path):
    """A contestant is forked (and confined) before its job is known, able to read the whole cache; as it loads its
    program it adds a layer that leaves it its own folder and its own build only, in which it may still move files
    between folders (as Triton writes its cache: under torch.compile a move refused read as a compile error)."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    folder, mine, other = work / "contestants" / "1", cache / "mine", cache / "other"
    for path in (folder, mine, other):
        path.mkdir(parents=True)
        (path / "file.txt").write_text(path.name)
    (work / "contestants" / "2").mkdir()
    (work / "contestants" / "2" / "solution.py").write_text("theirs")
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            around = sandbox.readable_around([str(work), str(cache)])
            sandbox.confine([str(folder)], [str(cache)], [str(work), str(cache)], devices=[], around=around)
            first = (other / "file.txt").read_text() == "other"  # the first layer reads the whole cache
            sandbox.confine_reads([str(mine)], around, [str(folder)])
            readable = []
            for path in (folder / "file.txt", mine / "file.txt", other / "file.txt", work / "contestants" / "2"):
                try:
                    path.read_text() if path.is_file() or path.suffix else os.listdir(path)
                    readable.append(True)
                except OSError:
                    readable.append(False)
            (folder / "new.txt").write_text("still writes")
            (folder / "cache" / "tmp.1").mkdir(parents=True)  # Triton's and inductor's way to write a cache file
            (folder / "cache" / "tmp.1" / "entry").write_text("moved")
            os.replace(folder / "cache" / "tmp.1" / "entry", folder / "cache" / "entry")
            system = bool(os.listdir("/proc")) and Path(sys.executable).read_bytes()[:4] == b"\x7fELF"
            code = 0 if first and system and readable == [True, True, False, False] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (folder / "new.txt").read_text() == "still writes"
    assert (folder / "cache" / "entry").read_text() == "moved"


def in_a_child(probe) -> dict:
    """Run `probe` in a forked child (what it installs or confines stays there) and return the dict it returns."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(read)
            os.write(write, json.dumps(probe()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        found = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, found
    return found


@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock")
def test_a_confined_process_reaches_only_its_own_and_nvidias_unix_sockets(tmp_path, monkeypatch):
    """Named Unix sockets: a confined process connects to one in its own folder, to one it made, and to NVIDIA's
    services (the MPS daemon's pipe folder); from Landlock ABI 9 (Linux 7.1) not to one elsewhere (an ssh agent,
    munge, a container daemon: their users' rights to spend). Below ABI 9 Landlock cannot refuse that one: asserted
    as reachable, the limit docs/verifier.md names."""
    import socket

    own, outside, mps = (tmp_path / name for name in ("own", "out", "mps"))
    listening = []
    for folder in (own, outside, mps):
        folder.mkdir()
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(folder / "s"))
        server.listen(4)
        listening.append(server)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(mps))
    assert sandbox._handled_fs(9) & sandbox._RESOLVE_UNIX and not sandbox._handled_fs(8) & sandbox._RESOLVE_UNIX

    def probe():
        sandbox.confine([str(own)], [], [], devices=[])
        made = socket.socket(socket.AF_UNIX)
        made.bind(str(own / "made"))
        made.listen(1)
        reached = {}
        for name, path in (("own", own / "s"), ("made", own / "made"), ("mps", mps / "s"), ("out", outside / "s")):
            with socket.socket(socket.AF_UNIX) as client:
                try:
                    client.connect(str(path))
                    reached[name] = "connected"
                except OSError as error:
                    reached[name] = type(error).__name__
        return reached

    reached = in_a_child(probe)
    for server in listening:
        server.close()
    refused = "PermissionError" if sandbox.landlock_abi() >= 9 else "connected"
    assert reached == {"own": "connected", "made": "connected", "mps": "connected", "out": refused}, reached


def test_every_process_of_the_verifier_finds_a_gpus_mps_daemon(tmp_path, monkeypatch):
    """A GPU shared through MPS in a folder of its own (as SLURM's gres/mps sets it): referees, zygotes, builds and
    contestants all get the variables that lead a CUDA client to the daemon, and only the job keeps its secrets."""
    from concur.verify import compiling, runner

    mps = {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipes"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    for key, value in {**mps, "HF_TOKEN": "secret"}.items():
        monkeypatch.setenv(key, value)
    for env in (
        trusted_env(),
        runner.contestant_env(tmp_path / "c", threads=1),
        compiling.builder_env({"device": "cpu"}, tmp_path / "e", tmp_path / "s", threads=1),
    ):
        assert {k: env.get(k) for k in mps} == mps and "HF_TOKEN" not in env
    assert str(tmp_path / "pipes") in sandbox.socket_folders()


def test_the_tree_filter_keeps_a_child_off_the_network(tmp_path):
    """Each sandboxed child's seccomp filter refuses every socket but Unix and netlink ones, whatever its type and
    flags: TCP, UDP and raw, IPv4 and IPv6 (whatever Landlock covers, UDP it does not); and io_uring (whose
    operations open sockets past any filter). Unix sockets, socketpairs, netlink, threads and fork still work, and
    clone with CLONE_PARENT is still refused. Pinning a thread, its own or its process's, says it worked and leaves
    it on the cores it had."""
    import ctypes
    import errno
    import socket
    import threading

    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64") or not SECCOMP:
        pytest.skip("no seccomp filter here")

    def probe():
        assert sandbox.stay_in_tree()
        libc = ctypes.CDLL(None, use_errno=True)
        got = {}

        def attempt(name, make):
            try:
                make().close()
                got[name] = "ok"
            except OSError as error:
                got[name] = errno.errorcode.get(error.errno, str(error.errno))

        attempt("tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        attempt("tcp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC))
        attempt("tcp_nonblocking", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK))
        attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK))
        attempt("icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
        attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))  # AF_VSOCK, to a hypervisor
        attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
        attempt("pair", lambda: socket.socketpair()[0])
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params, zeroed
        ring = libc.syscall(425, 4, ctypes.byref(params))  # io_uring_setup, the same number on both
        got["io_uring"] = "ok" if ring >= 0 else errno.errorcode[ctypes.get_errno()]
        clone = {"x86_64": 56, "aarch64": 220}[machine]
        returned = libc.syscall(clone, 0x8000 | 17, 0, 0, 0, 0)  # CLONE_PARENT | SIGCHLD
        if returned == 0:
            os._exit(0)  # escaped: the child reads "ok" below
        got["clone_parent"] = "ok" if returned > 0 else errno.errorcode[ctypes.get_errno()]
        cores = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cores)})

        def pin():
            os.sched_setaffinity(threading.get_native_id(), {max(cores)})
            got["thread"] = "ok" if os.sched_getaffinity(0) == cores else "pinned"

        thread = threading.Thread(target=pin)
        thread.start()
        thread.join()
        got["cores"] = "kept" if os.sched_getaffinity(0) == cores else "pinned"
        child = os.fork()
        if child == 0:
            os._exit(7)
        got["fork"] = "ok" if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 7 else "no"
        return got

    got = in_a_child(probe)
    assert got == {
        "tcp": "EACCES", "tcp6": "EACCES", "tcp_nonblocking": "EACCES", "udp": "EACCES", "udp6": "EACCES",
        "icmp": "EACCES", "vsock": "EACCES", "unix": "ok", "netlink": "ok", "pair": "ok",
        "io_uring": "EPERM", "clone_parent": "EPERM", "thread": "ok", "cores": "kept", "fork": "ok",
    }, got  # fmt: skip


def test_a_side_cannot_have_its_children_reaped_unseen():
    """A side's filter (keep_children) refuses any action for SIGCHLD, ignoring it or SA_NOCLDWAIT alike, so each
    child it starts ends as a zombie its parent reaps (its CPU time then its parent's) or that the referee reads;
    asking for the action, other signals' handlers, subprocesses, fork and wait still work. A builder may set one."""
    import ctypes
    import errno
    import signal

    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64") or not SECCOMP:
        pytest.skip("no seccomp filter here")

    def probe(keep_children):
        def run():
            assert sandbox.stay_in_tree(keep_children=keep_children)
            got = {}
            for name, action in (("ignore", signal.SIG_IGN), ("default", signal.SIG_DFL), ("handler", lambda *_: None)):
                try:
                    signal.signal(signal.SIGCHLD, action)
                    got[name] = "set"
                except OSError as error:
                    got[name] = errno.errorcode[error.errno]
            libc = ctypes.CDLL(None, use_errno=True)
            old = ctypes.create_string_buffer(152)  # struct sigaction, asked for only
            got["ask"] = "ok" if libc.sigaction(signal.SIGCHLD, None, old) == 0 else "refused"
            signal.signal(signal.SIGUSR1, lambda *_: None)
            got["subprocess"] = subprocess.run(["sh", "-c", "true"]).returncode
            child = os.fork()
            if child == 0:
                os._exit(7)
            got["fork"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
            return got

        return in_a_child(run)

    common = {"ask": "ok", "subprocess": 0, "fork": 7}
    assert probe(True) == {"ignore": "EPERM", "default": "EPERM", "handler": "EPERM", **common}
    assert probe(False) == {"ignore": "set", "default": "set", "handler": "set", **common}


HELPERS = """
import os, signal, sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
if os.fork() == 0:  # a helper in a session of its own, alive when read
    os.setsid()
    burn(0.4)
    sys.stdout.write("")
    time.sleep(30)
    os._exit(0)
child = os.fork()
if child == 0:  # a helper that ends, reaped by its parent
    burn(0.4)
    os._exit(0)
os.waitpid(child, 0)
print("ready", flush=True)
time.sleep(30)
"""


def test_the_cpu_time_of_every_helper_process_counts():
    """A process that does no work itself, and two helpers of 0.4 s each (one detached, one ended and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", HELPERS], stdout=subprocess.PIPE, text=True)
    try:
        start = procs.cpu_seconds(proc.pid)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.6)  # the detached helper has burnt its share by now
        used = procs.cpu_seconds(proc.pid) - start
        own = procs.own_cpu_seconds(proc.pid)
        assert used >= 0.75 and own < 0.5, (used, own)
    finally:
        procs.kill_tree(proc.pid)
        proc.wait()


def test_an_honest_processs_cpu_time_is_its_own():
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(0.3)
        assert abs(procs.cpu_seconds(proc.pid) - procs.own_cpu_seconds(proc.pid)) < 0.02
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, 9)
        proc.wait()


def fake_driver(tmp_path: Path, gpus: dict[str, int]) -> tuple[str, str]:
    """A /proc/driver/nvidia/gpus and a /dev as the NVIDIA driver lays them out: one folder per GPU (its UUID and
    minor number), one node per GPU besides the shared ones."""
    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps", "null"):
        (dev / name).touch()
    for i, (uuid, minor) in enumerate(gpus.items()):
        folder = proc / f"0000:{0x18 + i:02x}:00.0"
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 123\nGPU UUID: \t GPU-{uuid}\nDevice Minor: \t {minor}\n"
        )
        (dev / f"nvidia{minor}").touch()
    return str(proc), str(dev)


def test_a_contestant_may_open_its_own_gpus_node_and_no_other(tmp_path):
    """The honest case: the referee's GPU and every shared node (control, UVM, MIG caps) stay open to it. The
    attack it stops: starting work on another referee's GPU (a helper with another CUDA_VISIBLE_DEVICES)."""
    proc, dev = fake_driver(tmp_path, {"aaaa-1": 0, "bbbb-2": 1, "cccc-3": 3})

    def nodes(uuid: str | None, at: str = proc, where: str = dev) -> list[str]:
        return sorted(Path(n).name for n in sandbox.gpu_nodes(sandbox.gpu_minor(uuid, at) if uuid else None, where))

    shared = ["nvidia-caps", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
    assert nodes("bbbb-2") == sorted([*shared, "nvidia1"])
    assert nodes("GPU-CCCC-3") == sorted([*shared, "nvidia3"])  # as torch or NVML say it
    # a GPU the driver does not list (a MIG instance, no /proc): every node, as without the rule
    assert nodes("MIG-dddd") == sorted([*shared, "nvidia0", "nvidia1", "nvidia3"])
    assert nodes("bbbb-2", at=str(tmp_path / "none")) == nodes(None)
    assert nodes("bbbb-2", where=str(tmp_path / "nodev")) == []
    (Path(dev) / "nvidia3").unlink()  # a container that shows the GPU's node under another name: every node
    assert nodes("cccc-3") == sorted([*shared, "nvidia0", "nvidia1"])


GPU_CONFINED = r"""
import json, os, subprocess, sys
from concur.verify import sandbox
nodes = json.loads(sys.argv[1])
sandbox.confine([sys.argv[2]], [], [], devices=nodes)
import torch
own = float((torch.ones(256, 256, device="cuda") @ torch.ones(256, 256, device="cuda"))[0, 0])
others = [n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit() and "/dev/" + n not in nodes]
opened = []
for name in others:
    try:
        os.close(os.open("/dev/" + name, os.O_RDWR))
        opened.append(name)
    except OSError:
        pass
helper = (
    "import torch\nfor i in range(torch.cuda.device_count()):\n try:\n  torch.ones(1, device=f'cuda:{i}')\n"
    "  print(torch.cuda.get_device_properties(i).uuid)\n except Exception:\n  pass"
)
env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
reached = subprocess.run([sys.executable, "-c", helper], env=env, capture_output=True, text=True).stdout.split()
print(json.dumps({"own": own, "others": others, "opened": opened, "helper_reached": reached}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not LANDLOCK, reason="needs Landlock")
def test_a_confined_process_uses_its_gpu_and_cannot_reach_another(tmp_path):
    """On a node of 2 or more GPUs, a process confined to GPU 1's node, as a contestant is, computes there and can
    neither open GPU 0's node nor start a helper that sees GPU 0."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(trusted_env(), CUDA_VISIBLE_DEVICES="1", PYTHONPATH=os.pathsep.join(sys.path))
    uuid = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).uuid)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    nodes = sandbox.gpu_nodes(sandbox.gpu_minor(uuid))
    env["CUDA_VISIBLE_DEVICES"] = sandbox.cuda_name(uuid)  # the driver numbers only the GPUs it can open
    assert len([n for n in nodes if Path(n).name[6:].isdigit()]) == 1, (uuid, nodes)
    done = subprocess.run(
        [sys.executable, "-c", GPU_CONFINED, json.dumps(nodes), str(tmp_path)],
        env=dict(env, TMPDIR=str(tmp_path), HOME=str(tmp_path)),  # the only folder it may write, as a contestant's
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["own"] == 256.0 and seen["others"], seen
    assert seen["opened"] == [] and set(seen["helper_reached"]) <= {uuid}, seen  # a helper computes on no other GPU

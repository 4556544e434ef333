"""The contestant: one process that runs one model (the task's reference, or a candidate) for the referee.

It is forked by a zygote into a sandbox and speaks only through its socket. It loads the program, builds the model
(seeded, as KernelBench does), then answers commands: `call` runs forward on views of the input arena and keeps the
outputs; `handoff` copies them into the output arena where the referee reads them; `kb_time` times forward the way
KernelBench does (kernelbench mode); `profile` names the kernels (CUDA) or operators (CPU) of one forward; `state`
reports the backend flags and whether harness functions were replaced. For a candidate everything here runs beside
its code, so the referee trusts none of it beyond the bytes it can check and the time it can measure itself.
"""

from __future__ import annotations

import copy
import functools
import os
import secrets
import time
import traceback

from concur.text import describe, one_line
from concur.verify import doorbell, exchange, sandbox
from concur.verify.build import ExtensionLoader, exec_program

L2_THRASH_BYTES = 256 << 20  # KernelBench's cold-cache fill before each timed trial
DETACH_ROUNDS = 25  # CUDA calls after a profile, in any of which CUPTI may detach (let_cupti_detach)
TAKEN_POSITIONS = 64  # elements of each tensor output read as a taken call returns (Contestant.take)
WORDS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64", 16: "complex128"}  # what take reads outputs as, by size


def backend_flags() -> dict:
    import torch

    return {
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
    }


def fix_backend() -> None:
    """The backend state both models run under in hardened mode: full float32 precision, no autotuning."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False


def guarded() -> dict:
    """Functions the harness relies on, captured before the program runs."""
    import torch

    owners = {
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.Tensor.copy_": (torch.Tensor, "copy_"),
        "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
        "torch.profiler.profile": (torch.profiler, "profile"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.Tensor.as_strided": (torch.Tensor, "as_strided"),
        "torch.take": (torch, "take"),
        "torch.randint": (torch, "randint"),
        "os.urandom": (os, "urandom"),
        "secrets.randbits": (secrets, "randbits"),
    }
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in owners.items()}


class Contestant:
    def __init__(self, spec: dict, sandbox: str):
        import torch

        self.spec, self.sandbox = spec, sandbox
        self.device = torch.device(spec["device"])
        self.model = self.model64 = self.loader = None
        self.arenas: dict[str, exchange.Mapped] = {}
        self.pending: list[list] = []
        self.prepared: list = []
        self.unreported: tuple = (0, None)  # what `report` reads after a forward: kernel calls before it, its events
        self.fp64 = False
        # calls taken a batch (`take`; also: a call is done when ready on the caller's stream), positions' generator,
        # the readings
        self.taking, self.taker, self.taken = 0, None, []
        self.received_at = 0.0  # when the command being answered arrived (the system's monotonic clock)
        self.bell: doorbell.Bell | None = None
        self.channel = None  # the socket to the referee (serve): a timed step's notice goes there without a doorbell
        self.last = {doorbell.GO: None, doorbell.HANDOFF: None}  # the last token heard on each ringing slot
        self.early: dict[str, tuple[int, dict]] = {}  # replies to steps run from the doorbell, by command
        self.notify = None  # notify("launched") once forward has returned, notify("ran") once the device is done
        self.guarded = guarded()
        torch.set_num_threads(max(1, int(spec.get("threads", 1))))
        start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.init()
            torch.empty(1, device=self.device)  # the context, made before any program runs
            if spec.get("profiler"):  # CUPTI takes seconds to start: now, while another candidate is judged
                self._profile(lambda: torch.empty(1, device=self.device).add_(1))
        self.startup_s = time.perf_counter() - start

    # ------------------------------------------------------------ commands

    def load(self, msg: dict) -> dict:
        import torch

        if msg.get("fixed_backend"):
            fix_backend()
        self.cast = exchange.dtype_of(msg["cast"]) if msg.get("cast") else None
        self.taking = int(msg.get("taken") or 0)
        if self.taking:  # take's kernels loaded now: loading one later would wait for whatever the device is running
            self.taker = torch.Generator(device=self.device)
            for word in WORDS.values():
                self.take(-1, [torch.zeros(2, dtype=getattr(torch, word), device=self.device)])
            self._sync()
            self.taken = []
        facts = {"ok": False, "has_class": False, "syntax_error": False}
        try:  # before the program runs: the task's own get_init_inputs, where its values cannot cross
            init_values = self._task_init(msg["init_program"], int(msg["seed"])) if msg.get("init_program") else None
        except BaseException as err:
            traceback.print_exc()
            return {**facts, "error": f"get_init_inputs: {describe(err)}"}
        self.own_build(msg.get("build_dir"))
        self.loader = ExtensionLoader(msg.get("build_dir") or os.getcwd(), allow_build=False)
        self.loader.install()
        start = time.perf_counter()
        try:
            source = open(msg["program"]).read()
            namespace = exec_program(source, msg["program"], f"concur_{msg['role']}")
        except SyntaxError as err:
            return {**facts, "syntax_error": True, "error": one_line(f"SyntaxError: {err.msg} (line {err.lineno})")}
        except BaseException as err:
            traceback.print_exc()
            return {**facts, "error": describe(err), "build_error": self.loader.error, "load_calls": self.loader.calls}
        facts.update(load_s=time.perf_counter() - start, load_calls=self.loader.calls)
        cls = namespace.get(msg["class_name"])
        if cls is None:
            return {**facts, "ok": True, "error": f"no {msg['class_name']}"}
        facts["has_class"] = True
        start = time.perf_counter()
        try:
            init = [self._cast(v) for v in (self._values(msg["init"]) if init_values is None else init_values)]
            with torch.no_grad():
                torch.manual_seed(int(msg["seed"]))
                model = cls(*init)
                model = model.to(self.device) if self.cast is None else model.to(device=self.device, dtype=self.cast)
            self._sync()
            if msg.get("compile"):  # a compiled baseline of the reference (concur.verify.baselines), compiled
                # lazily, in its first call, which the referee times as the cost
                model = compiled(model, msg["compile"], self.device.type == "cuda")
        except BaseException as err:
            traceback.print_exc()
            return {**facts, "ok": True, "error": f"{msg['class_name']}(*init): {describe(err)}"}
        self.model = model
        return {
            **facts,
            "ok": True,
            "init_s": time.perf_counter() - start,
            "counted_modules": self.loader.counted_modules,
        }

    def _task_init(self, path: str, seed: int) -> list:
        """The task's init inputs made here as the referee made them: its program's get_init_inputs() under `seed`,
        tensors moved to this side's device (as KernelBench moves them)."""
        import torch

        namespace = exec_program(open(path).read(), path, "concur_task_init")
        torch.manual_seed(seed)
        values = list(namespace["get_init_inputs"]())
        return [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]

    def own_build(self, build_dir: str | None) -> None:
        """Before any program runs here: the build cache and the verifier's work tree readable no more but for this
        process's own folder and its own build (a second Landlock layer: the process was forked, sandboxed, before
        its job was known, and its first layer still reads the whole cache, other candidates' sources included)."""
        box = self.spec.get("sandbox")
        if self.sandbox != "landlock" or not box:
            return
        sandbox.confine_reads([build_dir] if build_dir else [], box["around"], box["write"])

    def arena(self, msg: dict, fds: list[int]) -> dict:
        old = self.arenas.pop(msg["slot"], None)
        if old is not None:
            old.close()
        self.arenas[msg["slot"]] = exchange.Mapped(msg, fds)
        return {"ok": True}

    def bell_page(self, msg: dict, fds: list[int]) -> dict:
        if len(fds) != 1:
            raise ValueError("a doorbell comes with one descriptor")
        self.bell = doorbell.Bell(fds[0])
        return {"ok": True}

    def prepare(self, msg: dict) -> dict:
        """The arguments of the next calls, as views of the input arena, made before the referee's clock starts; a
        timed batch's inputs are written into the arena only after this reply, with the clock running. Then a
        one-element kernel, so the GPU holds this process's context before the referee's writes (the switch back
        after them is part of the round trip subtracted from both sides)."""
        import torch

        self.prepared, self.fp64 = [], bool(msg.get("fp64"))
        for entry in msg["calls"]:
            args = self._values(entry["args"])
            if self.fp64:
                args = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
            elif self.cast is not None:
                args = [self._cast(a) for a in args]
            self.prepared.append(args)
        if self.device.type == "cuda":
            torch.ones(1, device=self.device).add_(1)
            self._sync()
        return {"ok": True}

    def go(self, msg: dict) -> dict:
        """`forward`, then its reply (`report`)."""
        return self.report(self.forward(msg), self.pending)

    def forward(self, msg: dict) -> dict:
        """Run forward on each prepared call, each seeded first where `seeds` says (stochastic tasks), keep the
        outputs, take some calls as they return (`take`), wait for the caller's stream, and ring `done` with the
        command's token: the timed part. Work left on other streams runs on into the hand-off, which waits for the
        whole device and is timed.
        `own_clock`: the batch by this process's own wall clock, and when the command arrived, the work began and
        ended and the answer left (the system's monotonic clock, which the referee reads too): where the referee's
        clock spends its time, for benchmarks only, since a candidate's process could forge it."""
        import torch

        self.unreported = (self.loader.kernel_calls if self.loader else 0, None)
        model = self.model64 if self.fp64 else self.model
        prepared, self.prepared = self.prepared, []
        seeds = msg.get("seeds") or [None] * len(prepared)
        self.taken, bar = [], self.bar(len(prepared))
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.device.type == "cuda" else []
        own, tensor = {"received_at": self.received_at}, torch.Tensor
        try:
            begin = own["begin_at"] = time.perf_counter()
            if events:
                events[0].record()
            with torch.no_grad():
                for args, seed in zip(prepared, seeds):
                    if seed is not None:
                        torch.manual_seed(int(seed))
                    out = model(*args)
                    produced = [out] if type(out) is tensor else leaves(out)  # no call for the usual single tensor
                    self.pending.append(produced)
                    if self.taking and (bar is None or os.urandom(4) < bar):
                        self.take(len(self.pending) - 1, produced)
            if events:
                events[1].record()
            own["launched_at"] = time.perf_counter()
            if self.notify is not None:
                self.notify("launched")
            if self.taking and events:  # done when ready on the caller's stream
                events[1].synchronize()
            else:
                self._sync()
            if self.notify is not None:
                self.notify("ran")
                self.notify = None
            end = own["end_at"] = time.perf_counter()
        finally:
            self._answer(doorbell.DONE, msg, own)
        own["wall_ms"] = 1000.0 * (end - begin)
        self.unreported = (self.unreported[0], events)
        return {"ok": True, "own_clock": own}

    def bar(self, calls: int) -> bytes | None:
        """A batch of `calls` has each call taken where 4 random bytes, drawn from the kernel as it returns, fall under
        this bar: `taking` calls a batch on average (None: every call). One system call, no Python arithmetic: both
        sides pay it on every call."""
        share = (self.taking << 32) // max(1, calls)
        return None if share >> 32 else share.to_bytes(4, "big")

    def take(self, call: int, produced: list) -> None:
        """Read TAKEN_POSITIONS elements of each plain tensor output of call `call` as it returns, on the caller's
        stream, at positions drawn only now, as integer words of the element's size (so a few kernels, loaded at
        `load`, serve every dtype): the referee compares them bit for bit with the same elements handed off after the
        batch (comparisons.unready), so outputs still being written when the call returned fail. Whether a call is
        taken is drawn as it returns, `taking` calls a batch on average, the same for every batch and side."""
        import torch

        self.taker.manual_seed(secrets.randbits(62))
        for j, leaf in enumerate(produced):
            plain = type(leaf) is torch.Tensor and leaf.layout == torch.strided and not leaf.is_nested
            word = WORDS.get(leaf.element_size()) if plain and not leaf.is_quantized else None
            if word and leaf.numel() and leaf.device.type == self.device.type:
                where = torch.randint(leaf.numel(), (TAKEN_POSITIONS,), generator=self.taker, device=leaf.device)
                self.taken.append((call, j, where, torch.take(leaf.view(getattr(torch, word)), where)))

    def report(self, reply: dict, produced: list) -> dict:
        """The rest of go's reply, read once nothing is timed any more: the batch by CUDA events (benchmarks only),
        the extension's calls, every output's dtype and shape (`produced`: the batch's kept outputs), and what `take`
        read: [call, output, positions, the elements' bytes in hex]."""
        if not reply.get("ok"):
            return reply
        calls_before, events = self.unreported
        try:  # work a candidate left running past the sync has no reading, and this never decides a verdict
            if events and events[0].query() and events[1].query():
                reply["own_clock"]["events_ms"] = events[0].elapsed_time(events[1])
        except RuntimeError:
            pass
        # never below 0: a counter the candidate reset (cache_clear) reads as no call, not as calls
        calls = max(0, (self.loader.kernel_calls if self.loader else 0) - calls_before)
        taken = [[c, j, where.tolist(), exchange.hex_bytes(seen)] for c, j, where, seen in self.taken]
        self.taken = []
        outs = [[leaf_meta(leaf) for leaf in call] for call in produced]
        return {**reply, "kernel_calls": calls, "outs": outs, "taken": taken}

    def _answer(self, slot: int, msg: dict, own: dict | None = None) -> None:
        """Ring the answering slot with the command's token (a timed step), noting when; that token is heard, however
        the command came. Without a doorbell, the same token in a short notice on the socket, ahead of the reply
        (Runner.ring): the referee's clock then stops where it would on the doorbell, not once a reply that grows
        with the batch is built and sent."""
        if not isinstance(msg.get("token"), int):
            return
        if self.bell is not None:
            self.last[doorbell.GO if slot == doorbell.DONE else doorbell.HANDOFF] = msg["token"]
            self.bell.ring(slot, msg["token"])
        elif self.channel is not None:
            self.channel.send({"answered": msg["token"], "nonce": msg.get("nonce")})
        else:
            return
        if own is not None:
            own["sent_at"] = time.perf_counter()

    def from_bell(self, spin_s: float, run) -> None:
        """After `prepare`: wait on the doorbell for `go`, run its timed part, then the same for the hand-off, and
        only then write their replies, kept for their commands, which follow on the socket. Gives up after spin_s,
        or once the referee has left the bell for the socket (doorbell.LEFT): the socket then brings them.
        `run(method, msg)` calls a command as the command loop does, errors included."""
        heard = self.bell.await_new(doorbell.GO, self.last[doorbell.GO], spin_s)
        if heard is None:
            return
        self.received_at = time.perf_counter()
        token, seeds = heard
        self.last[doorbell.GO] = token
        forward, produced = run(self.forward, {"token": token, "seeds": seeds}), self.pending
        handed = self.bell.await_new(doorbell.HANDOFF, self.last[doorbell.HANDOFF], spin_s, (doorbell.DONE, token))
        if handed is not None and handed[1] and len(handed[1]) == 2:
            self.received_at = time.perf_counter()
            self.last[doorbell.HANDOFF] = handed[0]
            start, base = handed[1]
            self.early["handoff"] = (handed[0], run(self.handoff, {"token": handed[0], "start": start, "base": base}))
        self.early["go"] = (token, run(self.report, forward, produced))

    def call(self, msg: dict) -> dict:
        """prepare and go in one round trip (the calls nobody times); `profile`: go under the profiler, and the
        names of what it ran in the reply (as `profile` gives them)."""
        self.prepare(msg)
        go = {"seeds": [entry.get("seed") for entry in msg["calls"]]}
        if not msg.get("profile"):
            return self.go(go)
        replies = []
        prof = self._profile(lambda: replies.append(self.go(go)))
        return {**replies[0], "names": self._names(prof)}

    def handoff(self, msg: dict) -> dict:
        """Copy the kept outputs into the output arena at the offsets the referee chose (`specs`), or, rung on the
        doorbell, where its `start` and `base` put them (`landing`); then ring `handed`. `own_clock`: when it was
        heard, the copy began and ended (the system's monotonic clock; benchmarks only)."""
        import torch

        own = {"received_at": self.received_at}
        try:
            target = self.arenas["out"].bytes
            if msg.get("specs") is None:
                views, sources = self.landing(target, int(msg["start"]), int(msg["base"]))
            else:
                views, sources = [], []
                for produced, layout in zip(self.pending, msg["specs"]):
                    for leaf, spec in zip(produced, layout):
                        if spec["t"] == "tensor":
                            views.append(exchange.view(target, spec))
                            sources.append(torch.as_tensor(leaf).reshape(spec["shape"]))
            own["begin_at"] = time.perf_counter()
            if views:  # one call for all copies: less of the timed hand-off is Python, whose pace varies
                torch._foreach_copy_(views, sources)
            self.pending = []
            self._sync()
            own["end_at"] = time.perf_counter()
        finally:
            self._answer(doorbell.HANDED, msg, own)
        return {"ok": True, "own_clock": own}

    def landing(self, target, start: int, base: int) -> tuple[list, list]:
        """Views of the output arena for every kept tensor output, and the outputs to copy there: each output at the
        next aligned offset from `start`, shifted by `base`, as exchange.handoff_layouts lays out their metadata.
        This runs on the referee's clock, where Python's pace varies from process to process: outputs of one dtype
        and shape that fill whole ALIGN blocks (a batch of single-output calls, mostly) lie end to end, so one view
        split in C++ serves all of them; others take a few operations each."""
        import torch

        kept = [leaf for produced in self.pending for leaf in produced if isinstance(leaf, torch.Tensor)]
        first = base + exchange.aligned(start)
        if kept and len({(leaf.dtype, leaf.shape) for leaf in kept}) == 1:
            size, item = kept[0].numel() * kept[0].element_size(), kept[0].element_size()
            if size % exchange.ALIGN == 0 and first % item == 0:
                if first + size * len(kept) > target.numel():
                    raise ValueError("outputs larger than the output arena")
                whole = target[first : first + size * len(kept)].view(kept[0].dtype)
                return list(whole.view(len(kept), *kept[0].shape).unbind(0)), kept
        views, sources, end = [], [], exchange.aligned(start)
        for leaf in kept:
            at, size = base + end, leaf.numel() * leaf.element_size()
            if at + size > target.numel():
                raise ValueError("outputs larger than the output arena")
            views.append(target[at : at + size].view(leaf.dtype))
            sources.append(torch.as_tensor(leaf).reshape(-1))
            end = exchange.aligned(end + size)
        return views, sources

    def double(self, msg: dict) -> dict:
        """A float64 copy of the model, for the precision check (the reference only)."""
        self.model64 = copy.deepcopy(self.model).double()
        return {"ok": True}

    def kb_time(self, msg: dict) -> dict:
        """KernelBench's cuda_event timing: warm-ups, then per trial a device-wide sync, a 256 MB cache fill,
        events around one call on the current stream, a sync; the first `discard` trials are dropped."""
        import torch

        args = [self._cast(a) for a in self._values(msg["args"])] if self.cast else self._values(msg["args"])
        times = []
        with torch.no_grad():
            for _ in range(int(msg["warmup"])):
                self.model(*args)
                self._sync()
            if self.device.type != "cuda":
                for _ in range(int(msg["trials"]) + int(msg["discard"])):
                    start = time.perf_counter()
                    self.model(*args)
                    times.append((time.perf_counter() - start) * 1000.0)
                return {"ok": True, "times_ms": times[int(msg["discard"]) :]}
            torch.cuda.empty_cache()
            for _ in range(int(msg["trials"]) + int(msg["discard"])):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                thrash = torch.empty(L2_THRASH_BYTES // 8, dtype=torch.int64, device=self.device)
                thrash.fill_(42)
                del thrash
                start.record()
                self.model(*args)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        return {"ok": True, "times_ms": times[int(msg["discard"]) :]}

    def profile(self, msg: dict) -> dict:
        """Names of what one forward ran: CUDA kernels on a GPU, ATen operators on the CPU, with counts, and the
        microseconds each took (a kernel's device time; an operator's own CPU time, its callees' left out)."""
        import torch

        args = self._values(msg["args"])
        with torch.no_grad():
            prof = self._profile(lambda: self.model(*args))
        return {"ok": True, "names": self._names(prof), "times": self._times(prof)}

    def _times(self, prof) -> dict[str, float]:
        cuda = self.device.type == "cuda"
        times: dict[str, float] = {}
        for event in self._counted(prof):
            spent = getattr(event, "device_time_total" if cuda else "self_cpu_time_total", None)
            times[event.name] = times.get(event.name, 0.0) + float(spent or 0.0)
        return times

    def _names(self, prof) -> dict[str, int]:
        names: dict[str, int] = {}
        for event in self._counted(prof):
            names[event.name] = names.get(event.name, 0) + 1
        return names

    def _counted(self, prof):
        """The profile's events a forward is judged by: CUDA kernels on a GPU, ATen operators on the CPU."""
        import torch

        cuda = self.device.type == "cuda"
        for event in prof.events():
            on_device = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
            if on_device if cuda else event.name.startswith("aten::"):
                yield event

    def _profile(self, fn):
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            fn()
            self._sync()
        if cuda:
            let_cupti_detach(prof)
        return prof

    def state(self, msg: dict) -> dict:
        changed = sorted(n for n, (owner, attr, f) in self.guarded.items() if getattr(owner, attr, None) is not f)
        return {"ok": True, "backend": backend_flags(), "tampered": changed}

    # ------------------------------------------------------------ helpers

    def _values(self, specs: list[dict]) -> list:
        arena = self.arenas.get("in")
        return exchange.values_of(arena.bytes if arena else None, specs)

    def _cast(self, value):
        """kernelbench mode: floating tensors in float32, as KernelBench's precision setting makes them (integer
        tensors, indices and targets, keep their dtype: cast, they would break the reference itself)."""
        import torch

        if self.cast is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        return value.to(dtype=self.cast)

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()


def let_cupti_detach(prof) -> None:
    """After a CUDA profile, with TEARDOWN_CUPTI=1 (runner.contestant_env): its trace read (where kineto may begin
    to detach CUPTI), then CUDA calls 2 ms apart, from one of whose callbacks it detaches: here, and not in the
    timed batch that follows."""
    import torch

    prof.events()
    for _ in range(DETACH_ROUNDS):
        time.sleep(0.002)
        torch.cuda.synchronize()


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def compiled(model, mode: str, cuda: bool = False):
    """`model` under torch.compile with inductor's `mode`, its compile workers within this process's cores; in a
    mode that replays CUDA graphs, wrapped in GraphCalls."""
    import tempfile

    import torch
    import torch._inductor.config as inductor

    if os.environ.get("TMPDIR"):  # the zygote found its own temporary folder, which this process may not write
        os.makedirs(os.environ["TMPDIR"], exist_ok=True)
        tempfile.tempdir = os.environ["TMPDIR"]
    inductor.compile_threads = max(1, torch.get_num_threads())
    fn = torch.compile(model, mode=None if mode == "default" else mode)
    return GraphCalls(fn) if cuda and mode in CUDA_GRAPH_MODES else fn


class GraphCalls:
    """A compiled model that replays CUDA graphs, called as a timed batch calls a model: each call a new graph step,
    its outputs cloned, since the next replay writes the graph's same output memory and a batch keeps every call's
    outputs until its hand-off. The clone (one more write of the outputs) is part of the baseline's time."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        import torch

        torch.compiler.cudagraph_mark_step_begin()
        out = self.fn(*args)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


def leaves(output) -> list:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in leaves(item)]
    return [output]


def leaf_meta(leaf) -> dict:
    import torch

    if isinstance(leaf, torch.Tensor):
        return {
            "t": "tensor",
            "dtype": str(leaf.dtype),
            "shape": list(leaf.shape),
            "device": leaf.device.type,
            "plain": type(leaf) is torch.Tensor or type(leaf) is torch.nn.Parameter,
        }
    try:
        return exchange.value_spec(leaf)
    except TypeError as err:
        return {"t": "other", "detail": str(err)}


COMMANDS = {"load", "prepare", "go", "call", "handoff", "double", "kb_time", "profile", "state"}


def notify(channel, nonce, what: str) -> None:
    """A notice before a command's reply: `launched` (forward returned) or `ran` (the device is done too)."""
    channel.send({what: True, "nonce": nonce})


def serve(channel, spec: dict, sandbox: str) -> int:
    """The command loop; every command gets one reply, errors included, until `quit` or EOF."""
    from concur.verify import procs

    try:
        contestant = Contestant(spec, sandbox)
        contestant.channel = channel
        channel.send(
            {"ok": True, "ready": True, "sandbox": sandbox, "pid": os.getpid(), "startup_s": contestant.startup_s}
        )
    except BaseException as err:
        channel.send({"ok": False, "error": describe(err)})
        os._exit(1)
    spin_s, op = float(spec.get("spin_s") or 0.0), None

    def run(method, msg: dict, *args) -> dict:
        try:
            return method(msg, *args)
        except BaseException as err:  # SystemExit and CUDA faults included: the referee decides
            traceback.print_exc()
            return {"ok": False, "error": describe(err)}

    while True:
        try:  # the timed commands (`prepare` after the last batch's `handoff`, `go` after `prepare`, `handoff`
            # after `go`) come soon: wait without sleeping
            msg, fds = channel.recv(spin_s=spin_s if op in ("handoff", "prepare", "go") else 0.0)
        except procs.ChannelClosed:
            break
        contestant.received_at = time.perf_counter()
        op = msg.get("op")
        if op == "quit":
            break
        asked = msg.get("launched") is True  # the referee's deadline shrinks while only the device is waited for
        contestant.notify = functools.partial(notify, channel, msg.get("nonce")) if asked else None
        early = contestant.early.pop(op, None)
        if early is not None and early[0] == msg.get("token"):
            reply = early[1]  # run already, rung on the doorbell
        elif op == "arena":
            reply = run(contestant.arena, msg, fds)
        elif op == "bell":
            reply = run(contestant.bell_page, msg, fds)
        elif op in COMMANDS:
            reply = run(getattr(contestant, op), msg)
        else:
            reply = {"ok": False, "error": f"unknown command {op!r}"}
        if isinstance(reply.get("own_clock"), dict):
            reply["own_clock"].setdefault("sent_at", time.perf_counter())
        channel.send({**reply, "nonce": msg.get("nonce")})
        if op == "prepare" and reply.get("ok") and contestant.bell is not None and spin_s > 0:
            contestant.from_bell(spin_s, run)
    os._exit(0)

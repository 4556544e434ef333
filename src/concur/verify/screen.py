"""Static screen of a candidate solution (hardened mode): reject programs that dodge the kernel or the harness.

`screen(source)` parses the program with `ast` and returns findings, each naming a rule:
no_custom_kernel, kernel_unused, try_fallback, subclasses_model, forbidden_module:<name>, process_exit,
process_spawn, dynamic_code, side_stream, monkeypatch.
A program that does not parse gets no findings: the verifier reports it as a compile error, as in kernelbench mode.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

FORBIDDEN_MODULES = (
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "ctypes",
    "gc",
    "inspect",
    "subprocess",
    "pty",
    "signal",
)
FORBIDDEN_ATTRIBUTES = ("sys._getframe",)
EXIT_CALLS = ("os._exit", "sys.exit", "exit", "quit", "os.abort", "os.kill")
SPAWN_CALLS = ("os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp")
SPAWN_PREFIXES = ("os.exec", "os.spawn")
DYNAMIC_CALLS = ("exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile")
# Python-level streams: work on a side stream escapes a timer that records events on the current stream only
STREAM_CALLS = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream")
# modules whose functions the harness relies on: the solution must not replace them
PATCHABLE_ROOTS = ("torch", "time", "builtins", "os", "sys", "numpy", "math", "random")
IMPORT_CALLS = ("__import__", "importlib.import_module")
BUILTIN_OP_NAMESPACES = ("aten", "prims", "prim", "quantized", "_ops")
RULE_ORDER = (
    "no_custom_kernel",
    "kernel_unused",
    "try_fallback",
    "subclasses_model",
    "forbidden_module",
    "process_exit",
    "process_spawn",
    "dynamic_code",
    "side_stream",
    "monkeypatch",
)


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    message: str


def screen(source: str) -> list[Finding]:
    """All findings for `source`, most telling first (see RULE_ORDER)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    aliases = import_aliases(tree)
    findings = forbidden_modules(tree, aliases) + process_exits(tree, aliases) + dynamic_code(tree, aliases)
    findings += process_spawns(tree, aliases) + side_streams(tree, aliases) + monkeypatches(tree, aliases)
    findings += kernel_findings(tree, aliases)
    model_new = find_class(tree, "ModelNew")
    if model_new is not None:
        findings += subclasses_model(tree, model_new) + try_fallbacks(tree, model_new)
    return sorted(findings, key=lambda f: (RULE_ORDER.index(f.rule.split(":")[0]), f.line))


# ---------------------------------------------------------------- names


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> full dotted name it was imported as."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def resolved(node: ast.AST, aliases: dict[str, str]) -> str | None:
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    full = aliases.get(head, head)
    return f"{full}.{rest}" if rest else full


def find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found[-1] if found else None


def calls(tree: ast.AST):
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


# ---------------------------------------------------------------- simple rules


def forbidden_modules(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    findings = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and resolved(node.func, aliases) in IMPORT_CALLS and node.args:
            first = node.args[0]
            names = [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
        elif isinstance(node, ast.Attribute) and resolved(node, aliases) in FORBIDDEN_ATTRIBUTES:
            findings.append(Finding(f"forbidden_module:{resolved(node, aliases)}", node.lineno, "frame access"))
        for name in names:
            for part in name.split("."):
                if part in FORBIDDEN_MODULES:
                    findings.append(Finding(f"forbidden_module:{part}", node.lineno, f"imports {name}"))
    return _unique(findings)


def calls_to(tree: ast.AST, aliases: dict[str, str], names: tuple[str, ...], rule: str) -> list[Finding]:
    """A finding of `rule` for every call of one of `names` (resolved through the program's imports)."""
    return [
        Finding(rule, n.lineno, f"calls {resolved(n.func, aliases)}")
        for n in calls(tree)
        if resolved(n.func, aliases) in names
    ]


def process_exits(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    return calls_to(tree, aliases, EXIT_CALLS, "process_exit")


def dynamic_code(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    return calls_to(tree, aliases, DYNAMIC_CALLS, "dynamic_code")


def process_spawns(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    findings = []
    for node in calls(tree):
        name = resolved(node.func, aliases) or ""
        if name in SPAWN_CALLS or name.startswith(SPAWN_PREFIXES):
            findings.append(Finding("process_spawn", node.lineno, f"calls {name}"))
    return findings


def side_streams(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    return calls_to(tree, aliases, STREAM_CALLS, "side_stream")


def monkeypatches(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    """Assignments to attributes of the harness's modules (`torch.allclose = ...`, `setattr(time, ...)`)."""
    findings = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            targets = [t for t in targets if isinstance(t, ast.Attribute)]
        elif isinstance(node, ast.Call) and resolved(node.func, aliases) in ("setattr", "delattr") and node.args:
            targets = [node.args[0]]
        for target in targets:
            root = (resolved(target, aliases) or "").split(".")[0]
            if root in PATCHABLE_ROOTS:
                findings.append(Finding("monkeypatch", node.lineno, f"replaces part of {root}"))
    return findings


def subclasses_model(tree: ast.Module, model_new: ast.ClassDef) -> list[Finding]:
    """ModelNew derives from Model, directly or through classes defined in the program."""
    bases_of = {n.name: n.bases for n in tree.body if isinstance(n, ast.ClassDef)}
    seen, todo = set(), list(model_new.bases)
    while todo:
        name = dotted(todo.pop()) or ""
        if name == "Model" or name.endswith(".Model"):
            return [Finding("subclasses_model", model_new.lineno, "ModelNew inherits from Model")]
        if name in bases_of and name not in seen and name != "ModelNew":
            seen.add(name)
            todo.extend(bases_of[name])
    return []


def try_fallbacks(tree: ast.Module, model_new: ast.ClassDef) -> list[Finding]:
    """try/except in ModelNew.forward or in the methods and functions it calls."""
    return [
        Finding("try_fallback", node.lineno, f"try/except in {fn.name}")
        for fn in reachable_from_forward(tree, model_new)
        for node in ast.walk(fn)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try)))
    ]


def reachable_from_forward(tree: ast.Module, model_new: ast.ClassDef) -> list[ast.FunctionDef]:
    methods = {f.name: f for f in model_new.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    functions = {f.name: f for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" not in methods:
        return []
    reached, todo = [], [methods["forward"]]
    while todo:
        fn = todo.pop()
        if fn in reached:
            continue
        reached.append(fn)
        for call in calls(fn):
            name = dotted(call.func) or ""
            if name.startswith("self.") and name[5:] in methods:
                todo.append(methods[name[5:]])
            elif name in functions:
                todo.append(functions[name])
    return reached


def _unique(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.rule, f.line) not in seen:
            seen.add((f.rule, f.line))
            out.append(f)
    return out


# ---------------------------------------------------------------- kernel use: does forward's result come from it?


def is_load_call(node: ast.AST, aliases: dict[str, str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = resolved(node.func, aliases) or ""
    if name == "load_inline" or name.endswith(".load_inline"):
        return True
    return name.endswith("cpp_extension.load")


def kernel_findings(tree: ast.Module, aliases: dict[str, str]) -> list[Finding]:
    load_calls = [n for n in calls(tree) if is_load_call(n, aliases)]
    if not load_calls:
        return [Finding("no_custom_kernel", 1, "no load_inline/load call")]
    model_new = find_class(tree, "ModelNew")
    owner, forward = inherited_forward(tree, model_new) if model_new else (None, None)
    if forward is None:
        return []
    analysis = KernelFlow(tree, aliases)
    _, returns_kernel = analysis.function_flow(forward, owner.name)
    if returns_kernel:
        return []
    return [Finding("kernel_unused", forward.lineno, "ModelNew.forward's result does not depend on the extension")]


def inherited_forward(tree: ast.Module, cls: ast.ClassDef) -> tuple[ast.ClassDef | None, ast.FunctionDef | None]:
    """The class and the `forward` that ModelNew runs: its own, or one it inherits from a class of the program
    (a copy of the reference's module under another name must not pass for a kernel)."""
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    todo, seen = [cls], set()
    while todo:
        current = todo.pop(0)
        if current.name in seen:
            continue
        seen.add(current.name)
        forward = next((f for f in current.body if getattr(f, "name", "") == "forward"), None)
        if forward is not None:
            return current, forward
        todo += [classes[dotted(b)] for b in current.bases if dotted(b) in classes]
    return None, None


class KernelFlow:
    """Flow-insensitive taint: which names hold the compiled extension, or values computed by calling into it.

    Names are dotted; `self.x` inside class C is kept as `C::self.x`. A value is kernel-derived when its expression
    mentions a kernel name (so torch ops applied to a kernel result stay derived, while torch ops on the inputs alone
    do not). A function or class whose result is kernel-derived becomes a kernel name itself. A call into the
    extension also taints the local buffers it is handed (out-parameter kernels), but not forward's own parameters.
    """

    def __init__(self, tree: ast.Module, aliases: dict[str, str]):
        self.tree, self.aliases = tree, aliases
        self.kernel: set[str] = set()
        self._solve()

    def _solve(self) -> None:
        functions = [(f, None) for f in self.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        classes = [c for c in self.tree.body if isinstance(c, ast.ClassDef)]
        for cls in classes:
            functions += [(f, cls.name) for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        while True:
            before = len(self.kernel)
            self._module_assignments()
            for fn, cls in functions:
                _, returns_kernel = self.function_flow(fn, cls)
                if returns_kernel:
                    self.kernel.update(self._function_names(fn, cls))
            if len(self.kernel) == before:
                return

    def _function_names(self, fn: ast.FunctionDef, cls: str | None) -> set[str]:
        if cls is None:
            return {fn.name}
        return {f"{cls}::self.{fn.name}", f"{cls}.{fn.name}", cls}

    def _module_assignments(self) -> None:
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(stmt):
                for target, value in _bindings(node):
                    if self.derived(value, set(), None):
                        self.kernel.update(self._names(target, None))

    def derived(self, expr: ast.AST | None, local: set[str], cls: str | None) -> bool:
        if expr is None:
            return False
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and is_load_call(node, self.aliases):
                return True
            if isinstance(node, (ast.Name, ast.Attribute)):
                name = self._canonical(node, cls)
                if name and (name in self.kernel or name in local or _custom_op(name)):
                    return True
        return False

    def _canonical(self, node: ast.AST, cls: str | None) -> str | None:
        name = dotted(node)
        if name and cls and (name == "self" or name.startswith("self.")):
            return f"{cls}::{name}"
        return name

    def _names(self, target: ast.AST, cls: str | None) -> set[str]:
        if isinstance(target, (ast.Tuple, ast.List)):
            return {n for elt in target.elts for n in self._names(elt, cls)}
        if isinstance(target, ast.Starred):
            return self._names(target.value, cls)
        if isinstance(target, ast.Subscript):
            return self._names(target.value, cls)
        name = self._canonical(target, cls)
        return {name} if name else set()

    def function_flow(self, fn: ast.FunctionDef, cls: str | None) -> tuple[set[str], bool]:
        """(kernel-derived local names, whether some return value is kernel-derived); updates self.kernel."""
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
        params |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
        local: set[str] = set()
        while True:
            size = len(local) + len(self.kernel)
            for node in ast.walk(fn):
                for target, value in _bindings(node):
                    if self.derived(value, local, cls):
                        self._bind(self._names(target, cls), local, cls)
                if isinstance(node, ast.Call) and self.derived(node.func, local, cls):
                    handed = [a for a in node.args + [k.value for k in node.keywords] if dotted(a)]
                    names = {n for a in handed for n in self._names(a, cls)} - params
                    self._bind(names, local, cls)
            if len(local) + len(self.kernel) == size:
                break
        returns = [n.value for n in _own_returns(fn)]
        return local, any(self.derived(value, local, cls) for value in returns)

    def _bind(self, names: set[str], local: set[str], cls: str | None) -> None:
        for name in names:
            (self.kernel if "::" in name or "." in name else local).add(name)


def _custom_op(name: str) -> bool:
    """`torch.ops.<ns>.<op>` registered by the extension (not a built-in namespace)."""
    parts = name.split(".")
    return len(parts) >= 3 and parts[:2] == ["torch", "ops"] and parts[2] not in BUILTIN_OP_NAMESPACES


def _bindings(node: ast.AST):
    """(target, value) pairs bound by an assignment-like node."""
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars is not None]
    return []


def _own_returns(fn: ast.FunctionDef):
    """Return statements of `fn` itself, not of functions nested in it."""
    todo = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))

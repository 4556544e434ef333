"""Program analysis: the checks every task program passes and its category (docs/data.md §1), on the AST."""

from __future__ import annotations

import ast

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
# The categorisation rule (docs/data.md): more operator calls than this, a loop in forward, a container or
# program-defined submodule, or this many submodule calls make a `model`; one call is `single_op`; else `fused`.
MAX_FUSED_OPS = 24
MIN_MODEL_LAYER_CALLS = 3
CONTAINER_MODULES = {"Sequential", "ModuleList", "ModuleDict"}


class TaskError(ValueError):
    """A task program or manifest is malformed; the message names the file."""


def error_line(err: BaseException) -> str:
    """An error as one line for a report: a TaskError's own message, else the exception type and first line."""
    text = str(err).strip().splitlines()
    if isinstance(err, TaskError):
        return text[0] if text else "invalid task"
    return (f"{type(err).__name__}: {text[0]}" if text else type(err).__name__)[:300]


def count_ops(code: str) -> int:
    """Operator calls and arithmetic in `Model.forward`: calls, binary and unary operators (not `super()` etc.)."""
    return _count_ops_in(_forward_of(ast.parse(code)))


def categorise(code: str) -> tuple[str, int]:
    """(category, n_ops) of a program, by the rule next to MAX_FUSED_OPS."""
    tree = ast.parse(code)
    model = model_class(tree)
    forward = find_method(tree, model, "forward")
    n_ops = _count_ops_in(forward)
    composite = (
        n_ops > MAX_FUSED_OPS
        or _has_loop(forward)
        or _layer_calls(forward) >= MIN_MODEL_LAYER_CALLS
        or _builds_composite_submodule(tree, model)
    )
    if composite:
        return "model", n_ops
    return ("single_op" if n_ops <= 1 else "fused"), n_ops


def model_class(tree: ast.Module) -> ast.ClassDef | None:
    """The class `Model` names: `class Model`, or the class of a top-level `Model = SomeClass`."""
    target = "Model"
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and any(isinstance(t, ast.Name) and t.id == "Model" for t in node.targets)
        ):
            target = node.value.id
    return classes_of(tree).get(target)


def check_program(code: str, where: str) -> None:
    """A task must parse and define Model, get_inputs and get_init_inputs at module level."""
    tree = parse_program(code, where)
    missing = [name for name in REQUIRED_NAMES if name not in top_level_names(tree)]
    if missing:
        raise TaskError(f"{where}: missing {', '.join(missing)}")


def parse_program(code: str, where: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as err:
        raise TaskError(f"{where}: not valid Python (line {err.lineno}: {err.msg})") from None


def top_level_names(tree: ast.Module) -> set[str]:
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def classes_of(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def find_method(tree: ast.Module, cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    """`cls.name`, looked up through base classes defined in the same program."""
    classes, seen = classes_of(tree), set()
    todo = [cls] if cls is not None else []
    while todo:
        current = todo.pop(0)
        if current.name in seen:
            continue
        seen.add(current.name)
        for item in current.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
        todo += [classes[b.id] for b in current.bases if isinstance(b, ast.Name) and b.id in classes]
    return None


def _count_ops_in(forward: ast.FunctionDef | None) -> int:
    if forward is None:
        return 0
    count = 0
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and not _is_plumbing(node):
            count += 1
        elif isinstance(node, (ast.BinOp, ast.UnaryOp)) and not _is_constant(node):
            count += 1
    return count


def _has_loop(forward: ast.FunctionDef | None) -> bool:
    return forward is not None and any(
        isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(forward)
    )


def _layer_calls(forward: ast.FunctionDef | None) -> int:
    """Calls of submodules held on self (`self.conv(x)`)."""
    if forward is None:
        return 0
    return sum(
        1
        for n in ast.walk(forward)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
    )


def _builds_composite_submodule(tree: ast.Module, model: ast.ClassDef | None) -> bool:
    """__init__ builds a container (Sequential, ModuleList, ModuleDict) or an instance of a class of the program."""
    init = find_method(tree, model, "__init__")
    if init is None:
        return False
    own = set(classes_of(tree)) - {model.name}
    for node in ast.walk(init):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in CONTAINER_MODULES or name in own:
                return True
    return False


def _forward_of(tree: ast.Module) -> ast.FunctionDef | None:
    return find_method(tree, model_class(tree), "forward")


def _is_plumbing(call: ast.Call) -> bool:
    """Calls that move no data: super(), len(), shape/size queries."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in {"super", "len", "range", "int", "float", "size", "dim", "isinstance"}


def _is_constant(node: ast.AST) -> bool:
    return all(isinstance(n, (ast.Constant, ast.operator, ast.unaryop, ast.BinOp, ast.UnaryOp)) for n in ast.walk(node))

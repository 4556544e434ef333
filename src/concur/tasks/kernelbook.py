"""KernelBook programs -> our Model contract: `Model` names the entry point, get_init_inputs() is positional."""

from __future__ import annotations

import ast

from ..text import source_lines
from .programs import TaskError, classes_of, find_method, parse_program, top_level_names


def adapt_kernelbook(code: str, entry_point: str) -> str:
    """KernelBook's program with `Model` naming its entry-point class and a positional get_init_inputs().

    KernelBook's get_init_inputs() returns [args, kwargs]. Keyword arguments are moved to their positional slots of
    the entry point's __init__ when the signature allows it; otherwise an adapter subclass `Model` binds them.
    """
    tree = parse_program(code, "program")
    classes = classes_of(tree)
    if entry_point not in classes:
        raise TaskError(f"entry point class {entry_point!r} is not defined")
    if entry_point != "Model" and "Model" in top_level_names(tree):
        raise TaskError(f"defines its own Model besides the entry point {entry_point!r}")
    init_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_init_inputs"), None)
    if init_fn is None:
        raise TaskError("missing get_init_inputs")
    args, kwargs = _kernelbook_init_return(init_fn)
    positional = _kwargs_as_positional(tree, classes[entry_point], len(args), kwargs)
    if positional is not None:
        new_fn = _init_inputs_source(init_fn, args + positional)
        adapter = "" if entry_point == "Model" else f"\n\nModel = {entry_point}\n"
    elif entry_point == "Model":
        raise TaskError("keyword init arguments of Model have no positional slot and cannot be bound")
    else:
        new_fn = _init_inputs_source(init_fn, args)
        adapter = _binding_adapter(entry_point, kwargs)
    lines = source_lines(code)  # numbered as init_fn's lineno counts them
    start = min([init_fn.lineno] + [d.lineno for d in init_fn.decorator_list]) - 1
    body = "\n".join(lines[:start] + new_fn.splitlines() + lines[init_fn.end_lineno :]).rstrip("\n")
    return body + "\n" + adapter


def _kernelbook_init_return(init_fn: ast.FunctionDef) -> tuple[list[str], dict[str, str]]:
    """Source of each positional argument and keyword value in `return [[args...], {kwargs...}]`."""
    last = init_fn.body[-1]
    value = last.value if isinstance(last, ast.Return) else None
    shaped = (
        isinstance(value, (ast.List, ast.Tuple))
        and len(value.elts) == 2
        and isinstance(value.elts[0], (ast.List, ast.Tuple))
        and not any(isinstance(e, ast.Starred) for e in value.elts[0].elts)
        and isinstance(value.elts[1], ast.Dict)
        and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.elts[1].keys)
    )
    if not shaped:
        raise TaskError("get_init_inputs does not end in `return [[args], {kwargs}]` (the KernelBook format)")
    args = [ast.unparse(e) for e in value.elts[0].elts]
    kwargs = {k.value: ast.unparse(v) for k, v in zip(value.elts[1].keys, value.elts[1].values)}
    return args, kwargs


def _kwargs_as_positional(
    tree: ast.Module, entry: ast.ClassDef, n_args: int, kwargs: dict[str, str]
) -> list[str] | None:
    """Keyword values in positional order after the n_args positional ones, or None when the signature forbids it."""
    if not kwargs:
        return []
    init = find_method(tree, entry, "__init__")
    if init is None:
        return None
    spec = init.args
    params = [p.arg for p in spec.posonlyargs + spec.args][1:]
    first_keyword = max(len(spec.posonlyargs) - 1, 0)
    defaults = dict(zip(params[len(params) - len(spec.defaults) :], spec.defaults)) if spec.defaults else {}
    slot = {name: i for i, name in enumerate(params) if i >= first_keyword}
    if any(name not in slot or slot[name] < n_args for name in kwargs):
        return None
    values = []
    for name in params[n_args : max(slot[k] for k in kwargs) + 1]:
        if name in kwargs:
            values.append(kwargs[name])
        elif name in defaults and _is_literal(defaults[name]):
            values.append(ast.unparse(defaults[name]))
        else:
            return None
    return values


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _init_inputs_source(init_fn: ast.FunctionDef, values: list[str]) -> str:
    """get_init_inputs() with its original statements and a flat positional return list."""
    lines = ["def get_init_inputs():"]
    lines += ["    " + line for stmt in init_fn.body[:-1] for line in ast.unparse(stmt).splitlines()]
    lines.append(f"    return [{', '.join(values)}]")
    return "\n".join(lines)


def _binding_adapter(entry_point: str, kwargs: dict[str, str]) -> str:
    bound = ", ".join(f"{name!r}: {value}" for name, value in kwargs.items())
    return (
        f"\n\nclass Model({entry_point}):\n"
        f'    """{entry_point} with KernelBook\'s keyword init arguments bound (they have no positional slot)."""\n\n'
        "    def __init__(self, *args, **kwargs):\n"
        f"        super().__init__(*args, **{{**{{{bound}}}, **kwargs}})\n"
    )

"""A `reward.func_path` file: where it is, and whether it defines a `reward_func(queries, prompts, labels)`,
decided from its source without running it (the flow's driver checks it before any work starts, without
importing what the file imports, torch included)."""

from __future__ import annotations

import ast
from pathlib import Path

import configs
from configs.errors import RewardError

NAME = "reward_func"


def resolve_func_path(func_path: str | None) -> Path:
    """As given if it exists (absolute or from the cwd), else relative to the configs/ package."""
    if func_path is None:
        raise RewardError("reward.source=func and no reward.func_path: set reward.func_path to a file defining "
                          "reward_func(queries, prompts, labels), or reward.source to rm, prm or remote")
    given = Path(func_path).expanduser()
    if given.is_file():
        return given
    configs_dir = Path(configs.__file__).parent
    if (configs_dir / given).is_file():
        return configs_dir / given
    raise RewardError(f"reward.func_path={func_path}: no such file (looked from {Path.cwd()} and from {configs_dir})")


def check(path: Path) -> None:
    """The file compiles and binds `reward_func`; a plain `def reward_func` takes three positional arguments.
    Only what is certain is an error: a name bound some other way (an import, an assignment) is checked
    when the file is loaded."""
    where = f"reward.func_path={path}"
    tree = parse(path, where)
    bound = bindings(tree)
    if not bound:
        raise RewardError(f"{where}: defines no {NAME}; define {NAME}(queries, prompts, labels) returning one reward "
                          "per query")
    if len(bound) == 1 and bound[0] in tree.body and isinstance(bound[0], ast.FunctionDef) and not bound[0].decorator_list:
        problem = signature_problem(bound[0].args)
        if problem:
            raise RewardError(f"{where}: line {bound[0].lineno}: {NAME}({ast.unparse(bound[0].args)}) {problem}; "
                              f"it is called as {NAME}(queries, prompts, labels)")


def parse(path: Path, where: str) -> ast.Module:
    """The file's syntax tree, or one line naming `where` and what is wrong."""
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:  # IndentationError included
        raise RewardError(f"{where}: line {exc.lineno}: {type(exc).__name__}: {exc.msg}; fix the file") from None
    except (OSError, ValueError) as exc:  # unreadable, or NUL bytes
        raise RewardError(f"{where}: cannot be read as Python ({type(exc).__name__}: {exc})") from None


def bindings(tree: ast.Module) -> list[ast.AST]:
    """Every statement or name that may bind `reward_func` (nested scopes included: a false find only
    defers the check to load time, a miss would reject a good file)."""
    return [node for node in ast.walk(tree) if binds(node)]


def binds(node: ast.AST) -> bool:
    """`node` defines, assigns or imports `reward_func` (a star import may)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == NAME
    if isinstance(node, ast.Name):
        return node.id == NAME and isinstance(node.ctx, ast.Store)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any(alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == NAME for alias in node.names)
    return False


def signature_problem(args: ast.arguments) -> str | None:
    """Why a function with these parameters cannot be called with three positional arguments, or None."""
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    if required > 3:
        return f"needs {required} positional arguments"
    if len(positional) < 3 and args.vararg is None:
        return f"takes {len(positional)} positional argument{'s' if len(positional) != 1 else ''}, not 3"
    keyword_only = [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    if keyword_only:
        return f"needs keyword-only argument{'s' if len(keyword_only) > 1 else ''} {', '.join(keyword_only)}"
    return None

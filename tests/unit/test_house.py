"""The house rules a reader relies on: no function longer than a screen, and a package root that
holds little more than the command."""

from __future__ import annotations

import ast
from pathlib import Path

import cadence

PACKAGE = Path(cadence.__file__).parent
MAX_LINES = 60
EXEMPT = ("bench", "monitor/pictures")  # measurements and drawings read as scripts
ROOT_MODULES = {"__init__.py", "__main__.py", "log.py"}


def _modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not any(path.relative_to(PACKAGE).as_posix().startswith(f"{part}/") for part in EXEMPT)
    )


def long_functions(path: Path, limit: int = MAX_LINES) -> list[str]:
    """`file:line name (n lines)` for each function or method of `path` longer than `limit`
    (decorators count)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE) else path
                found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_walk_sees_the_package_less_the_exempt_folders() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {"cli/__init__.py", "config/run.py", "actors/trainer.py"} <= names
    assert not any(n.startswith(("bench/", "monitor/pictures/")) for n in names)


def test_long_functions_and_methods_are_named(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES - 1))
    source = tmp_path / "sample.py"
    source.write_text(
        f"def short():\n    pass\n\n\nclass A:\n    async def fits(self):\n{body}\n\n"
        f"    @staticmethod\n    def long():\n{body}\n"
    )
    assert long_functions(source) == [f"{source}:{MAX_LINES + 8} long ({MAX_LINES + 1} lines)"]


def test_no_function_is_longer_than_a_screen() -> None:
    found = [entry for path in _modules() for entry in long_functions(path)]
    assert not found, f"functions over {MAX_LINES} lines (split them):\n" + "\n".join(found)


def test_the_package_root_holds_only_the_entry_points_and_logging() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules <= ROOT_MODULES, f"modules in the package root: {sorted(modules - ROOT_MODULES)}"

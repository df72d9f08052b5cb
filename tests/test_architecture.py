"""The import rules of docs/architecture.md, checked on the source: every import statement of ``shared``,
``curator_service``, ``modeler_service`` and the SDK ``pobo`` (module level, inside functions and under
``TYPE_CHECKING`` alike), read with ``ast``, so a rule cannot be broken by an import that only runs later."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "curator_service", "modeler_service", "pobo")

#: The pure mathematics: usable from a notebook, with neither the web stack nor a database.
MATH = ("shared.privacy", "shared.bo", "shared.federated")
#: The library (what a service or a tool may build on) ...
LIBRARY = (
    *MATH,
    "shared.distributed",
    "shared.protocol",
    "shared.servicekit",
    "shared.errors",
    "shared.accounting",
    "shared.files",
    "shared.processes",
)
#: ... the SDK (``import pobo``), a layer above the library: wrappers of its typed clients ...
SDK = ("pobo",)
#: ... and the tools, which may use everything, the SDK and the services included.
TOOLS = ("shared.tools",)
WEB_STACK = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


@cache
def imports_of(module: str) -> frozenset[str]:
    """The dotted names ``module`` imports, relative imports resolved: ``from a import b`` gives ``a.b``, the
    module ``a.b`` if there is one, else the name b of the module ``a``."""
    path = _modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


def _own(name: str) -> str | None:
    """The project module ``name`` is (or is in), if any."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in _modules():
        targets = {_own(name) for name in imports_of(module)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _violations(sources: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return sorted(
        f"{module} imports {name}"
        for module in _modules()
        if _under(module, sources)
        for name in imports_of(module)
        if _under(name, forbidden)
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_mathematics_imports_neither_the_web_stack_nor_the_service_kit() -> None:
    assert _violations(MATH, (*WEB_STACK, "shared.servicekit", "shared.protocol")) == []


def test_the_wire_contract_imports_neither_fastapi_nor_sqlalchemy() -> None:
    assert _violations(["shared.protocol"], WEB_STACK) == []


def test_the_service_kit_does_not_import_the_contract_above_it() -> None:
    assert _violations(["shared.servicekit"], ["shared.protocol"]) == []


def test_the_library_imports_no_tool_and_no_service() -> None:
    assert _violations(LIBRARY, (*SDK, *TOOLS, "curator_service", "modeler_service")) == []


def test_the_sdk_is_a_client_of_the_library_only() -> None:
    """``pobo`` wraps ``shared.protocol``'s clients: no tool, no service, no server-side stack."""
    assert (
        _violations(SDK, (*TOOLS, "curator_service", "modeler_service", "shared.servicekit", *WEB_STACK))
        == []
    )
    assert "pobo.curator" in _modules() and any(
        _under(n, ["shared.protocol"]) for n in imports_of("pobo.curator")
    )


def test_the_services_never_import_each_other() -> None:
    assert _violations(["curator_service"], ["modeler_service"]) == []
    assert _violations(["modeler_service"], ["curator_service"]) == []


def test_the_services_import_no_tool() -> None:
    assert _violations(["curator_service", "modeler_service"], TOOLS) == []


def test_every_shared_module_is_in_one_layer() -> None:
    """``shared`` is two layers: every module of it is in the library or in the tools, none in both."""
    stray = [
        m for m in _modules() if _under(m, ["shared"]) and m != "shared" and not _under(m, (*LIBRARY, *TOOLS))
    ]
    assert stray == []


def test_the_rules_see_every_module() -> None:
    modules = _modules()
    assert "shared.bo.gp" in modules and "modeler_service.runner" in modules
    assert "shared.bo.float32_bounds" in _graph()["shared.bo.gp"]
    # a function-level import counts: the CLI imports the services inside its commands
    assert any(_under(name, ["curator_service"]) for name in imports_of("shared.tools.cli"))

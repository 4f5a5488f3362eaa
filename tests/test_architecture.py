"""The house between the services (issue 21): services meet only through ``shared/`` and HTTP, and no module imports
its way back to itself.

Read from the source (AST), imports inside functions included: a cycle or a cross-service import held apart by a
function-level import is still one.
"""

from __future__ import annotations

import ast
from pathlib import Path

from shared import SERVICES

REPO = Path(__file__).resolve().parents[1]
# The only places that may build or name several services: the CLI's wiring, the all-in-one/embedded app builder
# and the orchestrator's embedded worker wiring.
WIRING = {"services/cli.py", "services/root_app.py", "services/orchestrator/apps.py"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for top in ("services", "shared"):
        for p in (REPO / top).rglob("*.py"):
            name = ".".join(p.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        n = ".".join(parts[:i])
        if n in MODULES:
            return n
    return None


def _imports(mod: str, path: Path) -> set[str]:
    """Every module of services/ and shared/ that ``mod`` imports, anywhere in the file; plus the targets of
    ``importlib.import_module("services.x...")`` with a literal or f-string prefix."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                names = [str(arg.values[0].value).rstrip(".{")]
        for n in names:
            r = _resolve(n)
            if r is not None and r != mod:
                out.add(r)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _service_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if parts[0] == "services" and len(parts) > 2 and parts[1] in SERVICES else None


def test_no_service_imports_another() -> None:
    bad = []
    for mod, deps in GRAPH.items():
        a = _service_of(mod)
        rel = MODULES[mod].relative_to(REPO).as_posix()
        if a is None or rel in WIRING:
            continue
        for d in sorted(deps):
            b = _service_of(d) or (d.split(".")[1] if d.startswith("services.") and d.count(".") == 1
                                   and d.split(".")[1] in SERVICES else None)
            if b is not None and b != a:
                bad.append(f"{rel} imports {d}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_cross_service_import(tmp_path: Path) -> None:
    """The rule above can fail: a function-level import of another service and an importlib call are found."""
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from services.workload.zoo import get_model_config\n"
                 "    import importlib\n    importlib.import_module(f'services.thermal.{x}')\n")
    deps = _imports("services.placement.x", p)
    assert "services.workload.zoo" in deps and "services.thermal" in deps


def test_shared_imports_no_service() -> None:
    bad = [f"{m} imports {d}" for m, deps in GRAPH.items() if m.startswith("shared")
           for d in deps if d.startswith("services")]
    assert not bad, "\n".join(bad)


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles() == []

"""Which way imports point: the contracts of pyproject.toml ([tool.importlinter]) hold, and they bite.

The layers (ARCHITECTURE.md): chaos on top, then deploy, then the gateway, then the mesh; inside
the gateway, the CLI composes, the node runs, the API answers, the core knows no HTTP, and the
subsystems stand apart from each other. An import that points
up fails here, and so does one hidden in a function to dodge a cycle.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import tomllib

import grimp
import pytest
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
KINDS = {"layers": LayersContract, "forbidden": ForbiddenContract, "independence": IndependenceContract}
CONTRACTS = {c["id"]: c for c in SETTINGS["contracts"]}


def make_contract(spec: dict):
    options = {k: v for k, v in spec.items() if k not in ("id", "name", "type")}
    return KINDS[spec["type"]](name=spec["name"], session_options={"root_packages": SETTINGS["root_packages"]},
                               contract_options=options)


def build_graph():
    return grimp.build_graph(*SETTINGS["root_packages"],
                             exclude_type_checking_imports=SETTINGS.get("exclude_type_checking_imports", False))


@pytest.fixture(scope="module")
def graph():
    return build_graph()


@pytest.mark.parametrize("contract_id", sorted(CONTRACTS))
def test_the_contract_is_kept(graph, contract_id):
    check = make_contract(CONTRACTS[contract_id]).check(graph, verbose=False)
    assert check.kept, check.metadata


@pytest.mark.parametrize("contract_id, importer, imported", [
    ("top", "mesh.swim", "gateway.node.server"),
    ("top", "gateway.node.server", "chaos.sim_engine.server"),
    ("top", "deploy.balancer", "chaos.processes"),
    ("gateway", "gateway.serving.generation", "gateway.api.errors"),
    ("gateway", "gateway.workers.registry", "gateway.node.config"),
    ("gateway", "gateway.api.app", "gateway.node.server"),
    ("gateway", "gateway.routing.policies", "gateway.workers.worker"),
    ("gateway", "gateway.serving.generation", "gateway.node.config"),
    ("gateway", "gateway.net.http1.server", "gateway.api.app"),
    ("gateway", "gateway.base.errors", "gateway.observe.metrics"),
    ("gateway", "gateway.observe.metrics", "gateway.net.tls"),
    # The subsystems stand apart: none imports another, nor the serving core.
    ("gateway", "gateway.media.service", "gateway.mcp.sessions"),
    ("gateway", "gateway.history.store", "gateway.auth.key_store"),
    ("gateway", "gateway.routing.policies", "gateway.engine.grpc_engine"),
    ("gateway", "gateway.mcp.sessions", "gateway.serving.admission"),
    ("gateway", "gateway.cluster.state", "gateway.serving.models"),
    ("endpoints", "gateway.api.anthropic", "gateway.api.openai"),
    ("endpoints", "gateway.api.conversations", "gateway.api.responses"),
])
def test_an_upward_import_breaks_the_contract(contract_id, importer, imported):
    graph = build_graph()
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    assert not make_contract(CONTRACTS[contract_id]).check(graph, verbose=False).kept


def function_local_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of imports inside functions that reach another of our top-level packages."""
    top = path.relative_to(ROOT).parts[0]
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            found += [(node.lineno, n) for n in names
                      if n.split(".")[0] in SETTINGS["root_packages"] and n.split(".")[0] != top]
    return found


def test_no_import_of_another_package_hides_in_a_function():
    hidden = {str(p.relative_to(ROOT)): found for package in SETTINGS["root_packages"]
              for p in sorted((ROOT / package).rglob("*.py")) if (found := function_local_imports(p))}
    assert not hidden, f"imports of another package inside functions (move them to the top): {hidden}"


def imports_from_outside(path: pathlib.Path) -> "list[tuple[int, str, str]]":
    """(line, package, name) for each name this module imports from another of our top-level packages."""
    top = path.relative_to(ROOT).parts[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            package = node.module.split(".")[0]
            if package in SETTINGS["root_packages"] and package not in (top, "proto"):
                found += [(node.lineno, package, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0], a.name) for a in node.names
                      if a.name.split(".")[0] in SETTINGS["root_packages"] and a.name.split(".")[0] not in (top, "proto")]
    return found


def test_other_packages_use_only_what_a_package_offers():
    """A package's __init__ lists what the others may use (its __all__); anything else is its own."""
    offered = {name: set(importlib.import_module(name).__all__) for name in ("mesh", "gateway", "deploy")}
    outside = [(str(p.relative_to(ROOT)), line, package, name) for top in SETTINGS["root_packages"]
               for p in sorted((ROOT / top).rglob("*.py")) for line, package, name in imports_from_outside(p)
               if name not in offered.get(package, set())]
    assert not outside, f"imports of what a package does not offer (add it to its __init__, or do not use it): {outside}"

"""The package's structure: no import cycle, lower layers (partition, samplers, datasets) never
importing a trainer or the CLI, argparse only in the CLI glue, a docstring on every public
function and class, and docs/api.md as `python -m gnndist.api` prints it."""
import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from gnndist import api

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"gnndist": "gnndist", "partition": "gnndist.partition", "samplers": "gnndist.samplers",
           "datasets": "gnndist.datasets"}
LOWER = ("gnndist.partition", "gnndist.samplers", "gnndist.datasets")
HIGH = ("gnndist.temporal", "gnndist.static", "gnndist.runtime.launch", "gnndist.cli")


def glue(module: str) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return leaf in ("cli", "train", "demo", "__main__") or leaf.endswith("_cli")


def sources() -> dict[str, Path]:
    """Every module of the project, by dotted name, from the source folders."""
    out = {}
    for folder, pkg in FOLDERS.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            if folder == "gnndist" and rel.parts[0] in FOLDERS:
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts]) if parts else pkg] = f
    return out


def imports(module: str, path: Path, known: set[str]) -> tuple[set[str], bool]:
    """The project modules `module` imports (anywhere in it) and whether it imports argparse."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found, argparse_used = set(), False
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        argparse_used |= "argparse" in names
        found.update(n for n in names if n in known and n != module)
    return found, argparse_used


@pytest.fixture(scope="module")
def graph():
    mods = sources()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def test_no_import_cycle(graph):
    edges = {m: {d for d in deps if not (p_init(m) and d.startswith(m + "."))} for m, (deps, _) in graph.items()}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in edges[m]:
            assert state.get(d) != 1, "import cycle: " + " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m, [m])


def p_init(module: str) -> bool:
    """A package's __init__ re-exporting its own submodules is not a cycle."""
    return module in FOLDERS.values() or module in ("gnndist.temporal", "gnndist.static")


def test_lower_layers_import_no_trainer_or_cli(graph):
    for m, (deps, _) in graph.items():
        if m.startswith(LOWER) and not glue(m):
            bad = [d for d in deps if d.startswith(HIGH)]
            assert not bad, (m, bad)


def test_the_shared_memory_check_imports_no_trainer_package(graph):
    """gnndist.footprint is the check both trainers go through; each model family's estimate
    lives beside its models (temporal/footprint.py, static/footprint.py), so no arrow points back up."""
    deps, _ = graph["gnndist.footprint"]
    assert [d for d in deps if d.startswith(("gnndist.temporal", "gnndist.static"))] == []
    for family in ("temporal", "static"):
        assert "gnndist.footprint" in graph[f"gnndist.{family}.footprint"][0]


def test_a_temporal_rank_starts_without_torch_geometric():
    """What a temporal run imports (the CLI, the launcher, the link trainer) leaves out
    torch_geometric, whose import costs every rank time and memory at its start."""
    code = ("import sys, gnndist, gnndist.cli, gnndist.runtime.launch, gnndist.temporal.fit; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_argparse_only_in_cli_glue(graph):
    assert [m for m, (_, uses) in graph.items() if uses and not glue(m)] == []


def test_every_public_function_and_class_has_a_docstring():
    missing = [f"{m}.{name}" for m in api.modules() for name, obj in api.public(m) if not api.first_line(obj)]
    assert missing == []
    assert [m for m in api.modules() if not api.first_line(importlib.import_module(m))] == []


def test_api_listing_is_current():
    assert (ROOT / "docs" / "api.md").read_text() == api.listing(), "run: python -m gnndist.api > docs/api.md"


def test_the_device_sites_name_functions_the_code_has():
    """tests/sites.py allows collectives on the default group in named functions: each must exist."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from sites import DEVICE_SITES
    for file, functions in DEVICE_SITES.items():
        path = next(p for p in (ROOT / "gnndist" / file, ROOT / file) if p.is_file())
        defined = {n.name for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert functions <= defined, f"{file} has no {sorted(functions - defined)}"

"""How the house is kept: each task's facts are asked of its registry entry (`tasks/`), not by
comparing a task's name, except where a task's own module is."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tasks import TASKS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "server", "router", "rewards", "tasks", "trainer", "deploy", "demo", "bench", "cli")
# ARCHITECTURE.md's layering: what each top-level package may import of ours (the running
# service, `deploy` and below, never imports the demo bootstrap; only the CLI and the benchmarks do)
MAY_IMPORT = {
    "common": set(),
    "rewards": {"common"},
    "tasks": {"common", "rewards"},
    "router": {"common", "rewards", "tasks"},
    "server": {"common", "rewards", "tasks", "router"},
    "trainer": {"common", "rewards", "tasks", "router"},
    "demo": {"common", "rewards", "tasks", "router", "trainer"},
    "deploy": {"common", "rewards", "tasks", "router", "server", "trainer"},
    "bench": {"common", "rewards", "tasks", "router", "server", "trainer", "demo", "deploy"},
    "cli": {"common", "rewards", "tasks", "router", "server", "trainer", "demo", "deploy", "bench"},
}
# where naming a task is the point: the registry, a task's own module, the dispatch that picks it
ALLOWED = {
    "tasks/registry.py": "the task registry",
    "bench/peers.py": "compares its workloads (chat, extraction), not tasks",
}


def task_name_comparisons(source: str) -> list[int]:
    """Lines comparing something with a task's name (`task == "sql"`, `"push" != t`, `t in ("sql", ...)`)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s for s in sides if isinstance(s, ast.Constant) and s.value in TASKS]
        named += [e for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set)) for e in s.elts
                  if isinstance(e, ast.Constant) and e.value in TASKS]
        if named and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_each_form_of_comparison():
    assert task_name_comparisons('if task == "sql":\n    pass\nx = "push" != t\ny = t in ("extraction", "sql")\nz = t == "other"') == [1, 3, 4]


def test_no_task_name_is_compared_outside_the_registry_and_the_tasks_own_modules():
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = str(path.relative_to(REPO))
            own = name.removesuffix(".py").split("/")[-1] in TASKS and name.startswith(("rewards/", "tasks/"))
            if name in ALLOWED or own:
                continue
            lines = task_name_comparisons(path.read_text())
            if lines:
                found[name] = lines
    assert found == {}, f"ask TRAITS or the task's spec instead: {found}"


def test_each_package_docstring_names_every_module_it_holds_and_no_other():
    """A newcomer reads a package's docstring first: it names each of its modules, and only ones
    that exist (a rename leaves no stale name behind)."""
    stale, unnamed = {}, {}
    for package in (*PACKAGES, "server/routes"):
        doc = ast.get_docstring(ast.parse((REPO / package / "__init__.py").read_text())) or ""
        modules = {p.stem for p in (REPO / package).glob("*.py") if p.stem != "__init__"}
        modules |= {p.name for p in (REPO / package).iterdir() if (p / "__init__.py").is_file()}
        named = set(re.findall(r"`([a-z_]+)(?:/|\.[a-z_]+)?`", doc)) - (set(PACKAGES) - modules)  # `x`, `x/`, `x.function`
        if named - modules - {"tucano"}:
            stale[package] = sorted(named - modules - {"tucano"})
        if modules - named:
            unnamed[package] = sorted(modules - named)
    assert stale == {} and unnamed == {}, f"names of no module: {stale}; modules not named: {unnamed}"


def test_collecting_the_unit_tier_imports_no_training_library():
    """Each worker of `-n auto` collects every module: a training library imported at collection
    costs every worker its seconds (tests/unit/conftest.py)."""
    from tests.unit.conftest import heavy_at_collection

    assert not heavy_at_collection, "imported while collecting: " + ", ".join(
        f"{library} (first there after {node})" for library, node in heavy_at_collection.items())


def layering_breaches(package: str, source: str) -> list[str]:
    """The imports of ours in `source` (a module of `package`) that `MAY_IMPORT` does not allow."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        out += [f"{name} (line {node.lineno})" for name in names
                if name.split(".")[0] in MAY_IMPORT and name.split(".")[0] != package and name.split(".")[0] not in MAY_IMPORT[package]]
    return out


def test_the_layering_finder_sees_an_import_upward_at_the_top_and_inside_a_function():
    source = "import common.store\nfrom deploy.serve import serve\ndef f():\n    import bench.learn\n    from router import prompts\n"
    assert layering_breaches("server", source) == ["deploy.serve (line 2)", "bench.learn (line 4)"]
    assert layering_breaches("cli", source) == []


def test_imports_flow_one_way_as_the_architecture_page_draws_them():
    """Each package imports only the packages below it (`MAY_IMPORT`, drawn in ARCHITECTURE.md),
    at the top of a module or inside a function alike."""
    assert set(MAY_IMPORT) == set(PACKAGES)
    found = {str(path.relative_to(REPO)): breaches for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
             if (breaches := layering_breaches(package, path.read_text()))}
    assert found == {}, f"imports against the layering: {found}"

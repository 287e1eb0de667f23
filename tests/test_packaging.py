"""Packaging: every library the package imports is declared, and the benchmarks import
only the package (never the tests)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(files: list[Path]) -> set[str]:
    names = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    return names


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_every_imported_library_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    for reqs in project["optional-dependencies"].values():
        declared |= {_requirement_name(r) for r in reqs}
    dists = packages_distributions()
    missing = set()
    for module in _imported_modules(list((ROOT / "src").rglob("*.py"))):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in ("travorder", "__future__"):
            continue
        names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
        if not names & declared:
            missing.add(f"{module} ({', '.join(sorted(names))})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_benchmarks_do_not_import_the_tests():
    imported = _imported_modules(list((ROOT / "benchmarks").glob("*.py")))
    assert not [m for m in imported if m.split(".")[0] == "tests"]
    assert not any("sys.path" in f.read_text() for f in (ROOT / "benchmarks").glob("*.py"))


def test_ci_runs_the_readme_command_with_every_test_and_ruff():
    readme = (ROOT / "README.md").read_text()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert len(ci) == 1 and f"```bash\n{ci[0]}\n```" in readme
    assert ".venv/bin/ruff check" in ci[0] and ci[0].endswith(".venv/bin/python -m pytest")
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"]
    assert "slow" not in addopts  # a bare `pytest` runs the slow tests too

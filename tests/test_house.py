"""House rules, checked on the source text alone (ast; nothing is imported, no torch):

- no Python file is over MAX_LINES lines;
- the project's modules import each other one way only (no import cycle, lazy imports included);
- the module boundaries of the design notes (DESIGN.md): Ray only in workers/, torch.distributed
  only in roll_lite/strategy/, and the loss package is pure tensor code.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MAX_LINES = 400
LINE_LIMITED_FOLDERS = ("roll_lite", "pipelines", "workers", "benchmarks", "examples", "tests", "scripts")

# source folder -> the package it installs as (pyproject's package-dir)
PACKAGES = {"roll_lite": "roll_lite", "pipelines": "roll_lite.pipelines", "workers": "roll_lite.workers"}


def python_files(folder: str) -> list[Path]:
    return sorted(path for path in (REPO / folder).rglob("*.py") if "__pycache__" not in path.parts)


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of roll_lite, pipelines and workers."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in python_files(folder):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) for every import in the file, at any depth (inside functions too).
    `from a import b` gives `a.b`, whether b is a submodule of a or a name defined in a."""
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 packages
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names += [(base if alias.name == "*" else f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: line of the import}. An import of a.b.c (module or
    name) is an edge to the longest of a.b.c, a.b, a that is a project module; the parent packages'
    __init__ run too, but the reader of the import does not depend on them."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for name, line in imported_names(module, path):
            parts = name.split(".")
            target = next(
                (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None
            )
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a closed path) for every back edge a depth-first search meets."""
    cycles, state, stack = [], {}, []  # state: 1 on the current path, 2 done

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    steps = [f"{a} ({relative(modules[a])}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def test_no_file_is_over_the_line_limit():
    lengths = {
        relative(path): len(path.read_text().splitlines())
        for folder in LINE_LIMITED_FOLDERS
        for path in python_files(folder)
    }
    too_long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines, split them: {too_long}"


def test_no_import_cycle():
    modules = project_modules()
    graph = import_graph(modules)
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (module (file:line of its import) -> ...):\n" + "\n".join(
        describe_cycle(cycle, graph, modules) for cycle in cycles
    )


def imports_matching(prefixes: tuple[str, ...], files: list[Path]) -> list[str]:
    """'file:line imports name' for every import of a module named by `prefixes` (or inside it)."""
    found = []
    modules = {path: name for name, path in project_modules().items()}
    for path in files:
        for name, line in imported_names(modules.get(path, ""), path):
            if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
                found.append(f"{relative(path)}:{line} imports {name}")
    return sorted(set(found))


def library_files_outside(*allowed: str) -> list[Path]:
    """The files of roll_lite/, pipelines/ and workers/ not under the `allowed` folders."""
    return [
        path
        for folder in PACKAGES
        for path in python_files(folder)
        if not any(relative(path).startswith(prefix + "/") for prefix in allowed)
    ]


def test_ray_is_imported_only_by_workers():
    # pipelines/ talks to workers through their methods; today not one module of it imports ray
    found = imports_matching(("ray",), library_files_outside("workers"))
    assert not found, f"Ray outside workers/ (DESIGN.md: workers are the only place that touches Ray): {found}"


def test_torch_distributed_is_imported_only_by_the_strategy():
    found = imports_matching(("torch.distributed",), library_files_outside("roll_lite/strategy"))
    assert not found, f"torch.distributed outside roll_lite/strategy/ (DESIGN.md): {found}"


def test_the_loss_package_is_pure_tensor_code():
    forbidden = ("torch.distributed", "ray", "omegaconf", "roll_lite.config")
    files = python_files("roll_lite/loss")
    assert len(files) > 1, "roll_lite/loss/ is missing: where did the loss package go?"
    found = imports_matching(forbidden, files)
    assert not found, f"roll_lite/loss/ is pure tensor functions (no distributed code, Ray or config objects): {found}"


def test_the_linter_passes():
    """ruff with the rules in pyproject.toml ([tool.ruff.lint]) over the whole tree."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_tree_is_formatted():
    """ruff format (pyproject.toml's line-length) would change nothing: run `ruff format .` before committing."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_type_checker_passes(tmp_path):
    """mypy with the settings in pyproject.toml ([tool.mypy]: a strict tier for the public API, mypy's
    defaults for the rest) over roll_lite/, pipelines/ and workers/: CONTRIBUTING.md's command verbatim,
    its cache in tmp_path (nothing is written in the checkout; a cold run takes a few seconds)."""
    import shlex
    import subprocess
    import sys

    import doc_commands

    (line,) = doc_commands.commands("python", "scripts/typecheck.py")
    command = [sys.executable, *shlex.split(line)[1:], "--cache-dir", str(tmp_path / "mypy_cache")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


TOP_LEVEL_MODULES = {"__init__.py", "cli.py", "errors.py"}  # the CLI and the package's face


def test_roll_lite_keeps_only_packages_the_cli_and_its_face_at_the_top():
    loose = sorted(path.name for path in (REPO / "roll_lite").glob("*.py") if path.name not in TOP_LEVEL_MODULES)
    assert not loose, f"modules at the top of roll_lite/: {loose}; put each in the package that owns its concern"


def package_of(module: str) -> str:
    """roll_lite.model.modeling -> roll_lite.model; roll_lite.cli -> roll_lite.cli (a module of the top)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_package_imports_a_package_that_imports_it_back():
    """The package-level graph (lazy imports included) has no cycle: each package sits above or below
    every other it touches, so a new one has an obvious place."""
    modules = project_modules()
    graph = import_graph(modules)
    packages: dict[str, dict[str, str]] = {}
    for module, edges in graph.items():
        for target, line in edges.items():
            source, destination = package_of(module), package_of(target)
            if source != destination:
                packages.setdefault(source, {}).setdefault(destination, f"{relative(modules[module])}:{line}")
    package_graph = {name: {target: 0 for target in targets} for name, targets in packages.items()}
    for name in {t for targets in packages.values() for t in targets}:
        package_graph.setdefault(name, {})
    cycles = import_cycles(package_graph)
    described = [" -> ".join(f"{a} ({packages[a][b]})" for a, b in zip(cycle, cycle[1:])) for cycle in cycles]
    assert not cycles, "packages that import each other (package (file:line) -> ...):\n" + "\n".join(described)


def test_the_version_is_one_in_pyproject_the_package_and_the_changelog():
    import re

    import tomllib

    import roll_lite

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    released = re.findall(r"^## (\d+\.\d+\.\d+) \(", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert roll_lite.__version__ == version == released[0], (roll_lite.__version__, version, released[:1])


def test_the_pre_commit_hooks_pin_the_ruff_the_suite_runs():
    import re

    import yaml

    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"]
    (ruff,) = [repo for repo in hooks if repo["repo"].endswith("/ruff-pre-commit")]
    pinned = re.search(r'"ruff==([\d.]+)"', (REPO / "pyproject.toml").read_text())[1]
    assert ruff["rev"] == f"v{pinned}" and [hook["id"] for hook in ruff["hooks"]] == ["ruff-check", "ruff-format"]
    (local,) = [repo for repo in hooks if repo["repo"] == "local"]
    assert [hook["entry"] for hook in local["hooks"]] == ["python scripts/typecheck.py"]

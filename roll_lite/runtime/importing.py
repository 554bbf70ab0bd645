"""Resolving 'package.module:attribute' strings (pipeline classes, loss functions) from config/CLI,
and keeping every roll_lite module of a process in one tree.

A user's module is found the way `python -m` finds it, from the current directory, but that
directory is searched *after* the installed packages: a roll_lite checkout there can never shadow
the installed roll_lite. Ray workers get the directory the driver imported the module from
(`import_root`) and add it the same way (`enter_import_root`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def load_object(spec: str, search_cwd: bool = False):
    """Import `spec`; with `search_cwd` (the console scripts) the current directory is searched after
    the installed packages. Errors are one line that names the spec."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"'{spec}' is not of the form package.module:attribute")
    if search_cwd and not {"", os.getcwd()} & set(sys.path):  # `python -m` / `-c` have it first already
        sys.path.append(os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except SyntaxError as error:
        raise ImportError(f"cannot import '{spec}': {error.msg} in {error.filename}, line {error.lineno}") from None
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name != missing and not module_name.startswith(missing + "."):
            # The module was found; something it imports is missing.
            raise ModuleNotFoundError(f"cannot import '{spec}': {error}", name=missing) from error
        raise ModuleNotFoundError(_not_found(spec, missing, search_cwd), name=missing) from None
    if search_cwd:
        _check_not_shadowed(spec, module_name.partition(".")[0])
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise AttributeError(
                f"cannot import '{spec}': {getattr(target, '__name__', target)} has no attribute '{part}'"
            )
        target = getattr(target, part)
    return target


def import_root(spec: str) -> str | None:
    """The sys.path entry from which `spec`'s module was imported here (None for installed
    packages): Ray workers add it so they can import a user's pipeline class too."""
    module_name = spec.partition(":")[0]
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    path = Path(getattr(module, "__file__", "") or "")
    if not path.name:
        return None
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.resolve().parents[depth]
    module_path = root.joinpath(*module_name.split("."))
    laid_out_plainly = module_path.with_suffix(".py").is_file() or (module_path / "__init__.py").is_file()
    # Installed packages (site-packages, or an editable install's package-dir mapping) need nothing.
    return str(root) if laid_out_plainly and "site-packages" not in root.parts else None


def roll_lite_dir() -> str:
    """The directory of the roll_lite package this process imported."""
    import roll_lite

    return str(Path(roll_lite.__file__).resolve().parent)


def enter_import_root(root: str | None, driver_roll_lite: str) -> None:
    """In a Ray worker: refuse to run on another roll_lite tree than the driver's when the driver's
    import root holds one (Ray puts that directory first on a worker's sys.path), then make the root
    importable after the installed packages."""
    if root:
        checkout = str((Path(root) / "roll_lite").resolve())
        here = roll_lite_dir()
        if here != driver_roll_lite and checkout in (here, driver_roll_lite):
            raise ImportError(
                f"this Ray worker imported roll_lite from {here} but the driver runs {driver_roll_lite}, and "
                f"{root} (where the driver imported its pipeline from) holds a roll_lite of its own: two roll_lite "
                "trees would be mixed. Start the run from a directory without a roll_lite checkout, or install "
                f"that checkout (pip install -e {root})"
            )
        while root in sys.path:  # Ray put the driver's directory first
            sys.path.remove(root)
        sys.path.append(root)


def check_one_tree(package_file: str) -> None:
    """Called by roll_lite.pipelines and roll_lite.workers when imported: they must come from the same
    tree as roll_lite (installed: roll_lite/workers; a checkout: workers/ next to roll_lite/)."""
    package = Path(package_file).resolve().parent
    library = Path(roll_lite_dir())
    if library not in (package.parent, package.parent / "roll_lite"):
        raise ImportError(
            f"roll_lite.{package.name} comes from {package} but roll_lite from {library}: two roll_lite trees are "
            "mixed, most likely a checkout in the current directory or on PYTHONPATH shadows the installed one "
            "(`python -m` puts the current directory first). Run from another directory, or install that checkout"
        )


def _not_found(spec: str, missing: str, searched_cwd: bool) -> str:
    top = missing.partition(".")[0]
    if missing != top and top in sys.modules:
        where = _location(sys.modules[top])
        shadowed = _user_package(top)
        if shadowed and shadowed != where:
            return (
                f"cannot import '{spec}': '{top}' is {where}, which hides {shadowed}; "
                "rename your package (installed packages come first)"
            )
        return f"cannot import '{spec}': no module named '{missing}' ('{top}' is {where})"
    where = f"the installed packages, then the current directory {os.getcwd()}" if searched_cwd else "sys.path"
    return (
        f"cannot import '{spec}': no module named '{top}' in {where}; run from the directory that holds "
        f"'{top}', or add that directory to PYTHONPATH"
    )


def _check_not_shadowed(spec: str, top: str) -> None:
    """A user's package in the current directory named like an installed one loses to it: say so.
    A roll_lite checkout there is not an error (it is simply not used), but it is not silent either."""
    checkout = _user_package("roll_lite")
    if checkout and checkout != roll_lite_dir():
        logger.warning(f"note: {checkout} is not used; roll_lite is imported from {roll_lite_dir()}")
    shadowed = _user_package(top)
    where = _location(sys.modules[top])
    if shadowed and shadowed != where and top != "roll_lite":
        raise ImportError(
            f"cannot import '{spec}': '{top}' is {where}, which hides {shadowed}; "
            "rename your package (installed packages come first)"
        )


def _user_package(name: str) -> str | None:
    cwd = Path(os.getcwd())
    for candidate in (cwd / name / "__init__.py", cwd / f"{name}.py"):
        if candidate.is_file():
            return str(candidate.resolve().parent if candidate.name == "__init__.py" else candidate.resolve())
    return None


def _location(module) -> str:
    file = getattr(module, "__file__", None)
    if file:
        path = Path(file).resolve()
        return str(path.parent if path.name == "__init__.py" else path)
    return f"the namespace package at {list(getattr(module, '__path__', []))}"

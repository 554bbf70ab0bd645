"""Resolving 'package.module:attribute' strings (pipeline classes, loss functions) from config/CLI."""

from __future__ import annotations

import importlib


def load_object(spec: str):
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"'{spec}' is not of the form package.module:attribute")
    target = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def import_root(spec: str) -> str | None:
    """The sys.path entry from which `spec`'s module was imported here (None for installed
    packages): Ray workers add it so they can import a user's pipeline class too."""
    import sys
    from pathlib import Path

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

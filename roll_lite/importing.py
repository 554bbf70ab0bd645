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

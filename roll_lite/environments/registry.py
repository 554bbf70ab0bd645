"""Built-in environments by name, and resolving the config's `environment.name`: a registered name or a
`package.module:Class` import path (roll_lite.runtime.importing.load_object)."""

from __future__ import annotations

from roll_lite.environments.contract import check_environment_class

ENVIRONMENTS: dict[str, type] = {}


def register_environment(name: str):
    def register(environment_class: type) -> type:
        if name in ENVIRONMENTS:
            raise ValueError(f"environment '{name}' is already registered")
        ENVIRONMENTS[name] = environment_class
        return environment_class

    return register


def is_import_path(spec: str) -> bool:
    return ":" in spec


def resolve_environment(spec: str, search_cwd: bool = False) -> type:
    """The environment class `spec` names, checked against the contract's class side (TypeError)."""
    if is_import_path(spec):
        from roll_lite.runtime.importing import load_object

        environment_class = load_object(spec, search_cwd=search_cwd)
    elif spec in ENVIRONMENTS:
        environment_class = ENVIRONMENTS[spec]
    else:
        raise KeyError(
            f"unknown environment '{spec}'; registered: {', '.join(sorted(ENVIRONMENTS))}, "
            "or name a package.module:Class"
        )
    check_environment_class(environment_class, spec)
    return environment_class

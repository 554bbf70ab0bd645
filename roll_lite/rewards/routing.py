"""Which reward sources score which rows: every row the reward section's own sources, or with
reward.domains each row its domain's (the row's data.domain_key field)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from typing import Protocol

    class Sources(Protocol):
        """One route's sources: the reward section's own (RewardConfig) or a domain's (DomainRewardConfig),
        roll_lite/config/schema.py, which this package does not import."""

        @property
        def functions(self) -> dict[str, float]: ...
        @property
        def models(self) -> dict[str, float]: ...
        @property
        def judges(self) -> dict[str, float]: ...
        @property
        def code(self) -> float: ...

    class RewardSection(Sources, Protocol):
        """The reward section (RewardConfig)."""

        @property
        def domains(self) -> Mapping[str, Sources]: ...


def routes(reward: RewardSection) -> dict[str | None, Sources]:
    """{domain: its sources (functions, models, judges)}, or {None: the reward section's own} without
    reward.domains. `reward` is a RewardConfig."""
    if reward.domains:
        return cast("dict[str | None, Sources]", dict(reward.domains))  # dict's key type is invariant
    return {None: reward}


def all_sources(reward: RewardSection, kind: str) -> dict[str, float]:
    """Every function, model or judge (`kind`: functions | models | judges) of every route."""
    merged: dict[str, float] = {}
    for sources in routes(reward).values():
        merged.update(getattr(sources, kind))
    return merged


def rows_by_domain(extras: list[dict], domain_key: str, domains: Iterable[str]) -> dict[str, list[int]]:
    """Row indices per domain, in order; a row whose domain is not one of `domains` raises (the data
    check before the run lets none through)."""
    known = set(domains)
    rows: dict[str, list[int]] = {domain: [] for domain in known}
    for index, extra in enumerate(extras):
        domain = extra.get(domain_key)
        if domain not in known:
            raise ValueError(
                f"reward: row {index} has {domain_key}={domain!r}, not one of reward.domains "
                f"({', '.join(sorted(known))})"
            )
        rows[domain].append(index)
    return rows


def uses_code(reward: RewardSection) -> bool:
    """Whether some route scores its rows with the code source (roll_lite/rewards/code.py)."""
    return any(sources.code for sources in routes(reward).values())


def reads_text(reward: RewardSection) -> bool:
    """Whether some reward model or judge scores the rows (they read each row's prompt and token ids)."""
    return bool(all_sources(reward, "models") or all_sources(reward, "judges"))

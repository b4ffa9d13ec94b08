"""Operator overrides: pins of mode, k and/or N for one replica or the whole fleet.

An override is validated against what the controller knows of its targets
(``max_num_seqs``, the KV-safe N of the latest plan) when it is set, may expire
(TTL), and is applied on top of the controller's own thresholds every time they
are published: a replica's own pin wins over the fleet's (``"*"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ebplus.controller.messages import Mode, ThresholdUpdate

#: The key of an override that applies to every replica.
FLEET = "*"


class OverrideError(ValueError):
    """An override that cannot be applied; ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Override:
    """An operator's pin of mode, k and/or N for one replica or the fleet."""

    mode: Mode | None = None
    k: int | None = None
    n: int | None = None
    expires_at: float | None = None
    #: set with ``force``: N may exceed the KV-safe maximum (not max_num_seqs) of replicas that register later too
    force: bool = False

    def apply(self, base: ThresholdUpdate) -> ThresholdUpdate:
        """``base`` with this pin applied.

        A pinned k was valid for the N of its day; if N has since been lowered (the
        planner under KV pressure) k follows it down rather than exceed it.
        """
        mode = self.mode or base.mode
        n = self.n or base.n
        k = min(self.k if self.k is not None else base.k, n)
        active = base.active if mode in (Mode.AUTO, Mode.SHADOW) else mode
        return base.replace(mode=mode, k=k, n=n, active=active)


@dataclass(frozen=True)
class Target:
    """What an override is checked against: one replica's limits."""

    replica_id: str
    max_num_seqs: int
    kv_safe_n: int
    current_n: int


class Overrides:
    """The overrides in force, keyed by replica id or :data:`FLEET`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.items: dict[str, Override] = {}

    def get(self, replica_id: str) -> Override | None:
        """The override that governs ``replica_id`` (its own, else the fleet's)."""
        return self.items.get(replica_id) or self.items.get(FLEET)

    def apply(self, replica_id: str, base: ThresholdUpdate) -> ThresholdUpdate:
        """``base`` with the fleet's override, then the replica's own, applied."""
        for key in (FLEET, replica_id):
            override = self.items.get(key)
            if override is not None:
                base = override.apply(base)
        return base

    def set(
        self,
        key: str,
        targets: Iterable[Target],
        mode: Mode | str | None = None,
        k: int | None = None,
        n: int | None = None,
        ttl_s: float | None = None,
        force: bool = False,
    ) -> Override:
        """Validate against every target and install; raises :class:`OverrideError` naming the field."""
        try:
            mode = None if mode is None else Mode(mode)
        except ValueError:
            raise OverrideError("mode", f"must be one of {[m.value for m in Mode]}, got {mode!r}") from None
        if mode is None and k is None and n is None:
            raise OverrideError("mode", "give at least one of mode, k, n")
        if ttl_s is not None and not (math.isfinite(ttl_s) and ttl_s > 0):
            raise OverrideError("ttl_s", f"must be > 0 seconds, got {ttl_s!r}")
        for t in targets:
            n_eff = n if n is not None else t.current_n
            if n is not None:
                if n < 1:
                    raise OverrideError("n", f"must be >= 1, got {n}")
                if n > t.max_num_seqs:
                    raise OverrideError("n", f"{n} exceeds max_num_seqs {t.max_num_seqs} of replica {t.replica_id}")
                if n > t.kv_safe_n and not force:
                    raise OverrideError(
                        "n",
                        f"{n} exceeds the KV-safe maximum {t.kv_safe_n} of replica {t.replica_id} "
                        "(set force to override)",
                    )
            if k is not None and not 1 <= k <= n_eff:
                raise OverrideError("k", f"must be in [1, n={n_eff}], got {k}")
        expires = None if ttl_s is None else self.clock() + ttl_s
        self.items[key] = Override(mode=mode, k=k, n=n, expires_at=expires, force=force)
        return self.items[key]

    def forced(self, replica_id: str) -> bool:
        """Whether the override that sets ``replica_id``'s N was set with ``force``."""
        for key in (replica_id, FLEET):
            override = self.items.get(key)
            if override is not None and override.n is not None:
                return override.force
        return False

    def clear(self, key: str) -> bool:
        return self.items.pop(key, None) is not None

    def expire(self) -> list[str]:
        """Remove the overrides whose TTL has passed; returns their keys."""
        now = self.clock()
        expired = [key for key, ov in self.items.items() if ov.expires_at is not None and ov.expires_at <= now]
        for key in expired:
            del self.items[key]
        return expired

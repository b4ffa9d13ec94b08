"""Which prior cost model a replica starts from: by its accelerator's name.

A mixed fleet maps GPU-name substrings to shipped profiles
(``replicas.profiles: {"H200": h200, "L40S": l40s}``); anything unmatched
uses ``replicas.profile``. The controller refines the prior from the replica's
own step timings, so the prior only has to be in the right range.
"""

from __future__ import annotations

from ebplus.controller.cost_model import CostModel, resolve_profile
from ebplus.replicas.config import ReplicaSection


def profile_for_device(section: ReplicaSection, device: str) -> str:
    """The profile name or path for a device name (longest matching substring wins)."""
    matches = [key for key in section.profiles if key.lower() in device.lower()]
    if matches:
        return section.profiles[max(matches, key=len)]
    return section.profile


def prior_for_device(section: ReplicaSection, device: str) -> CostModel:
    return resolve_profile(profile_for_device(section, device)).cost_model()

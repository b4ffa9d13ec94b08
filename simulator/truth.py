"""What the simulated engine pays that the controller's cost model does not know.

A profile for the simulator may carry :class:`TrueCosts` under ``truth:``: costs a
real engine pays that a linear per-kind fit cannot express (a phase-switch cost, a
mixed-step curve that is not the fitted quadratic). The simulator prices each step with
:meth:`SimProfile.true_step_seconds`; the controller it drives starts from
:meth:`~ebplus.controller.cost_model.HardwareProfile.cost_model`, which never includes
them. That is how a simulated run tests the control loop against a prior that is wrong
in a known way. The controller's own profile type refuses ``truth:``, so a serving
deployment can never load a scenario by mistake.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ebplus.controller.cost_model import HardwareProfile, resolve_profile


class TrueCosts(BaseModel):
    """Step costs the controller's :class:`CostModel` does not know: the simulator's truth only.

    Each field is a cost that a linear per-kind fit over many steps cannot represent,
    so a profile that sets one makes the controller's prior wrong in a known way.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    phase_switch_s: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Seconds added to a step that changes the engine between the two exclusive step kinds: a "
            "prefill-only step right after a decode-only step, and a decode-only step right after a "
            "prefill-only step (EB's two phase boundaries; MB pays it only where it runs those kinds back to "
            "back, e.g. an empty engine's first decode after its first prefill). Mixed steps never pay it, and "
            "a step after a mixed one does not either: a mixed step already runs both kinds of kernel, and its "
            "cost curve is measured as such. Why at the boundary: the first step of a phase runs with another "
            "batch shape and kernel set than the step before (decode batches from captured graphs, prefill "
            "batches from the prefill kernels), with cold caches and a scheduler pipeline that restarts; a "
            "per-kind linear fit over many steps spreads that over alpha and cannot see it per boundary."
        ),
    )
    mixed_curve: tuple[tuple[float, float], ...] | None = Field(
        default=None,
        description=(
            "Mixed-step per-token cost as a piecewise-linear table of (r, seconds/token) points, r = decode "
            "share of the step's tokens; used by the simulator instead of the quadratic beta_mb. The first "
            "point must be at r = 0 and the last at r = 1, r strictly increasing, every cost finite and >= 0."
        ),
    )

    @field_validator("mixed_curve")
    @classmethod
    def _curve(cls, v: tuple[tuple[float, float], ...] | None) -> tuple[tuple[float, float], ...] | None:
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError("needs at least 2 points (r = 0 and r = 1)")
        for i, (r, cost) in enumerate(v):
            if not (math.isfinite(r) and math.isfinite(cost)):
                raise ValueError(f"point {i}: r and cost must be finite, got ({r}, {cost})")
            if cost < 0:
                raise ValueError(f"point {i}: cost must be >= 0 s/token, got {cost}")
            if i and r <= v[i - 1][0]:
                raise ValueError(f"point {i}: r must increase strictly, got {r} after {v[i - 1][0]}")
        if v[0][0] != 0.0 or v[-1][0] != 1.0:
            raise ValueError(f"must span r = 0 to r = 1, got r = {v[0][0]} to {v[-1][0]}")
        return v

    def mixed_beta(self, r: float) -> float:
        """The curve's per-token cost at decode share ``r`` (linear between points); needs ``mixed_curve``."""
        curve = self.mixed_curve
        assert curve is not None
        i = min(max(bisect.bisect_right(curve, (r, math.inf)), 1), len(curve) - 1)
        (r0, c0), (r1, c1) = curve[i - 1], curve[i]
        t = (r - r0) / (r1 - r0)
        return c0 * (1.0 - t) + c1 * t  # exact at the points


class SimProfile(HardwareProfile):
    """A hardware profile plus the simulator's truth-only costs: the simulator's YAML format."""

    truth: TrueCosts | None = Field(
        default=None,
        description=(
            "Costs only the simulator charges (not in cost_model(), the controller's prior). A profile with "
            "them is a pinned scenario, not a calibration: benchmarks run it only when named."
        ),
    )

    @classmethod
    def of(cls, profile: HardwareProfile) -> SimProfile:
        """``profile`` as a :class:`SimProfile` (itself if it already is one; else with no truth)."""
        return profile if isinstance(profile, SimProfile) else cls(**profile.model_dump())

    def true_step_seconds(
        self, n_prefill_tokens: int, n_decode_tokens: int, kv_tokens: int = 0, *, switched: bool = False
    ) -> float:
        """Wall time of one step as the simulated engine pays it: :meth:`step_seconds` plus :attr:`truth`.

        ``switched``: the step changes between prefill-only and decode-only (see
        :attr:`TrueCosts.phase_switch_s`); the caller knows the previous step.
        """
        truth = self.truth
        if truth is None:
            return self.step_seconds(n_prefill_tokens, n_decode_tokens, kv_tokens)
        if n_prefill_tokens and n_decode_tokens:  # mixed: never a phase switch
            if truth.mixed_curve is None:
                return self.step_seconds(n_prefill_tokens, n_decode_tokens, kv_tokens)
            n = n_prefill_tokens + n_decode_tokens
            return self.alpha_mixed + truth.mixed_beta(n_decode_tokens / n) * n + self.beta_kv * kv_tokens
        seconds = self.step_seconds(n_prefill_tokens, n_decode_tokens, kv_tokens)
        return seconds + truth.phase_switch_s if switched and seconds > 0 else seconds


def resolve_sim_profile(name_or_path: str | Path) -> SimProfile:
    """A shipped profile by name or any profile file (``truth:`` allowed) by path, for the simulator."""
    return resolve_profile(name_or_path, SimProfile)

"""The per-step cost model of an engine on one GPU type, and its YAML profile form.

A step's wall time is modelled as ``alpha + beta * n_tokens`` with separate
coefficients for prefill-only, decode-only and mixed steps (DESIGN §2). The
simulator charges steps with :meth:`CostModel.step_seconds`; the controller feeds
the same parameters to the closed forms in :mod:`controller.theory`; ``ebplus
profile`` writes them, fitted on a real engine, as a :class:`HardwareProfile`.

A profile may also carry :class:`TrueCosts`: costs a real engine pays that the
linear model cannot express. Only the simulator reads them
(:meth:`HardwareProfile.true_step_seconds`); :meth:`HardwareProfile.cost_model`,
what the controller starts from and the closed forms evaluate, leaves them out.
That is how a simulated run tests the control loop against a prior that is wrong.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ebplus.controller import theory


class CostModel(BaseModel):
    """Step-time coefficients (seconds, seconds per token)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha_p: float = Field(gt=0, description="Fixed cost of a prefill-only step (s).")
    beta_p: float = Field(ge=0, description="Cost per prefill token (s/token).")
    alpha_d: float = Field(gt=0, description="Fixed cost of a decode-only step (s).")
    beta_d: float = Field(ge=0, description="Cost per decoded sequence in a decode-only step (s).")
    beta_mb: tuple[float, float, float] = Field(
        description="Mixed-step per-token cost a + b*r + c*r^2 at decode share r = n_decode/n_tokens."
    )
    alpha_mb: float | None = Field(
        default=None, gt=0, description="Fixed cost of a mixed step (s); defaults to alpha_p."
    )
    beta_kv: float = Field(
        default=0.0,
        ge=0,
        description="Optional attention cost per resident KV token in any step with decodes (s/token).",
    )

    @field_validator("beta_mb")
    @classmethod
    def _beta_mb_non_negative(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        for i, x in enumerate(v):
            if not math.isfinite(x):
                raise ValueError(f"beta_mb[{i}] must be finite")
        r, lowest = theory.beta_mb_min(v)
        if lowest < 0:
            raise ValueError(f"beta_mb(r) must be >= 0 on [0, 1]; {lowest:.3g} at r={r:.3g}")
        return v

    def folded(self, context_tokens: float) -> CostModel:
        """This model with the KV-read term folded into the per-sequence decode costs.

        The closed forms know no KV term: a decode step costs ``alpha_d + beta_d*n``.
        With ``beta_kv`` the cost is ``alpha_d + (beta_d + beta_kv*c)*n`` for a mean
        context ``c`` per decoding request, and a mixed step's per-token cost gains
        ``r*beta_kv*c`` (its decode share reads KV too). Exact in the mean when ``c``
        is the time-averaged context, ``mu_L + E[O^2]/(2 mu_O)``.
        """
        if self.beta_kv == 0.0:
            return self
        extra = self.beta_kv * max(0.0, float(context_tokens))
        a, b, c = self.beta_mb
        return self.model_copy(update={"beta_d": self.beta_d + extra, "beta_mb": (a, b + extra, c), "beta_kv": 0.0})

    @property
    def alpha_mixed(self) -> float:
        return self.alpha_p if self.alpha_mb is None else self.alpha_mb

    def beta_mixed(self, r: float) -> float:
        """Per-token cost of a mixed step with decode share ``r``."""
        return theory.beta_mb(r, self.beta_mb)

    def step_seconds(self, n_prefill_tokens: int, n_decode_tokens: int, kv_tokens: int = 0) -> float:
        """Wall time of one engine step.

        ``n_decode_tokens`` equals the number of decoding sequences (one token
        each); ``kv_tokens`` is the KV cache read by those decodes, charged only
        when ``beta_kv`` is set.
        """
        n = n_prefill_tokens + n_decode_tokens
        if n <= 0:
            return 0.0
        if n_decode_tokens == 0:
            return self.alpha_p + self.beta_p * n_prefill_tokens
        kv = self.beta_kv * kv_tokens
        if n_prefill_tokens == 0:
            return self.alpha_d + self.beta_d * n_decode_tokens + kv
        return self.alpha_mixed + self.beta_mixed(n_decode_tokens / n) * n + kv

    def steps_seconds(self, prefill: np.ndarray, decode: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """:meth:`step_seconds` of many steps at once (arrays of equal length; empty steps cost 0)."""
        prefill, decode, kv = (np.asarray(x, dtype=float) for x in (prefill, decode, kv))
        n = prefill + decode
        r = np.divide(decode, n, out=np.zeros_like(n), where=n > 0)
        a, b, c = self.beta_mb
        mixed = self.alpha_mixed + (a + b * r + c * r * r) * n + self.beta_kv * kv
        only_decode = self.alpha_d + self.beta_d * decode + self.beta_kv * kv
        only_prefill = self.alpha_p + self.beta_p * prefill
        out = np.where(decode == 0, only_prefill, np.where(prefill == 0, only_decode, mixed))
        return np.where(n > 0, out, 0.0)


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


class HardwareProfile(CostModel):
    """A cost model plus the KV capacity of one GPU type: the simulator's YAML format."""

    name: str = Field(min_length=1, description="Profile name, e.g. 'h200'.")
    kv_capacity_tokens: int = Field(gt=0, description="KV cache capacity in tokens.")
    description: str = Field(default="", description="Where the numbers come from.")
    truth: TrueCosts | None = Field(
        default=None,
        description=(
            "Costs only the simulator charges (not in cost_model(), the controller's prior). A profile with "
            "them is a pinned scenario, not a calibration: bench-sim runs it only when named."
        ),
    )

    def cost_model(self) -> CostModel:
        """The controller's model of this GPU: everything but :attr:`truth`."""
        return CostModel(**self.model_dump(include=set(CostModel.model_fields)))

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


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and field."""


def yaml_line(text: str, loc: Sequence[str | int]) -> int | None:
    """1-based line of the YAML node at ``loc`` (mapping keys and list indices).

    For a key that is missing, the line of the deepest ancestor found, so an
    error about a missing field points at the mapping that lacks it.
    """
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            key = next(k for k, v in node.value if v is match)
            line, node = key.start_mark.line + 1, match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def validation_message(path: Path, text: str, exc: ValidationError) -> str:
    """``FILE:LINE: field 'a.b': message`` for the first error of a pydantic validation."""
    first = exc.errors()[0]
    loc = tuple(first["loc"])
    field = ".".join(str(p) for p in loc) or "<root>"
    line = yaml_line(text, loc)
    where = f"{path}:{line}" if line is not None else str(path)
    return f"{where}: field '{field}': {first['msg']}"


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate a profile YAML file; errors name the file, line and field."""
    path = Path(path)
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ProfileError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a mapping of keys to values")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(validation_message(path, text, exc)) from None


# Shipped profiles: controller/profiles/<name>.yaml (package data of ``ebplus.controller``).
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def calibrated_profile_names() -> list[str]:
    """The shipped profiles but the pinned scenarios (those with truth-only costs, see :class:`TrueCosts`).

    A pinned profile (``h200-switch``...) is a test of the control loop, not a GPU
    calibration: benchmarks run it when named, so adding one never changes their default
    tables and figures.
    """
    return [name for name in profile_names() if resolve_profile(name).truth is None]


def resolve_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load a shipped profile by name (``h200``) or any profile file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_profile(path)
    shipped = PROFILE_DIR / f"{name_or_path}.yaml"
    if not shipped.exists():
        raise ProfileError(f"unknown profile {str(name_or_path)!r}: not a file, and not one of {profile_names()}")
    return load_profile(shipped)


def dump_profile(profile: HardwareProfile, path: str | Path) -> None:
    """Write a profile YAML file (keys in the documented order)."""
    data = profile.model_dump(mode="json", exclude_none=True)  # json mode: tuples become YAML lists
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

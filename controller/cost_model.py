"""The per-step cost model of an engine on one GPU type, and its YAML profile form.

A step's wall time is modelled as ``alpha + beta * n_tokens`` with separate
coefficients for prefill-only, decode-only and mixed steps (DESIGN §2). The
simulator charges steps with :meth:`CostModel.step_seconds`; the controller feeds
the same parameters to the closed forms in :mod:`controller.theory`; ``ebplus
profile`` writes them, fitted on a real engine, as a :class:`HardwareProfile`.

Costs a real engine pays that the linear model cannot express are the simulator's
alone (:mod:`ebplus.simulator.truth`, a subclass of :class:`HardwareProfile`): the
controller never sees them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

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

    def cost_model(self) -> CostModel:
        """The cost coefficients alone (a profile's without its name and capacity): what travels on the wire."""
        if type(self) is CostModel:
            return self
        return CostModel(**self.model_dump(include=set(CostModel.model_fields)))

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
        return price_steps(prefill, decode, kv, self.coefficients())

    def coefficients(self) -> tuple[float, ...]:
        """The coefficients :func:`price_steps` takes, in its order."""
        return (self.alpha_p, self.beta_p, self.alpha_d, self.beta_d, self.alpha_mixed, *self.beta_mb, self.beta_kv)


def price_steps(
    prefill: np.ndarray, decode: np.ndarray, kv: np.ndarray, coefficients: Sequence[float | np.ndarray]
) -> np.ndarray:
    """:meth:`CostModel.step_seconds` of many steps, each priced with :meth:`CostModel.coefficients`: one model's
    (floats), or one a step (arrays as long as the steps: many replicas' steps in one vector pass, each step's
    price the float its own model's pass gives, every operation being elementwise)."""
    prefill, decode, kv = (np.asarray(x, dtype=float) for x in (prefill, decode, kv))
    alpha_p, beta_p, alpha_d, beta_d, alpha_mixed, a, b, c, beta_kv = coefficients
    n = prefill + decode
    computed = n > 0
    r = np.divide(decode, n, out=np.zeros_like(n), where=computed)
    kv_read = beta_kv * kv  # the same term in mixed and decode-only steps: computed once
    mixed = alpha_mixed + (a + b * r + c * r * r) * n + kv_read
    only_decode = alpha_d + beta_d * decode + kv_read
    only_prefill = alpha_p + beta_p * prefill
    out = np.where(decode == 0, only_prefill, np.where(prefill == 0, only_decode, mixed))
    return np.where(computed, out, 0.0)


class HardwareProfile(CostModel):
    """A cost model plus the KV capacity of one GPU type: the simulator's YAML format."""

    name: str = Field(min_length=1, description="Profile name, e.g. 'h200'.")
    kv_capacity_tokens: int = Field(gt=0, description="KV cache capacity in tokens.")
    description: str = Field(default="", description="Where the numbers come from.")


#: A profile model: :class:`HardwareProfile` or a subclass of it (the simulator's).
P = TypeVar("P", bound=HardwareProfile)


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


def load_profile(path: str | Path, model: type[P] = HardwareProfile) -> P:  # type: ignore[assignment]
    """Read and validate a profile YAML file as ``model``; errors name the file, line and field."""
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
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(validation_message(path, text, exc)) from None


# Shipped profiles: controller/profiles/<name>.yaml (package data of ``ebplus.controller``).
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def resolve_profile(name_or_path: str | Path, model: type[P] = HardwareProfile) -> P:  # type: ignore[assignment]
    """Load a shipped profile by name (``h200``) or any profile file by path, as ``model``."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_profile(path, model)
    shipped = PROFILE_DIR / f"{name_or_path}.yaml"
    if not shipped.exists():
        raise ProfileError(f"unknown profile {str(name_or_path)!r}: not a file, and not one of {profile_names()}")
    return load_profile(shipped, model)


def dump_profile(profile: HardwareProfile, path: str | Path) -> None:
    """Write a profile YAML file (keys in the documented order)."""
    data = profile.model_dump(mode="json", exclude_none=True)  # json mode: tuples become YAML lists
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

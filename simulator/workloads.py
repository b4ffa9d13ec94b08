"""What the simulator serves: length distributions, arrival processes, schedules, traces.

A *workload* says how long prompts and outputs are (samplers from
:mod:`bench.distributions`); a *schedule* is a list of phases, each a workload with
its own arrival process and request count, which is how the non-stationary
benchmarks (distribution shift, concurrency shift) are written. A single workload
is a one-phase schedule. Arrival processes, per phase:

* ``concurrency: c`` - closed loop, ``c`` requests in flight (``vllm bench serve
  --max-concurrency``);
* ``rate: r`` - open loop, Poisson arrivals at ``r`` requests/s; with
  ``burst_cv: cv`` a bursty Gamma renewal process of the same mean rate whose
  gaps have coefficient of variation ``cv`` (:mod:`ebplus.simulator.arrivals`);
* neither - saturated: the phase's requests are all queued when it starts.

Per-request caps: a workload's ``max_tokens`` (a fixed number, or a length
distribution sampled per request) cuts outputs longer than the cap; such a
request ends at its cap with finish=length, like ``vllm bench serve --ignore-eos``.

Named workloads live in ``simulator/workloads/NAME.yaml``; a trace is a JSONL file,
one request per line: ``{"input_len": int, "output_len": int}`` with an optional
``arrival_s`` (replayed open loop when every line has it) and an optional
``max_tokens`` (the request's cap; ``output_len`` is then where it would stop on
its own, and is cut to the cap). Errors name the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ebplus.controller.cost_model import validation_message
from ebplus.simulator import distributions as dist
from ebplus.simulator.arrivals import open_loop_offsets

WORKLOAD_DIR = Path(__file__).with_name("workloads")
DEFAULT_REQUESTS = 2000


class LengthSpec(BaseModel):
    """A length distribution (tokens), one of :mod:`bench.distributions`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dist: Literal["fixed", "uniform", "geometric", "lognormal", "linear_hazard"] = Field(
        description="fixed, uniform (mean +- jitter), geometric (constant hazard), lognormal, linear_hazard."
    )
    mean: float | None = Field(None, ge=1, description="Mean length (all but linear_hazard).")
    jitter: float = Field(0.5, ge=0, lt=1, description="uniform: half-width as a fraction of the mean.")
    sigma: float = Field(1.0, gt=0, description="lognormal: standard deviation of the log length.")
    p0: float | None = Field(None, gt=0, le=1, description="linear_hazard: hazard at t = 0.")
    eta: float = Field(0.0, ge=0, description="linear_hazard: hazard slope per token.")

    @model_validator(mode="after")
    def _parameters(self) -> LengthSpec:
        if self.dist == "linear_hazard":
            if self.p0 is None:
                raise ValueError("linear_hazard needs p0")
        elif self.mean is None:
            raise ValueError(f"{self.dist} needs mean")
        return self

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` lengths (int64, >= 1)."""
        match self.dist:
            case "fixed":
                return dist.fixed(rng, self.mean, size)
            case "uniform":
                return dist.uniform_jitter(rng, self.mean, self.jitter, size)
            case "geometric":
                return dist.geometric(rng, self.mean, size)
            case "lognormal":
                return dist.lognormal(rng, self.mean, self.sigma, size)
            case _:
                return dist.linear_hazard(rng, self.p0, self.eta, size)

    def expected_mean(self) -> float:
        """The distribution's mean (the value the closed forms are evaluated at)."""
        if self.dist == "linear_hazard":
            return dist.mean_linear_hazard(self.p0, self.eta)
        if self.dist == "fixed":
            return float(max(1, round(self.mean)))
        if self.dist == "uniform":
            lo = max(1, round(self.mean * (1 - self.jitter)))
            hi = max(lo, round(self.mean * (1 + self.jitter)))
            return (lo + hi) / 2.0
        return float(self.mean)


class Workload(BaseModel):
    """Input and output length distributions; outputs above ``max_tokens`` are cut (finish=length)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("", description="Short name used in tables.")
    description: str = Field("", description="Where the workload comes from.")
    input: LengthSpec = Field(description="Prompt lengths.")
    output: LengthSpec = Field(description="Natural output lengths (where EOS would come).")
    max_tokens: int | LengthSpec | None = Field(
        None,
        description=(
            "Per-request cap on output tokens: a number (every request), or a length distribution sampled per "
            "request (e.g. {dist: uniform, mean: 128, jitter: 0.5}). A longer natural output is cut at the cap "
            "and ends with finish=length."
        ),
    )

    @field_validator("max_tokens")
    @classmethod
    def _cap_at_least_one(cls, v: int | LengthSpec | None) -> int | LengthSpec | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be >= 1, got {v}")
        return v

    def sample_caps(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Each request's cap (int64; 0: none). A fixed cap draws nothing from ``rng``."""
        cap = self.max_tokens
        if cap is None:
            return np.zeros(size, np.int64)
        if isinstance(cap, int):
            return np.full(size, cap, np.int64)
        return cap.sample(rng, size)


class PhaseSpec(BaseModel):
    """One phase of a schedule: a workload and how its requests arrive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str | Workload = Field(description="A named workload or an inline one.")
    requests: int | None = Field(None, ge=1, description="Requests in this phase (default: --requests).")
    concurrency: int | None = Field(None, ge=1, description="Closed loop: requests in flight.")
    rate: float | None = Field(None, gt=0, description="Open loop: arrivals per second (Poisson by default).")
    burst_cv: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Open loop: bursty arrivals, a Gamma renewal process at the phase's rate whose gaps have this "
            "coefficient of variation (> 1: bursts; 1: Poisson)."
        ),
    )

    @model_validator(mode="after")
    def _one_arrival_process(self) -> PhaseSpec:
        if self.concurrency is not None and self.rate is not None:
            raise ValueError("give concurrency or rate, not both")
        if self.burst_cv is not None and self.concurrency is not None:
            raise ValueError("burst_cv shapes open-loop arrivals; it does not apply with concurrency")
        return self


class Schedule(BaseModel):
    """A sequence of phases; ``drain`` waits for a phase's requests to finish before the next starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("", description="Short name used in tables.")
    description: str = Field("", description="What the schedule reproduces.")
    drain: bool = Field(
        False,
        description=(
            "true: each phase is a separate benchmark run (the next starts when the previous one's requests "
            "have finished); false: one run whose traffic changes (the next starts once the previous is issued)."
        ),
    )
    phases: list[PhaseSpec] = Field(min_length=1, description="The phases, in order.")


# ---------------------------------------------------------------------------
# the resolved form the simulator consumes


@dataclass(frozen=True)
class ArrivalPhase:
    """Requests ``[start, stop)`` and their arrival process (both ``None``: saturated).

    ``offsets_s`` (open loop) are arrival times relative to the phase start.
    """

    start: int
    stop: int
    concurrency: int | None
    offsets_s: np.ndarray | None
    label: str


@dataclass(frozen=True)
class Requests:
    """Every request of a run, in issue order, and the phases that issue them."""

    input_len: np.ndarray  # int64
    output_len: np.ndarray  # int64, after the max_tokens cap
    capped: np.ndarray  # bool: max_tokens stopped it (reported as finish=length)
    phases: tuple[ArrivalPhase, ...]
    drain: bool
    name: str
    max_tokens: np.ndarray | None = None  # int64 per request, 0: no cap (None: no request has one)

    def caps(self) -> np.ndarray:
        """Each request's cap (0: none)."""
        return np.zeros(len(self), np.int64) if self.max_tokens is None else self.max_tokens

    def __len__(self) -> int:
        return int(self.input_len.size)


@dataclass(frozen=True)
class Trace:
    """Lengths (and optional arrival times and caps) read from a JSONL file."""

    input_len: np.ndarray
    output_len: np.ndarray  # natural lengths (before the caps)
    arrival_s: np.ndarray | None
    path: Path
    max_tokens: np.ndarray | None = None  # int64, 0 on lines without a cap (None: no line has one)


def build_requests(
    source: Workload | Schedule | Trace,
    *,
    seed: int,
    requests: int | None = None,
    concurrency: int | None = None,
    rate: float | None = None,
    burst_cv: float | None = None,
    scale: float = 1.0,
) -> Requests:
    """Sample every request of a run, deterministically for a given seed.

    ``requests``, ``concurrency``, ``rate`` and ``burst_cv`` fill in what a phase
    leaves out (the command line's flags); with neither concurrency nor rate a
    phase is saturated. ``scale`` multiplies every phase's request count (quick
    runs of a schedule). A trace's own ``arrival_s`` are replayed unless a
    concurrency or rate is given.
    """
    if concurrency is not None and rate is not None:
        raise ValueError("give --concurrency or --rate, not both")
    if burst_cv is not None and rate is None:
        raise ValueError("--burst-cv needs --rate (it shapes open-loop arrivals)")
    rng = np.random.default_rng(seed)
    if isinstance(source, Trace):
        return _trace_requests(source, rng, requests, concurrency, rate, burst_cv)
    schedule = (
        source if isinstance(source, Schedule) else Schedule(name=source.name, phases=[PhaseSpec(workload=source)])
    )
    inputs, outputs, caps, phases = [], [], [], []
    start = 0
    for i, ph in enumerate(schedule.phases):
        wl = resolve_workload(ph.workload) if isinstance(ph.workload, str) else ph.workload
        size = max(1, round((ph.requests or requests or DEFAULT_REQUESTS) * scale))
        inputs.append(wl.input.sample(rng, size))
        outputs.append(wl.output.sample(rng, size))
        caps.append(wl.sample_caps(rng, size))
        c = ph.concurrency if ph.concurrency is not None else (None if ph.rate is not None else concurrency)
        r = ph.rate if ph.rate is not None else (None if ph.concurrency is not None else rate)
        cv = ph.burst_cv if ph.rate is not None else (burst_cv if r is not None else None)
        offsets = None if r is None else open_loop_offsets(rng, r, size, cv)
        how = f"c={c}" if c is not None else (f"rate={r:g}/s" if r is not None else "saturated")
        how += f" cv={cv:g}" if cv is not None else ""
        phases.append(ArrivalPhase(start, start + size, c, offsets, f"{i + 1}: {wl.name or 'workload'} {how}"))
        start += size
    return _capped(np.concatenate(inputs), np.concatenate(outputs), np.concatenate(caps), tuple(phases),
                   schedule.drain, schedule.name)  # fmt: skip


def _capped(
    inp: np.ndarray, natural: np.ndarray, caps: np.ndarray, phases: tuple[ArrivalPhase, ...], drain: bool, name: str
) -> Requests:
    """Requests whose natural outputs are cut at their caps (0: none); cut ones finish with length."""
    capped = (caps > 0) & (natural > caps)
    return Requests(
        input_len=inp,
        output_len=np.where(capped, caps, natural),
        capped=capped,
        phases=phases,
        drain=drain,
        name=name,
        max_tokens=caps if caps.any() else None,
    )


def _trace_requests(
    trace: Trace,
    rng: np.random.Generator,
    requests: int | None,
    concurrency: int | None,
    rate: float | None,
    burst_cv: float | None,
) -> Requests:
    n = trace.input_len.size if requests is None else min(requests, trace.input_len.size)
    offsets = None
    if rate is not None:
        offsets = open_loop_offsets(rng, rate, n, burst_cv)
    elif concurrency is None and trace.arrival_s is not None:
        offsets = trace.arrival_s[:n] - float(trace.arrival_s[:n].min())
    how = f"c={concurrency}" if concurrency is not None else ("open loop" if offsets is not None else "saturated")
    caps = np.zeros(n, np.int64) if trace.max_tokens is None else trace.max_tokens[:n].copy()
    phases = (ArrivalPhase(0, n, concurrency, offsets, f"1: {trace.path.name} {how}"),)
    return _capped(trace.input_len[:n].copy(), trace.output_len[:n].copy(), caps, phases, False, trace.path.stem)


# ---------------------------------------------------------------------------
# files


def _load_yaml(path: Path) -> tuple[str, object]:
    try:
        text = path.read_text()
        return text, yaml.safe_load(text)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None


def load_workload_file(path: str | Path) -> Workload | Schedule:
    """A workload (keys ``input``/``output``) or a schedule (key ``phases``) from YAML."""
    path = Path(path)
    text, data = _load_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a workload file must be a mapping (input/output, or phases)")
    model = Schedule if "phases" in data else Workload
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(validation_message(path, text, exc)) from None


def resolve_workload(name: str) -> Workload:
    """A named workload (``simulator/workloads/NAME.yaml``) that is a single workload, not a schedule."""
    loaded = load_source(name)
    if not isinstance(loaded, Workload):
        raise ValueError(f"workload {name!r} is a schedule or trace; a phase needs a single workload")
    return loaded


def named_workloads() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


def load_source(spec: str | Path) -> Workload | Schedule | Trace:
    """Resolve ``--workload``: a shipped name, a YAML file, or a JSONL trace."""
    path = Path(spec)
    if path.suffix in (".jsonl", ".json") or (path.exists() and path.suffix not in (".yaml", ".yml")):
        return load_trace(path)
    if path.suffix in (".yaml", ".yml"):
        return load_workload_file(path)
    shipped = WORKLOAD_DIR / f"{spec}.yaml"
    if shipped.exists():
        return load_workload_file(shipped)
    raise ValueError(f"unknown workload {str(spec)!r}: not a file, and not one of {', '.join(named_workloads())}")


def load_trace(path: str | Path) -> Trace:
    """Read a JSONL trace; ``arrival_s`` must be on every line or on none."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read trace: {exc.strerror}") from None
    inputs: list[int] = []
    outputs: list[int] = []
    caps: list[int] = []
    arrivals: list[float] = []
    first_arrival_line: int | None = None
    without_arrival_line: int | None = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected an object with input_len and output_len")
        unknown = set(rec) - {"input_len", "output_len", "arrival_s", "max_tokens"}
        if unknown:
            raise ValueError(f"{where}: field '{sorted(unknown)[0]}': unknown field")
        for name, into in (("input_len", inputs), ("output_len", outputs), ("max_tokens", caps)):
            if name not in rec:
                if name == "max_tokens":  # optional: no cap
                    caps.append(0)
                    continue
                raise ValueError(f"{where}: field '{name}': missing")
            value = rec[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: field '{name}': must be an integer >= 1, got {value!r}")
            into.append(value)
        if "arrival_s" in rec:
            value = rec["arrival_s"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
                raise ValueError(f"{where}: field 'arrival_s': must be a number >= 0, got {value!r}")
            if arrivals and value < arrivals[-1]:
                raise ValueError(
                    f"{where}: field 'arrival_s': {value} is earlier than the line before; sort by arrival"
                )
            arrivals.append(float(value))
            first_arrival_line = first_arrival_line or lineno
        else:
            without_arrival_line = without_arrival_line or lineno
        if first_arrival_line is not None and without_arrival_line is not None:
            bad = max(first_arrival_line, without_arrival_line)
            raise ValueError(f"{path}:{bad}: field 'arrival_s': given on some lines but not others")
    if not inputs:
        raise ValueError(f"{path}: no requests found")
    arr = np.asarray(arrivals, dtype=float) if arrivals else None
    cap = np.asarray(caps, np.int64) if any(caps) else None
    return Trace(np.asarray(inputs, np.int64), np.asarray(outputs, np.int64), arr, path, cap)

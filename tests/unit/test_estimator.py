"""The workload estimator and its departure model, against known answers.

Each case below names what the estimator before the admission-ordered window got
wrong on it (a window of completions, capped requests censored, a least-squares
fit of the empirical hazard): the fixed-length benchmark collapsed to p0 ~ 4e-5,
a cold start's first update underestimated mu_O by half.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebplus.controller import departures, theory
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.messages import CompletionRecord, FinishReason, RunningRequest
from ebplus.simulator import distributions as dist


def estimator(size: int, **kwargs) -> WorkloadEstimator:
    return WorkloadEstimator(window=size, update_every=1, min_samples=1, clock=lambda: 42.0, **kwargs)


def finished(outputs: np.ndarray, caps: np.ndarray | int | None = None, inputs: int = 100) -> list[CompletionRecord]:
    """Natural lengths ``outputs`` cut at ``caps`` (each request's ``max_tokens``), as the scheduler reports them."""
    caps = np.zeros(len(outputs), np.int64) if caps is None else np.broadcast_to(caps, outputs.shape)
    out = []
    for seq, (o, c) in enumerate(zip(outputs.tolist(), caps.tolist(), strict=True)):
        capped = 0 < c <= o
        finish = FinishReason.LENGTH if capped else FinishReason.STOP
        out.append(CompletionRecord(inputs, c if capped else o, finish, seq=seq, max_tokens=c))
    return out


def fit_records(records: list[CompletionRecord], running: list[RunningRequest] = (), total: int | None = None):
    est = estimator(len(records) + len(running))
    for rec in records:
        est.observe(rec, "r")
    if running:
        est.observe_running("r", running, len(running) if total is None else total)
    return est.update()


# --------------------------------------------------------------------------- the family's own data


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_hazard_recovered_within_10_percent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    outputs = dist.linear_hazard(rng, 0.004, 1e-5, 20_000)
    e = fit_records(finished(outputs))
    assert e.model == "linear-hazard" and e.method == "mle: linear hazard"
    assert (e.p0, e.eta) == (e.natural_p0, e.natural_eta)
    assert e.p0 == pytest.approx(0.004, rel=0.10)
    assert e.eta == pytest.approx(1e-5, rel=0.10)
    assert e.mu_o == pytest.approx(dist.mean_linear_hazard(0.004, 1e-5), rel=0.03)
    assert e.gof < 0.02 and e.timestamp == 42.0


@pytest.mark.parametrize("mean", [64, 256, 1024])
def test_geometric_gives_no_slope(mean: int) -> None:
    rng = np.random.default_rng(7)
    e = fit_records(finished(dist.geometric(rng, mean, 20_000)))
    assert e.p0 == pytest.approx(1 / mean, rel=0.05)
    assert e.eta == 0.0  # the likelihood-ratio test finds no slope in constant-hazard data
    assert e.mu_o == pytest.approx(mean, rel=0.05)


@pytest.mark.parametrize("seed", [0, 1])
def test_censored_linear_hazard_recovered(seed: int) -> None:
    """A third capped and a fifth still running: natural stops, caps and running ages each counted as what they are."""
    rng = np.random.default_rng(seed)
    natural = dist.linear_hazard(rng, 0.004, 1e-5, 20_000)
    caps = np.where(rng.random(natural.size) < 0.5, 300, 0)  # half the requests capped at 300
    # the last 4,000 were admitted at ages independent of their lengths: those still going are running
    ages = rng.integers(1, 300, 4000)
    left = np.where(caps[16_000:] > 0, np.minimum(natural[16_000:], caps[16_000:]), natural[16_000:])
    records = finished(natural[:16_000], caps[:16_000])
    records += [rec for rec, a in zip(finished(natural[16_000:], caps[16_000:]), ages, strict=True) if rec.output_len <= a]
    running = [RunningRequest(seq=16_000 + i, input_len=100, age=int(a), max_tokens=int(c))
               for i, (a, c, d) in enumerate(zip(ages, caps[16_000:], left, strict=True)) if d > a]  # fmt: skip
    assert len(running) > 800
    e = fit_records(records, running)
    assert e.natural_p0 == pytest.approx(0.004, rel=0.10)
    assert e.natural_eta == pytest.approx(1e-5, rel=0.15)
    truth = np.mean(np.where(caps > 0, np.minimum(natural, caps), natural))  # the realized mean
    assert e.mu_o == pytest.approx(truth, rel=0.03)
    assert e.capped_share == pytest.approx(np.mean((caps > 0) & (natural >= caps)), abs=0.02)


# --------------------------------------------------------------------------- outside the family


@pytest.mark.parametrize("cap", [128, 1000])
def test_point_mass_at_a_common_cap(cap: int) -> None:
    """``vllm bench serve --ignore-eos``: every request ends at its max_tokens (the old fit gave p0 ~ 4e-5)."""
    natural = np.full(500, 10**6)
    e = fit_records(finished(natural, cap))
    assert e.model == "caps" and e.capped_share == pytest.approx(1.0)
    assert e.mu_o == pytest.approx(cap) and e.mu_o_sq == pytest.approx(cap * cap)
    assert e.p0 == pytest.approx(1 / cap) and e.eta == 0.0  # theta from the rate at which slots free
    theta = theory.theta_star(e.p0, e.eta, 1e-3, 9e-3, 5e-5, 1024).theta_star
    assert theta > theory.THETA_MIN


def test_caps_uniform_around_a_mean() -> None:
    rng = np.random.default_rng(4)
    caps = rng.integers(64, 193, 600)
    e = fit_records(finished(np.full(600, 10**6), caps))
    assert e.mu_o == pytest.approx(caps.mean(), rel=0.01)
    assert e.mean_age == pytest.approx(np.mean(caps**2.0) / (2 * caps.mean()), rel=0.02)


def test_a_mixture_the_family_cannot_describe() -> None:
    """Short and long requests (a decreasing hazard): the fit says it does not fit; the mean stays right."""
    rng = np.random.default_rng(5)
    outputs = np.concatenate([dist.geometric(rng, 20, 5000), dist.geometric(rng, 2000, 5000)])
    e = fit_records(finished(outputs))
    assert e.gof > 0.1
    assert e.method.endswith("theta from the departure rate 1/mu_o") and e.eta == 0.0
    assert e.mu_o == pytest.approx(outputs.mean(), rel=0.05)


def test_natural_stops_mixed_with_caps() -> None:
    rng = np.random.default_rng(6)
    natural = dist.geometric(rng, 200, 4000)
    e = fit_records(finished(natural, 256))
    assert e.mu_o == pytest.approx(np.minimum(natural, 256).mean(), rel=0.03)
    assert e.natural_p0 == pytest.approx(1 / 200, rel=0.1)
    assert 0.2 < e.capped_share < 0.35


# --------------------------------------------------------------------------- a cold start


def cohort(natural: np.ndarray, age: int) -> tuple[list[CompletionRecord], list[RunningRequest]]:
    """Requests admitted together, seen at ``age``: the short ones finished, the rest running."""
    done = [CompletionRecord(100, int(o), FinishReason.STOP, seq=i) for i, o in enumerate(natural) if o <= age]
    running = [RunningRequest(seq=i, input_len=100, age=age) for i, o in enumerate(natural) if o > age]
    return done, running


@pytest.mark.parametrize(("lengths", "age"), [("uniform", 140), ("uniform", 180), ("geometric", 12)])
def test_a_first_cohort_is_not_read_as_short(lengths: str, age: int) -> None:
    """The first completions are the cohort's shortest; the running rest says the mean is longer."""
    rng = np.random.default_rng(8)
    natural = rng.integers(128, 385, 2000) if lengths == "uniform" else dist.geometric(rng, 256, 2000)
    done, running = cohort(natural, age)
    assert len(done) >= 30
    truth = natural.mean()
    completions_only = np.mean([r.output_len for r in done])
    assert completions_only < 0.75 * truth  # what a window of completions saw
    e = fit_records(done, running)
    assert e.mu_o >= 0.85 * truth  # the safe side for N*: not more than 15% short


# --------------------------------------------------------------------------- the property


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p0=st.floats(1e-3, 1e-2), eta_scale=st.sampled_from([0.0, 0.3, 1.0]))
def test_running_requests_bring_the_estimate_closer_to_the_truth(p0: float, eta_scale: float) -> None:
    """Requests admitted at a steady rate, seen at one moment: with the running ones counted (censored
    at their ages) the mean is estimated no worse, on average over fixed seeds, than from the finished
    ones alone - which are biased short."""
    eta = eta_scale * p0 * p0
    truth = dist.mean_linear_hazard(p0, eta)
    errors = {"with": [], "without": []}
    for seed in range(4):
        rng = np.random.default_rng(seed)
        n = 1500
        natural = dist.linear_hazard(rng, p0, eta, n)
        admitted = np.sort(rng.uniform(0, 3 * truth, n)).astype(int)  # token-time of admission, in seq order
        now = int(3 * truth)
        ages = now - admitted
        done = [CompletionRecord(100, int(o), FinishReason.STOP, seq=i) for i, (o, a) in enumerate(zip(natural, ages, strict=True)) if o <= a]
        running = [RunningRequest(seq=i, input_len=100, age=int(a)) for i, (o, a) in enumerate(zip(natural, ages, strict=True)) if o > a]
        errors["with"].append(abs(fit_records(done, running).mu_o / truth - 1))
        errors["without"].append(abs(fit_records(done).mu_o / truth - 1))
    assert np.mean(errors["with"]) <= np.mean(errors["without"]) + 0.02
    assert np.mean(errors["with"]) < 0.15


# --------------------------------------------------------------------------- the window


def test_update_cadence_and_min_samples_count_finished_requests() -> None:
    est = WorkloadEstimator(window=500, update_every=100, min_samples=30)
    est.observe_running("r", [RunningRequest(seq=1000 + i, input_len=10, age=5) for i in range(200)], 200)
    for i in range(29):
        est.observe(CompletionRecord(10, 10 + i, FinishReason.STOP, seq=i), "r")
    assert not est.update_due() and est.update() is None  # running requests alone make no estimate
    for i in range(71):
        est.observe(CompletionRecord(10, 10 + i, FinishReason.STOP, seq=29 + i), "r")
    assert est.update_due() and est.update() is not None and est.first is est.estimate
    assert not est.update_due() and est.pending == 0


def test_the_window_is_per_replica_admissions() -> None:
    """A replica's window starts at its window-th newest completion; running requests admitted since are in."""
    est = WorkloadEstimator(window=100, update_every=1, min_samples=1)
    for rid in ("a", "b"):
        for i in range(300):
            est.observe(CompletionRecord(10, 50, FinishReason.STOP, seq=i), rid)
    est.observe_running("a", [RunningRequest(seq=300 + i, input_len=10, age=7) for i in range(20)], 40)
    sample = est.sample()
    assert sample.size == 50 + 50 + 20  # 100 split over two replicas, plus a's running sample
    assert sample.weights[sample.running].sum() == pytest.approx(40)  # each stands for two running requests
    est.forget("a")  # its last share leaves the split, its running requests censored where they were
    sample = est.sample()
    assert sample.size == 50 + 20 + 100 and sample.weights[sample.running].sum() == pytest.approx(40)
    for i in range(50):  # each new completion displaces one of a's: then a's window is gone
        est.observe(CompletionRecord(10, 50, FinishReason.STOP, seq=300 + i), "b")
    assert est.sample().size == 100 and est.state().departed == []


def test_observe_rejects_impossible_lengths() -> None:
    est = WorkloadEstimator()
    with pytest.raises(ValueError, match="output_len"):
        est.observe(CompletionRecord(10, 0, FinishReason.STOP))
    with pytest.raises(ValueError, match="input_len"):
        est.observe(CompletionRecord(0, 3, FinishReason.STOP))


def test_state_round_trip() -> None:
    est = estimator(50)
    for rec in finished(np.arange(1, 41), 30):
        est.observe(rec, "r")
    est.observe_running("r", [RunningRequest(seq=41, input_len=100, age=3, max_tokens=30)], 5)
    first = est.update()
    again = estimator(50)
    again.restore(est.state())
    assert again.update() == first.__class__(**{**first.__dict__})
    assert again.first == first and again.completions == 40


def test_departure_model_needs_requests() -> None:
    with pytest.raises(ValueError, match="no requests"):
        departures.fit(departures.Sample.of(np.array([], np.int64), np.array([], bool)))


def test_departed_replicas_age_out_instead_of_keeping_a_share() -> None:
    """Five replicas x 600 completions, all gone: they held 3,000 samples for good, with none live."""
    est = WorkloadEstimator(window=500, update_every=100, min_samples=30)
    for r in range(5):
        for i in range(600):
            est.observe(CompletionRecord(10, 20 + i % 40, FinishReason.STOP, seq=i), f"r{r}")
    for r in range(5):
        est.forget(f"r{r}")
    assert est.n_samples == est.sample().size == 500  # a window of them, still evidence of the workload
    assert est.update() is not None
    for i in range(500):
        est.observe(CompletionRecord(10, 80, FinishReason.STOP, seq=i), "new")
    assert est.n_samples == 500 and est.state().departed == []  # displaced, one by one
    assert est.update().mu_o == pytest.approx(80)


def _sample_row_by_row(est: WorkloadEstimator) -> departures.Sample:
    """The window a row at a time: each window's finished requests (errors left out), then its running ones."""
    from ebplus.controller.estimator import _recent

    live, share = est._live()
    rows = []
    windows = [(w, *_recent(w.done, newest, share)) for w, newest in live]
    windows += [(w, -1, list(w.done.items())) for w in est._departed]
    for w, lo, recent in windows:
        for _, rec in recent:
            if rec.finish is FinishReason.ERROR:
                continue
            cap = rec.max_tokens or (rec.output_len if rec.finish is FinishReason.LENGTH else 0)
            rows.append((rec.output_len, rec.finish is FinishReason.STOP, rec.finish is FinishReason.LENGTH, cap, 1.0,
                         False))  # fmt: skip
        scale = w.running_total / len(w.running) if w.running else 0.0
        for r in w.running:
            if r.seq <= lo or r.seq in w.done:
                continue
            at_cap = 0 < r.max_tokens <= r.age
            rows.append((max(r.age, 0), False, at_cap, r.max_tokens, scale, not at_cap))
    return departures.Sample.of(*(list(column) for column in zip(*rows, strict=True))) if rows else (
        departures.Sample.of([], [], [], [], [], []))  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 8), st.sampled_from([10, 37, 500]))
def test_the_sample_built_a_column_at_a_time_is_the_row_by_row_one(seed: int, replicas: int, window: int) -> None:
    """Every kind of ending, caps, running requests at and below their caps, replicas that leave: same entries,
    same types, same order."""
    rng = np.random.default_rng(seed)
    est = WorkloadEstimator(window=window, update_every=1, min_samples=1)
    finishes = list(FinishReason)
    for step in range(25):
        rid = f"r{rng.integers(replicas)}"
        first = int(rng.integers(0, 3000))
        recs = [CompletionRecord(10, int(o), finishes[int(f)], first + j, max_tokens=int(m))
                for j, (o, f, m) in enumerate(zip(rng.integers(1, 300, 30), rng.integers(0, len(finishes), 30),
                                                  rng.choice([0, 50, 400], 30), strict=True))]  # fmt: skip
        est.observe_many(recs, rid)
        k = int(rng.integers(0, 20))
        running = [RunningRequest(seq=int(q), input_len=5, age=int(a), max_tokens=int(m))
                   for q, a, m in zip(rng.integers(0, 3200, k), rng.integers(0, 500, k), rng.choice([0, 64, 300], k),
                                      strict=True)]  # fmt: skip
        est.observe_running(rid, running, int(rng.integers(len(running), 3 * len(running) + 2)))
        if step % 7 == 6:
            est.forget(f"r{rng.integers(replicas)}")
        got, want = est.sample(), _sample_row_by_row(est)
        for name in ("durations", "natural", "capped", "caps", "weights", "running"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name

"""The step simulator: conservation, engine invariants, arrivals, determinism, the fluid limit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ebplus.controller import theory
from ebplus.controller.cost_model import HardwareProfile, resolve_profile
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import LengthSpec, PhaseSpec, Schedule, Workload, build_requests, load_source

RAW_H200 = dict(alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5)
BETA_MB = (2.494e-5, 5.193e-5, 1.478e-5)


def profile(kv: int = 10**9, beta_kv: float = 0.0, beta_mb: tuple = BETA_MB) -> HardwareProfile:
    return HardwareProfile(name="test", kv_capacity_tokens=kv, beta_mb=beta_mb, beta_kv=beta_kv, **RAW_H200)


def workload(inp: float = 256, out: float = 128, jitter: float = 0.5, dist: str = "uniform") -> Workload:
    spec = LengthSpec(dist=dist, mean=out, jitter=jitter) if dist == "uniform" else LengthSpec(dist=dist, mean=out)
    return Workload(name="w", input=LengthSpec(dist="uniform", mean=inp, jitter=jitter), output=spec)


# policies with the settings they are run under in these tests
POLICIES = [
    SimConfig(policy=Policy.MB, n=64, budget=512, record_steps=True),
    SimConfig(policy=Policy.V0, n=64, budget=512, record_steps=True),
    SimConfig(policy=Policy.EB, k=16, n=64, budget=512, record_steps=True),
    SimConfig(policy=Policy.EB, n=64, budget=512, record_steps=True),
    SimConfig(policy=Policy.EBPLUS, n=64, budget=512, record_steps=True),
]
IDS = ["mb", "v0", "eb16", "eb-online", "eb+"]


def run(config: SimConfig, kv: int = 10**9, requests: int = 600, seed: int = 0, **arrivals) -> tuple:
    reqs = build_requests(workload(), seed=seed, requests=requests, **arrivals)
    return simulate(profile(kv=kv, beta_kv=1e-8), reqs, config), reqs


@pytest.mark.parametrize("config", POLICIES, ids=IDS)
@pytest.mark.parametrize("kv", [10**9, 12_000], ids=["roomy", "kv-bound"])
def test_token_conservation(config: SimConfig, kv: int) -> None:
    res, reqs = run(config, kv=kv, concurrency=48)
    inp, out = reqs.input_len.sum(), reqs.output_len.sum()
    assert np.all(np.isfinite(res.finish_s))
    # every prompt token and every output token but the last is fed through the model exactly
    # once; KV thrown away by preemption is computed again and counted apart
    assert res.prefill_tokens + res.decode_tokens == inp + (out - len(reqs)) + res.recompute_tokens
    if res.preemptions == 0:
        assert res.recompute_tokens == 0
        assert res.prefill_tokens == inp and res.decode_tokens == out - len(reqs)
    else:
        assert res.recompute_tokens > 0
    log = res.step_log
    assert sum(log.prefill_tokens) == res.prefill_tokens and sum(log.decode_tokens) == res.decode_tokens
    assert np.all(res.first_token_s >= res.arrival_s) and np.all(res.finish_s >= res.first_token_s)


@pytest.mark.parametrize("config", [c for c in POLICIES if not c.online], ids=IDS[:3])
def test_kv_bound_run_preempts(config: SimConfig) -> None:
    """The KV-bound setting above really exercises preemption (online policies avoid it: see below)."""
    res, _ = run(config, kv=12_000, concurrency=48)
    assert res.preemptions > 0


@pytest.mark.parametrize("config", POLICIES, ids=IDS)
@pytest.mark.parametrize("kv", [10**9, 12_000], ids=["roomy", "kv-bound"])
def test_engine_invariants(config: SimConfig, kv: int) -> None:
    res, _ = run(config, kv=kv)  # saturated: the queue is never empty
    log = res.step_log
    pre, dec = np.array(log.prefill_tokens), np.array(log.decode_tokens)
    running, n_cap = np.array(log.running), np.array(log.n_cap)
    assert np.all(pre + dec <= config.budget)  # never over the token budget
    assert np.all(pre + dec > 0)
    assert np.all(running <= config.n)  # running <= N always
    admitted = np.array(log.admitted) > 0
    assert np.all(running[admitted] <= n_cap[admitted])  # admissions respect the N in force
    assert np.all(np.array(log.kv_used) <= kv)  # KV never above capacity
    assert res.max_kv_tokens <= kv and res.max_running <= config.n
    mixed = (pre > 0) & (dec > 0)
    exclusive = np.array(log.active) == "eb"
    assert not np.any(mixed & exclusive)  # no mixed step ever while exclusive
    if config.policy in (Policy.EB, Policy.V0):
        assert not np.any(mixed) and res.steps["mixed"] == 0
    if config.policy is Policy.MB:
        assert np.any(mixed)


def test_deterministic_for_a_seed() -> None:
    cfg = SimConfig(policy=Policy.EBPLUS, n=64, budget=512)
    a, _ = run(cfg, seed=3, rate=40.0)
    b, _ = run(cfg, seed=3, rate=40.0)
    c, _ = run(cfg, seed=4, rate=40.0)
    assert a.as_json() == b.as_json()
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    assert a.as_json() != c.as_json()


@pytest.mark.parametrize("config", POLICIES, ids=IDS)
@pytest.mark.parametrize("arrivals", [{}, {"concurrency": 40}, {"rate": 30.0}], ids=["saturated", "closed", "open"])
def test_jumping_over_decode_steps_changes_nothing(config: SimConfig, arrivals: dict) -> None:
    fast, _ = run(config, kv=12_000, **arrivals)
    slow, _ = run(dataclasses.replace(config, jump=False), kv=12_000, **arrivals)
    # the same steps and decisions; times agree up to the order of floating-point sums
    a, b = fast.as_json(), slow.as_json()

    def same(x: object, y: object) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        return x == (pytest.approx(y, rel=1e-9) if isinstance(x, float) else y)

    for key, value in a.items():
        assert same(value, b[key]), key
    np.testing.assert_allclose(fast.finish_s, slow.finish_s, rtol=1e-9)
    for name, column in dataclasses.asdict(fast.step_log).items():
        other = getattr(slow.step_log, name)
        assert column == (pytest.approx(other, rel=1e-9) if name == "t_end" else other), name
    assert fast.steps == slow.steps


def test_closed_loop_keeps_concurrency() -> None:
    res, _reqs = run(SimConfig(policy=Policy.MB, n=256, record_steps=True), concurrency=20)
    log = res.step_log
    in_system = np.array(log.running) + np.array(log.waiting)
    assert in_system.max() <= 20
    # the next request is issued when one finishes: arrivals are completion times
    later = np.sort(res.arrival_s)[20:]
    assert np.all(np.isin(later, res.finish_s))


def test_eb_burst_tail_is_not_held_for_the_whole_batch() -> None:
    # 70 requests at once, N = 64, k = 16: the last 6 (< k, and nothing more arrives)
    # start once 16 of the first batch have finished, not after all 64 of them
    res, _ = run(SimConfig(policy=Policy.EB, k=16, n=64), requests=70)
    first_batch = np.sort(res.finish_s[:64])
    tail_start = res.first_token_s[64:].max()
    assert tail_start <= first_batch[15 + 6]  # at most a few steps after the 16th completion
    assert tail_start < first_batch[-1]


def test_open_loop_rate_and_saturated_arrivals() -> None:
    res, _ = run(SimConfig(policy=Policy.MB, n=256), requests=2000, rate=25.0)
    span = res.arrival_s.max() - res.arrival_s.min()
    assert 2000 / span == pytest.approx(25.0, rel=0.08)
    sat, _ = run(SimConfig(policy=Policy.MB, n=256))
    assert np.all(sat.arrival_s == 0.0)


def test_drained_schedule_starts_each_phase_after_the_last() -> None:
    sched = Schedule(
        drain=True,
        phases=[PhaseSpec(workload=workload(), requests=200, concurrency=8), PhaseSpec(workload=workload(), rate=50)],
    )
    reqs = build_requests(sched, seed=0, requests=300)
    res = simulate(profile(), reqs, SimConfig(policy=Policy.MB, n=64))
    assert len(reqs) == 500 and [p.stop for p in reqs.phases] == [200, 500]
    assert res.arrival_s[200:].min() >= res.finish_s[:200].max()
    assert res.phase_bounds[1][3] == pytest.approx(res.finish_s[:200].max())


def test_capped_outputs_reach_the_controller_as_censored() -> None:
    wl = Workload(
        input=LengthSpec(dist="fixed", mean=128), output=LengthSpec(dist="geometric", mean=200), max_tokens=150
    )
    reqs = build_requests(wl, seed=0, requests=600)
    res = simulate(profile(), reqs, SimConfig(policy=Policy.EB, n=64))
    assert reqs.output_len.max() == 150 and reqs.capped.any()
    est = res.controller.workload.estimate
    assert est is not None and est.n_censored > 0


@pytest.mark.parametrize("n", [512, 1024])
def test_fluid_limit_geometric_eb_k0_matches_theory(n: int) -> None:
    """Simulated EB(k0*) with geometric outputs agrees with TP_EB (eq. 4) within 2%."""
    mu_l, mu_o = 512, 256
    prof = profile(beta_mb=BETA_MB)
    wl = Workload(input=LengthSpec(dist="fixed", mean=mu_l), output=LengthSpec(dist="geometric", mean=mu_o))
    k = theory.k_star(theory.theta0(1 / mu_o, prof.alpha_p, prof.alpha_d), n)
    reqs = build_requests(wl, seed=1, requests=30 * n)
    # one prefill step per phase, as in the fluid model: the budget does not chunk prompts
    res = simulate(prof, reqs, SimConfig(policy=Policy.EB, k=k, n=n, budget=1 << 22))
    expected = theory.tp_eb(k, n, prof.alpha_p, prof.alpha_d, prof.beta_p, prof.beta_d, mu_l, mu_o)
    assert res.steady_req_per_s() == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("workload_name", ["paper", "decode-heavy"])
@pytest.mark.parametrize("concurrency", [32, 128, 512, 2048])
def test_step_mix_closed_forms_match_the_simulator(workload_name: str, concurrency: int) -> None:
    """TP_MB priced with MB's mix of step kinds, and TP_EB with the budget's prefill chunks, within 5%
    of simulated MB and EB(k0*) at c = 32..2048 (closed loop, KV read cost folded at the mean context)."""
    prof = resolve_profile("h200").model_copy(update={"kv_capacity_tokens": 10**9})
    src = load_source(workload_name)
    mu_l, mu_o = src.input.expected_mean(), src.output.expected_mean()
    reqs = build_requests(src, seed=0, requests=max(1500, 8 * concurrency), concurrency=concurrency)
    # uniform +-50% outputs: E[O^2] = mu_o^2 (1 + 0.5^2/3)
    cost = prof.cost_model().folded(mu_l + mu_o * (1 + 0.25 / 3) / 2)
    mb = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=4096, budget=8192)).steady_req_per_s()
    closed_mb = theory.mb_steps(
        concurrency, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d, mu_l, mu_o, 8192
    ).tp
    assert closed_mb == pytest.approx(mb, rel=0.05)
    k = max(1, theory.k_star(theory.theta0(1 / mu_o, cost.alpha_p, cost.alpha_d), concurrency))
    eb = simulate(prof, reqs, SimConfig(policy=Policy.EB, k=k, n=4096, budget=8192)).steady_req_per_s()
    closed_eb = theory.tp_eb(k, concurrency, cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, 8192)
    assert closed_eb == pytest.approx(eb, rel=0.05)


def test_online_limits_n_to_avoid_preemption() -> None:
    """Once estimated, N* keeps a KV-bound EB replica from preempting (a fixed large N does not)."""
    reqs = build_requests(workload(), seed=0, requests=3000)
    prof = profile(kv=40_000)
    fixed = simulate(prof, reqs, SimConfig(policy=Policy.EB, k=8, n=512))
    online = simulate(prof, reqs, SimConfig(policy=Policy.EB, n=512, record_steps=True))
    assert fixed.preemptions > 100
    assert online.n_final < 512
    late = np.array(online.step_log.t_end) > online.sim_seconds / 2
    assert np.array(online.step_log.kv_used)[late].max() <= 40_000
    assert online.preemptions < fixed.preemptions / 10


@pytest.mark.parametrize(("interference", "expected"), [(4e-5, "eb"), (-1.2e-5, "mb")])
def test_eb_plus_picks_the_faster_mode(interference: float, expected: str) -> None:
    """With costly mixing EB+ ends in EB; with cheap mixing and a large decode fixed cost, in MB."""
    base = theory.beta_eb_weighted(RAW_H200["beta_p"], RAW_H200["beta_d"], 512, 256)
    prof = profile(beta_mb=(base + interference, 0.0, 0.0))
    reqs = build_requests(workload(512, 256), seed=0, requests=4000, concurrency=256)
    res = simulate(prof, reqs, SimConfig(policy=Policy.EBPLUS, n=512))
    # the mode in force at mid-run (the drain at the end lowers concurrency, which favours MB)
    mid = [mode for t, _, _, mode in res.timeline if t <= res.sim_seconds / 2][-1]
    assert mid == expected


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="--k applies to --policy eb"):
        SimConfig(policy=Policy.MB, k=4)
    with pytest.raises(ValueError, match="--k must be in"):
        SimConfig(policy=Policy.EB, k=100, n=10)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        simulate(profile(kv=100), build_requests(workload(), seed=0, requests=5), SimConfig(policy=Policy.MB))


def test_loaded_rate_is_the_offered_load_and_leaves_out_the_drain() -> None:
    """Below capacity, the work done while requests arrive is the offered load (tokens/s); ``tok_per_s``,
    first arrival to last completion, also counts the drain after the last arrival, so it is lower."""
    rate = 20.0  # requests/s: about a third of an H200's MB capacity on this workload
    reqs = build_requests(workload(), seed=2, requests=2000, rate=rate)
    res = simulate(resolve_profile("h200"), reqs, SimConfig(policy=Policy.MB))
    offered = rate * float((reqs.input_len + reqs.output_len).mean())
    assert res.loaded_tok_per_s() == pytest.approx(offered, rel=0.05)
    assert res.tok_per_s < res.loaded_tok_per_s()
    assert res.finish_s.max() > np.nanmax(res.arrival_s)  # the last requests finish after the last arrival

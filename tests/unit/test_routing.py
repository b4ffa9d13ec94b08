"""The routing policies (``deploy/routing.py``): when a replica admits a request, and whom each router picks."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ebplus.controller.cost_model import CostModel, resolve_profile
from ebplus.controller.messages import Mode
from ebplus.deploy.routing import (
    ROUTERS,
    LeastLoaded,
    PhaseAware,
    PhaseBoard,
    PowerOfTwo,
    admission_eta,
    make_router,
)


def board(**changes: object) -> PhaseBoard:
    """An EB replica decoding 40 of 64 slots, k 16, nothing queued, its step ending at t = 1.0."""
    base = PhaseBoard(
        mode=Mode.EB,
        prefilling=False,
        running=40,
        waiting=0,
        n=64,
        k=16,
        freed=0,
        prefill_tokens=0,
        kv_tokens=40_000,
        step_end_s=1.0,
        decode_step_s=0.02,
        departure_p=0.01,
        prefill_s_per_token=1e-5,
        published_s=1.0,
    )
    return dataclasses.replace(base, **changes)


def departures(b: PhaseBoard) -> float:
    """How many running requests must finish before a request routed to ``b`` at its step's end is admitted."""
    eta = admission_eta(b, now=b.step_end_s)
    return 0.0 if eta == 0.0 else eta / b.per_departure_s


def test_mb_admits_at_its_next_step_while_a_slot_is_free() -> None:
    b = board(mode=Mode.MB)
    assert departures(b) == pytest.approx(0)
    assert admission_eta(b, now=0.5) == pytest.approx(0.5)  # the current step's end
    assert admission_eta(b, now=2.0) == 0.0  # idle since: at once


def test_mb_full_waits_for_the_departures_that_free_its_seat() -> None:
    b = board(mode=Mode.MB, running=64, waiting=3)  # three ahead of it, no slot free
    assert departures(b) == pytest.approx(4)
    per_departure = 0.02 / (64 * 0.01)
    assert admission_eta(b, now=1.0) == pytest.approx(4 * per_departure)


def test_eb_decoding_waits_for_its_window() -> None:
    # 24 slots free, 1 queued with this one: the window opens once k = 16 left since the last one
    assert departures(board()) == pytest.approx(16)
    # 15 queued ahead: this request is the 16th, and 24 >= 16 slots are free: the window opens now
    assert departures(board(waiting=15)) == pytest.approx(0)
    # k left already: any admissible request opens it
    assert departures(board(freed=16)) == pytest.approx(0)
    # few slots free: the queue opens it once k slots are
    assert departures(board(running=60, waiting=20)) == pytest.approx(17)  # a seat for 21 requests: 21 - 4 free


def test_an_open_window_or_an_idle_replica_admits_now() -> None:
    assert departures(board(prefilling=True)) == pytest.approx(0)
    assert departures(board(running=0, kv_tokens=0)) == pytest.approx(0)


def test_queued_prompt_tokens_delay_the_admission() -> None:
    b = board(mode=Mode.MB, prefill_tokens=30_000)
    assert admission_eta(b, now=1.0) == pytest.approx(0.3)


def test_a_replica_with_nothing_decoding_that_needs_departures_never_admits() -> None:
    b = board(mode=Mode.MB, running=64, waiting=1, departure_p=0.0)
    assert admission_eta(b, now=1.0) == math.inf


def test_power_of_two_compares_two_queues() -> None:
    boards = [board(running=10), board(running=50), board(running=30)]
    router = PowerOfTwo(seed=1)
    picks = [router.choose(boards, 1.0) for _ in range(300)]
    assert set(picks) <= {0, 2} and picks.count(0) > picks.count(2)  # 1 never wins a pair; 0 wins both of its
    assert PowerOfTwo().choose([board()], 1.0) == 0


def test_least_loaded_counts_prefill_and_decode_tokens() -> None:
    boards = [board(kv_tokens=50_000), board(kv_tokens=10_000, prefill_tokens=45_000), board(kv_tokens=30_000)]
    assert LeastLoaded().choose(boards, 1.0) == 2


def test_the_phase_router_books_the_window_that_opens_soonest() -> None:
    decoding = board()  # 16 departures away
    about_to_open = board(waiting=15)  # this request opens its window
    busier_mb = board(mode=Mode.MB, running=63, kv_tokens=90_000)  # a seat now, but loaded
    router = PhaseAware()
    assert router.choose([decoding, about_to_open], 1.0) == 1
    assert router.choose([decoding, busier_mb], 1.0) == 1
    # equal admissions: the lighter replica
    assert router.choose([busier_mb, board(mode=Mode.MB, kv_tokens=1_000)], 1.0) == 1


def test_the_phase_router_falls_back_on_a_stale_board() -> None:
    router = PhaseAware(seed=0, stale_s=2.0)
    fresh = [board(published_s=9.0), board(waiting=15, published_s=9.0)]
    assert router.choose(fresh, 10.0) == 1 and router.fallbacks == 0
    stale = [board(published_s=1.0), board(waiting=15, published_s=9.0)]
    router.choose(stale, 10.0)
    assert router.fallbacks == 1
    exact = PhaseAware(stale_s=math.inf)  # the simulator's boards
    exact.choose(stale, 10.0)
    assert exact.fallbacks == 0


def test_routers_by_name() -> None:
    assert set(ROUTERS) == {"default", "least-loaded", "phase"}
    assert isinstance(make_router("phase", 3, stale_s=5.0), PhaseAware)
    assert make_router("phase", stale_s=5.0).stale_s == 5.0
    with pytest.raises(ValueError, match="unknown router 'p2c'; choose from default, least-loaded, phase"):
        make_router("p2c")


def test_a_window_short_of_k_opens_as_fast_as_the_router_fills_it() -> None:
    b = board(waiting=5)  # 10 more requests after this one open its window (k 16, 24 slots free)
    assert admission_eta(b, now=1.0) == pytest.approx(16 * b.per_departure_s)  # alone: k departures
    assert admission_eta(b, now=1.0, arrival_rate=100.0) == pytest.approx(0.1)  # filled at 100 requests/s
    full = board(running=60, waiting=20)  # queued past k: 12 departures free its k slots, 17 its seat
    assert admission_eta(full, now=1.0, arrival_rate=100.0) == pytest.approx(17 * full.per_departure_s)


def test_the_phase_router_fills_one_window_until_it_opens() -> None:
    router = PhaseAware(stale_s=math.inf)
    for t in range(10):  # it learns the rate: 10 requests/s
        router.choose([board(mode=Mode.MB, published_s=t / 10)], t / 10)
    assert router.arrival_rate == pytest.approx(10.0)
    waiting = [0, 12]
    picks = []
    for step in range(6):
        boards = [board(waiting=waiting[0], freed=3), board(waiting=waiting[1])]
        i = router.choose(boards, 1.0 + step / 10)
        picks.append(i)
        waiting[i] += 1
    # replica 1's window is 4 requests short of k (this one included): the router commits to it, its 4th
    # opens it, and the router is free again (an open window admits at once: it stays the soonest)
    assert picks[:4] == [1, 1, 1, 1]
    assert router.filling is None and waiting[1] >= 16


def test_a_deployments_board_is_the_engines_report_with_the_controllers_hints() -> None:
    import msgspec

    from ebplus.controller.messages import PhaseReport, RoutingHints, WireError, decode, encode

    report = PhaseReport(mode=Mode.EB, prefilling=False, running=6, waiting=2, n=8, k=4, freed=1, prefill_tokens=90,
                         kv_tokens=700, decode_step_s=0.03, mean_output=50.0, mean_prompt=30.0, read_at=12.5)  # fmt: skip
    cost = resolve_profile("h200").cost_model()
    hints = RoutingHints(p0=0.004, mu_l=25.0, beta_p={"a": 3e-5}, cost={"a": cost})
    b = PhaseBoard.of(report, hints, "a", leased=3)
    # the three requests it was sent since: queued, each with the controller's mean prompt to prefill
    assert (b.running, b.waiting, b.n, b.k, b.freed, b.prefill_tokens, b.kv_tokens) == (6, 5, 8, 4, 1, 90 + 75, 700)
    assert (b.departure_p, b.prefill_s_per_token, b.decode_step_s) == (0.004, 3e-5, 0.03)
    assert (b.cost, b.prompt_tokens) == (cost, 25.0)  # what a prompt adds to its next step, priced
    assert decode(encode(hints), RoutingHints) == hints
    # an earlier controller's hints carry no cost models; a cost model that is not one is refused whole
    earlier = decode(msgspec.msgpack.encode({"wire": 1, "p0": 0.004, "beta_p": {"a": 3e-5}}), RoutingHints)
    assert earlier.cost == {} and PhaseBoard.of(report, earlier, "a").cost is None
    with pytest.raises(WireError, match=r"not a RoutingHints: 1 validation error for CostModel - at `\$\.cost"):
        decode(msgspec.msgpack.encode({"wire": 1, "cost": {"a": {**cost.model_dump(), "alpha_p": -1.0}}}), RoutingHints)
    assert PhaseBoard.of(report, hints, "c").cost is None  # a replica the controller has no model of
    assert b.step_end_s == b.published_s == 12.5  # read between two steps: the next one starts then
    # before the controller's first estimate: the engine's own mean output; an unknown replica costs nothing to prefill
    cold = PhaseBoard.of(report, RoutingHints(), "b", leased=1)
    assert (cold.departure_p, cold.prefill_s_per_token, cold.waiting, cold.prefill_tokens) == (1 / 50, 0.0, 3, 90 + 30)
    fresh = PhaseBoard.of(msgspec.structs.replace(report, mean_output=0.0), RoutingHints(), "b")
    assert fresh.departure_p == 0.0 and math.isinf(fresh.per_departure_s)
    # a staggered replica's timed window: booked on the same wall clock as its step end
    assert math.isinf(b.slot_s)
    assert PhaseBoard.of(msgspec.structs.replace(report, slot_at=12.8), hints, "a").slot_s == 12.8
    with pytest.raises(WireError, match="slot_at must be finite"):
        decode(encode(msgspec.structs.replace(report, slot_at=None)).replace(b"\xc0", b"\xcb\x7f\xf0" + bytes(6)),
               PhaseReport)  # fmt: skip


def test_a_staggered_slot_is_booked_when_it_comes_before_the_windows_triggers() -> None:
    """k = 16 departures take 0.8 s here; a staggered slot 0.3 s after the step ends opens a window sooner,
    one after them changes nothing, and none (inf, a deployment's board) is the plain rule."""
    assert admission_eta(board(), now=1.0) == pytest.approx(0.8)
    assert admission_eta(board(slot_s=1.3), now=1.0) == pytest.approx(0.3)
    assert admission_eta(board(slot_s=2.5), now=1.0) == pytest.approx(0.8)
    assert admission_eta(board(slot_s=0.5), now=1.0) == pytest.approx(0.0)  # due: it admits at its next step


def test_admissions_a_decode_step_apart_tie_and_the_fuller_window_wins() -> None:
    router = PhaseAware(stale_s=math.inf, load_cap=math.inf)  # the ties alone (an idle replica is under any cap)
    alone = board(running=0, kv_tokens=0, step_end_s=1.0)  # idle: admits this one alone at its step's end
    filling = board(prefilling=True, waiting=6, step_end_s=1.015)  # its open window admits 7, a step later
    assert router.choose([alone, filling], 1.0) == 1  # 15 ms apart, inside one 20 ms decode step
    later = dataclasses.replace(filling, step_end_s=1.03)  # beyond a step: the sooner admission wins
    assert router.choose([alone, later], 1.0) == 0
    # a tie of two steps
    assert make_router("phase", stale_s=math.inf, tie_steps=2, load_cap=math.inf).choose([alone, later], 1.0) == 1
    # the window's fill counts up to k only; past it, token load decides
    full, fuller = board(prefilling=True, waiting=16, kv_tokens=9_000), board(prefilling=True, waiting=20)
    assert admission_eta(full, 1.0) == admission_eta(fuller, 1.0) == 0.0
    assert router.choose([fuller, full], 1.0) == 1


def test_admissions_a_step_apart_tie_and_the_replica_the_request_delays_others_least_wins() -> None:
    """Under MB a prompt mixes into the replica's next step and slows each of its decodes: the cost model prices
    by how much. On the RTX PRO 6000 profile a prompt that turns a decode-only step into a mixed one adds more to
    it than one joining a step that mixes already; on the H200 profile less. Without a cost model, by load."""
    router = PhaseAware(stale_s=math.inf)
    rtx, h200 = resolve_profile("rtx-pro-6000").cost_model(), resolve_profile("h200").cost_model()

    def mb(cost: CostModel | None, **changes: object) -> PhaseBoard:
        return board(**{"mode": Mode.MB, "running": 100, "n": 256, "kv_tokens": 70_000, "cost": cost,
                        "prompt_tokens": 512, **changes})  # fmt: skip

    decoding = mb(rtx, step_end_s=1.0)  # admits at 1.0; its next step would mix only this prompt
    mixing = mb(rtx, prefill_tokens=500, step_end_s=1.01)  # admits 15 ms later: a 20 ms step apart, a tie
    assert decoding.join_delay_s > mixing.join_delay_s > 0
    assert router.choose([decoding, mixing], 1.0) == 1
    assert router.choose([decoding, dataclasses.replace(mixing, step_end_s=1.02)], 1.0) == 0  # a step apart: sooner
    assert router.choose([mb(h200, step_end_s=1.0), mb(h200, prefill_tokens=500, step_end_s=1.01)], 1.0) == 0
    # the delay counts every request the step carries: an idle replica's prompt delays itself alone
    assert mb(rtx, running=0, kv_tokens=0).join_delay_s < decoding.join_delay_s
    # under EB the step that prefills it is the prefill phase, a prefill-only step that pauses the decodes: the
    # same unit, so an EB+ fleet whose replicas run different modes compares them (fixed cost and all when
    # nothing is queued for it; its prompt alone when it joins a window)
    eb = board(cost=rtx, prompt_tokens=512, running=100, n=256, kv_tokens=70_000)
    assert eb.join_delay_s == pytest.approx((rtx.alpha_p + rtx.beta_p * 512) * 101)
    assert dataclasses.replace(eb, waiting=3, prefill_tokens=1500).join_delay_s == pytest.approx(rtx.beta_p * 512 * 104)
    # an EB replica whose window is open admits at its step's end too: its 90 ms prefill phase over 101
    # requests against the 95 ms the prompt adds to the MB replica's next step (over as many)
    assert router.choose([dataclasses.replace(eb, prefilling=True), decoding], 1.0) == 0
    # no cost model (a controller of an earlier release) or no prompt known: no delay, and load decides
    unpriced = (mb(None), board(prompt_tokens=512), mb(rtx, prompt_tokens=0))
    assert [b.join_delay_s for b in unpriced] == [0.0, 0.0, 0.0]
    sooner, lighter = mb(None, kv_tokens=50_000), mb(None, kv_tokens=1_000, step_end_s=1.015)
    assert router.choose([sooner, lighter], 1.0) == 1
    assert router.choose([sooner, dataclasses.replace(lighter, step_end_s=1.03)], 1.0) == 0


def test_a_replica_holding_over_a_quarter_more_than_the_mean_queue_is_passed_over() -> None:
    """Under EB the replica holding the most requests opens its window soonest (its k departures come
    fastest); left alone, the router would keep sending it more. Over ``load_cap`` (1.25) x the mean queue + 1
    it is not a candidate while another is."""
    heavy = board(running=120, n=256, kv_tokens=120_000)  # 16 departures in 0.27 s
    light = [board(running=10, kv_tokens=10_000) for _ in range(3)]  # 16 departures in 3.2 s
    assert admission_eta(heavy, 1.0) < min(admission_eta(b, 1.0) for b in light)
    boards = [*light[:2], heavy, light[2]]  # mean queue 37.5: the cap is 47.875
    assert PhaseAware(stale_s=math.inf).choose(boards, 1.0) != 2
    assert make_router("phase", stale_s=math.inf, load_cap=math.inf).choose(boards, 1.0) == 2  # no cap
    assert PhaseAware(stale_s=math.inf, load_cap=4.0).choose(boards, 1.0) == 2  # under a cap of 4: 151
    # the cap is on what a replica holds, its queue included: it outranks the fuller window among ties
    idle = board(running=0, kv_tokens=0)
    queued = board(running=0, kv_tokens=0, waiting=9)  # the mean of four is 2.25: the cap is 3.8
    assert PhaseAware(stale_s=math.inf).choose([queued, idle, idle, idle], 1.0) == 1
    assert PhaseAware(stale_s=math.inf, load_cap=math.inf).choose([queued, idle, idle, idle], 1.0) == 0
    # of two, one is passed over once it holds more than 5/3 of the other's queue plus 8/3
    assert PhaseAware(stale_s=math.inf).choose([queued, idle], 1.0) == 1  # 9 > 0 + 8/3
    assert PhaseAware(stale_s=math.inf).choose([queued, board(running=0, kv_tokens=0, waiting=4)], 1.0) == 0
    # and it never leaves no candidate
    assert PhaseAware(stale_s=math.inf, load_cap=1.0).choose([board(running=5)] * 3, 1.0) in (0, 1, 2)
    with pytest.raises(ValueError, match="load_cap must be at least 1"):
        PhaseAware(load_cap=0.5)
    with pytest.raises(ValueError, match="load_cap must be at least 1"):
        PhaseAware(load_cap=math.nan)

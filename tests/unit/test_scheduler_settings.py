"""The scheduler's start-up settings (replicas.settings): --additional-config first, EBPLUS_* as the fallback."""

from __future__ import annotations

import pytest

from ebplus.controller.messages import Mode, ThresholdUpdate
from ebplus.replicas.config import SchedulerSection
from ebplus.replicas.settings import SettingsError, additional_config, load


def initial(settings, max_num_seqs: int) -> ThresholdUpdate:
    return settings.scheduler.initial(max_num_seqs, settings.theta_cold)


def test_defaults_auto_mb_n_is_max_num_seqs() -> None:
    s = load(None, env={})
    th = initial(s, 64)
    assert (th.mode, th.active, th.n, th.k, th.version) == (Mode.AUTO, Mode.MB, 64, 6, 0)
    assert s.scheduler.telemetry_buffer == 16384 and s.source == "environment"


@pytest.mark.parametrize(("n", "k"), [(2, 1), (9, 1), (10, 1), (16, 1), (20, 2), (256, 25)])
def test_default_k_is_theta_cold_of_n_at_least_one(n: int, k: int) -> None:
    assert SchedulerSection().initial(n, theta_cold=0.10).k == k


@pytest.mark.parametrize(
    ("mode", "active"),
    [("mb", Mode.MB), ("EB", Mode.EB), (" v0 ", Mode.EB), ("auto", Mode.MB), ("shadow", Mode.MB), ("", Mode.MB)],
)
def test_modes_from_the_environment(mode: str, active: Mode) -> None:
    assert initial(load(None, env={"EBPLUS_MODE": mode}), 16).active is active


def test_all_variables() -> None:
    env = {"EBPLUS_MODE": "eb", "EBPLUS_K": "3", "EBPLUS_N": "12", "EBPLUS_TELEMETRY_BUFFER": "128"}
    s = load(None, env=env)
    assert initial(s, 16) == ThresholdUpdate(mode=Mode.EB, k=3, n=12, version=0, active=Mode.EB)
    assert s.scheduler.telemetry_buffer == 128


def test_k_defaults_from_n_not_max_num_seqs() -> None:
    assert initial(load(None, env={"EBPLUS_N": "40"}), 256).k == 4


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"EBPLUS_MODE": "fast"}, "EBPLUS_MODE"),
        ({"EBPLUS_K": "two"}, "EBPLUS_K"),
        ({"EBPLUS_K": "0"}, "EBPLUS_K"),
        ({"EBPLUS_N": "-1"}, "EBPLUS_N"),
        ({"EBPLUS_TELEMETRY_BUFFER": "0"}, "EBPLUS_TELEMETRY_BUFFER"),
        ({"EBPLUS_N": "1.5"}, "EBPLUS_N"),
    ],
)
def test_invalid_values_name_the_variable(env: dict, variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        load(None, env=env)


@pytest.mark.parametrize(
    ("env", "match"),
    [({"EBPLUS_N": "17"}, r"scheduler.n \(17\) must be <= engine.max_num_seqs \(16\)"),
     ({"EBPLUS_N": "8", "EBPLUS_K": "9"}, r"scheduler.k \(9\) must be <= n \(8\)")],
)  # fmt: skip
def test_values_checked_against_the_engine(env: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        initial(load(None, env=env), 16)


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EBPLUS_MODE", "v0")
    monkeypatch.setenv("EBPLUS_N", "4")
    th = initial(load(None), 16)
    assert (th.mode, th.n, th.effective_k) == (Mode.V0, 4, 1)


def test_additional_config_wins_over_the_environment() -> None:
    extra = additional_config({"scheduler": SchedulerSection(mode=Mode.EB, k=5), "auth": {"ignored": "here"}})
    s = load(extra, env={"EBPLUS_MODE": "mb", "EBPLUS_K": "2"})
    assert s.source == "additional_config"
    assert initial(s, 32) == ThresholdUpdate(mode=Mode.EB, k=5, n=32, active=Mode.EB)


def test_additional_config_carries_the_cold_threshold() -> None:
    s = load({"ebplus": {"controller": {"planner": {"theta_cold": 0.25}}}}, env={})
    assert initial(s, 40).k == 10


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"ebplus": {"scheduler": {"mode": "fast"}}}, "additional_config.ebplus.scheduler.mode"),
        ({"ebplus": {"scheduler": {"kk": 3}}}, "additional_config.ebplus.scheduler.kk"),
        ({"ebplus": {"controller": {"planner": {"theta_cold": 2}}}}, "additional_config.ebplus.controller.planner"),
        ({"ebplus": "auto"}, "additional_config.ebplus must be an object"),
    ],
)
def test_bad_additional_config_names_the_key(extra: dict, where: str) -> None:
    with pytest.raises(SettingsError, match=where.replace(".", r"\.")):
        load(extra, env={})

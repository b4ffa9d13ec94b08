"""EBPLUS_* start-up settings of the scheduler (replicas.settings)."""

from __future__ import annotations

import pytest
from ebplus.replicas.phases import Mode
from ebplus.replicas.settings import DEFAULT_TELEMETRY_BUFFER, SettingsError, default_k, from_env


def test_defaults_auto_mb_n_is_max_num_seqs() -> None:
    s = from_env(64, env={})
    th = s.thresholds
    assert (th.mode, th.active, th.n, th.k, th.version) == (Mode.AUTO, Mode.MB, 64, 6, 0)
    assert s.telemetry_buffer == DEFAULT_TELEMETRY_BUFFER


@pytest.mark.parametrize(("n", "k"), [(1, 1), (9, 1), (10, 1), (16, 1), (20, 2), (256, 25)])
def test_default_k_is_ten_percent_at_least_one(n: int, k: int) -> None:
    assert default_k(n) == k


@pytest.mark.parametrize(
    ("mode", "active"), [("mb", Mode.MB), ("EB", Mode.EB), (" v0 ", Mode.EB), ("auto", Mode.MB), ("", Mode.MB)]
)
def test_modes(mode: str, active: Mode) -> None:
    assert from_env(16, env={"EBPLUS_MODE": mode}).thresholds.active is active


def test_all_variables() -> None:
    env = {"EBPLUS_MODE": "eb", "EBPLUS_K": "3", "EBPLUS_N": "12", "EBPLUS_TELEMETRY_BUFFER": "128"}
    s = from_env(16, env=env)
    assert s.thresholds.as_dict() == {"mode": "eb", "active": "eb", "k": 3, "n": 12, "version": 0}
    assert s.telemetry_buffer == 128


def test_k_defaults_from_n_not_max_num_seqs() -> None:
    assert from_env(256, env={"EBPLUS_N": "40"}).thresholds.k == 4


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"EBPLUS_MODE": "fast"}, "EBPLUS_MODE"),
        ({"EBPLUS_K": "two"}, "EBPLUS_K"),
        ({"EBPLUS_K": "0"}, "EBPLUS_K"),
        ({"EBPLUS_N": "17"}, "EBPLUS_N"),  # above max_num_seqs
        ({"EBPLUS_N": "-1"}, "EBPLUS_N"),
        ({"EBPLUS_N": "8", "EBPLUS_K": "9"}, "EBPLUS_K"),  # k > N
        ({"EBPLUS_TELEMETRY_BUFFER": "0"}, "EBPLUS_TELEMETRY_BUFFER"),
        ({"EBPLUS_N": "1.5"}, "EBPLUS_N"),
    ],
)
def test_invalid_values_name_the_variable(env: dict, variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        from_env(16, env=env)


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EBPLUS_MODE", "v0")
    monkeypatch.setenv("EBPLUS_N", "4")
    th = from_env(16).thresholds
    assert (th.mode, th.n, th.effective_k) == (Mode.V0, 4, 1)

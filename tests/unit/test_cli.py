"""`ebplus sim theory` and `ebplus sim estimate`: JSON contracts and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ebplus.cli import main
from ebplus.controller import cli as controller_cli
from ebplus.simulator import distributions as dist

THEORY = [
    "sim", "theory",
    "--p0", "0.0039", "--eta", "1e-5",
    "--alpha-p", "1.2786e-3", "--alpha-d", "8.921e-3",
    "--beta-p", "2.4853e-5", "--beta-d", "4.586e-5",
    "--mu-l", "512", "--n", "1024", "--kv-capacity", "2e6", "--eps", "0.01",
]  # fmt: skip


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_theory_json_keys_and_types(capsys) -> None:
    code, out, _ = run([*THEORY, "--beta-mb", "2.494e-5,5.193e-5,1.478e-5", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert tuple(data) == controller_cli.THEORY_KEYS
    for key in ("theta0", "delta_theta", "theta_star", "tp_eb", "tp_mb"):
        assert isinstance(data[key], float)
    for key in ("k_star", "n_star_paper", "n_star_clt"):
        assert isinstance(data[key], int)
    assert data["winner"] in ("EB", "MB")
    assert 0 < data["theta0"] < data["theta_star"] < 1
    assert data["k_star"] == int(data["theta_star"] * 1024)


def test_theory_text_output(capsys) -> None:
    code, out, _ = run(THEORY, capsys)
    assert code == 0 and "theta0" in out and "winner" in out


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (("--p0", "0"), "p0"),
        (("--eps", "1.5"), "eps"),
        (("--alpha-d", "nan"), "alpha_d"),
        (("--n", "1"), "n"),
        (("--mu-l", "-4"), "mu_l"),
    ],
)
def test_theory_bad_input_exit_2(capsys, change: tuple[str, str], needle: str) -> None:
    argv = list(THEORY)
    argv[argv.index(change[0]) + 1] = change[1]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_theory_unparseable_number_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ebplus.cli", *THEORY[:-1], "many"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "--eps" in proc.stderr


def test_estimate_plain_integers(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(x) for x in dist.linear_hazard(rng, 0.004, 1e-5, 20_000)))
    code, out, _ = run(["sim", "estimate", "--lengths", str(path), "--json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert tuple(data) == ("p0", "eta", "mu_o", "mu_l", "theta0", "n_samples", "model", "gof", "method")
    assert data["model"] == "linear-hazard" and data["gof"] < 0.05
    assert data["n_samples"] == 20_000 and data["mu_l"] is None
    assert data["p0"] == pytest.approx(0.004, rel=0.1) and data["eta"] == pytest.approx(1e-5, rel=0.1)


def test_estimate_jsonl_with_censoring(tmp_path: Path, capsys) -> None:
    path = tmp_path / "lengths.jsonl"
    rows = [{"input_len": 100 + i, "output_len": 1 + i % 50, "censored": i % 10 == 0} for i in range(200)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    code, out, _ = run(["sim", "estimate", "--lengths", str(path), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["mu_l"] == pytest.approx(np.mean([r["input_len"] for r in rows]))
    code, out, _ = run(["sim", "estimate", "--lengths", str(path)], capsys)
    assert code == 0 and "censored" in out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("12\nabc\n", "lengths.txt:2"),
        ("12\n0\n", "lengths.txt:2: output length: must be >= 1"),
        ('{"output_len": 3}\n{"input_len": 4}\n', "lengths.txt:2: field 'output_len' is missing"),
        ('{"output_len": 3, "censored": "yes"}\n', "field 'censored'"),
        ('{"output_len": 3.5}\n', "field 'output_len': must be an integer"),
        ("{broken\n", "invalid JSON"),
        ("", "no lengths"),
    ],
)
def test_estimate_bad_file_exit_2(tmp_path: Path, capsys, content: str, needle: str) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    code, out, err = run(["sim", "estimate", "--lengths", str(path)], capsys)
    assert code == 2 and out == "" and needle in err and err.count("\n") == 1


def test_estimate_missing_file_exit_2(tmp_path: Path, capsys) -> None:
    code, _, err = run(["sim", "estimate", "--lengths", str(tmp_path / "nope.txt")], capsys)
    assert code == 2 and "nope.txt" in err


def test_unknown_command_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2


def test_console_script_help() -> None:
    exe = Path(sys.executable).with_name("ebplus")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and all(f"    {name} " in proc.stdout for name in ("serve", "shutdown", "sim", "bench"))

"""Ray Serve's settings for the cluster ``ebplus serve`` starts: defaults where unset, the operator's value wins."""

from __future__ import annotations

from ebplus.deploy import serve_env


def test_defaults_fill_only_what_is_unset() -> None:
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "0", "PATH": "/bin"}
    applied = serve_env.apply(env)
    assert applied["RAY_SERVE_ENABLE_HA_PROXY"] == "0"  # turned back by the operator
    assert applied["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert set(applied) == set(serve_env.SERVE_ENV)
    assert env["PATH"] == "/bin" and all(env[k] == v for k, v in applied.items())


def test_every_setting_is_one_ray_serve_reads() -> None:
    import importlib.util
    from pathlib import Path

    ray_dir = importlib.util.find_spec("ray").submodule_search_locations[0]  # without importing Ray
    source = (Path(ray_dir) / "serve" / "_private" / "constants.py").read_text()
    for key in serve_env.SERVE_ENV:
        assert f'"{key}"' in source, f"{key} is not a Ray Serve setting in this Ray version"

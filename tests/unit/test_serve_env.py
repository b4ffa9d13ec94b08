"""Ray Serve's settings for the cluster ``ebplus serve`` starts: defaults where unset, the operator's value wins."""

from __future__ import annotations

from ebplus.deploy import serve_env


def test_defaults_fill_only_what_is_unset() -> None:
    env = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "PATH": "/bin"}
    applied = serve_env.apply(env)
    assert applied["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"  # turned back by the operator
    assert applied["RAY_SERVE_ENABLE_HA_PROXY"] == "0"  # off by default (deploy/serve_env.py says why)
    # HAProxy off: no ports of its own; the node health checks are the chart's (a local cluster has one node)
    assert set(applied) == (set(serve_env.SERVE_ENV) - set(serve_env.NODE_HEALTH_ENV)) | set(serve_env.LOCAL_ENV)
    assert applied["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "1"  # a local stop waits for nobody
    assert env["PATH"] == "/bin" and all(env[k] == v for k, v in applied.items())


def test_every_setting_is_one_ray_serve_reads() -> None:
    import importlib.util
    from pathlib import Path

    ray_dir = importlib.util.find_spec("ray").submodule_search_locations[0]  # without importing Ray
    source = (Path(ray_dir) / "serve" / "_private" / "constants.py").read_text()
    for key in {**serve_env.SERVE_ENV, **serve_env.LOCAL_ENV}.keys() - serve_env.NODE_HEALTH_ENV.keys():
        assert f'"{key}"' in source, f"{key} is not a Ray Serve setting in this Ray version"


def test_the_node_health_checks_are_ray_settings() -> None:
    """``RAY_<name>`` overrides Ray's C++ config entry ``<name>``: each name must be one this Ray has."""
    import importlib.util
    from pathlib import Path

    ray_dir = importlib.util.find_spec("ray").submodule_search_locations[0]
    binary = (Path(ray_dir) / "_raylet.so").read_bytes()
    assert set(serve_env.NODE_HEALTH_ENV) <= set(serve_env.SERVE_ENV)  # the chart renders them
    for key in serve_env.NODE_HEALTH_ENV:
        assert key.startswith("RAY_") and b"\0" + key[4:].encode() + b"\0" in binary, key


def test_the_chart_keeps_rays_ingress_drain() -> None:
    """The local drain cut is not in the list the chart renders: on Kubernetes a load balancer must notice."""
    assert not set(serve_env.LOCAL_ENV) & set(serve_env.SERVE_ENV)


def test_haproxy_gets_free_ports_of_its_own_unless_set() -> None:
    """Ray Serve fixes HAProxy's stats and metrics ports (8404, 9101): a second deployment on the host
    could not start. Each start takes free ones; an operator's value wins; HAProxy off: none set."""
    import socket

    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}  # an operator turned it on (it is off by default)
    applied = serve_env.apply(env)
    ports = [int(applied[key]) for key in serve_env.HAPROXY_PORTS]
    assert all(p not in (8404, 9101) and p > 0 for p in ports)
    for port in ports:  # free now: this process can listen there
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))
    serve_env.cleanup(env)
    pinned_env = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_STATS_PORT": "18404"}
    pinned = serve_env.apply(pinned_env)
    assert pinned["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
    serve_env.cleanup(pinned_env)
    off = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    serve_env.apply(off)
    assert not set(serve_env.HAPROXY_PORTS) & set(off)
    source_keys = serve_env.HAPROXY_PORTS
    import importlib.util
    from pathlib import Path

    ray_dir = importlib.util.find_spec("ray").submodule_search_locations[0]
    source = (Path(ray_dir) / "serve" / "_private" / "constants.py").read_text()
    assert all(f'"{key}"' in source for key in source_keys)


def _wait_for_cmdline(pid: int, needle: str, timeout_s: float = 10.0) -> None:
    import time
    from pathlib import Path

    deadline = time.monotonic() + timeout_s
    while needle.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, f"/proc/{pid}/cmdline never named {needle}"
        time.sleep(0.01)


def test_haproxy_files_are_private_to_the_deployment_and_removed_at_the_stop() -> None:
    """Ray Serve's HAProxy admin socket is mode 666 with level admin, under a /tmp directory every deployment
    shares and none removes: each start gets a directory of its own (0700), gone after cleanup()."""
    import stat
    import subprocess
    import sys
    from pathlib import Path

    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    applied = serve_env.apply(env)
    private = Path(applied[serve_env.PRIVATE_DIR])
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        for key in serve_env.HAPROXY_PATHS:
            assert env[key].startswith(str(private)), key
        assert env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] == "600"
        # an HAProxy that outlived Ray's shutdown: a process whose command line names its config there
        config = private / "node" / "haproxy.cfg"
        lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(config)])
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "/tmp/elsewhere"])
        try:
            # right after exec, this machine's /proc may still show an empty command line for a few ms: the
            # HAProxy the cleanup is for has run for the whole deployment, so wait until the child shows it
            _wait_for_cmdline(lingering.pid, str(config))
            assert serve_env.cleanup(env) == [lingering.pid]
            assert lingering.wait(timeout=5) is not None and bystander.poll() is None
        finally:
            bystander.kill()
            bystander.wait()
        assert not private.exists() and serve_env.PRIVATE_DIR not in env
        assert serve_env.cleanup(env) == []  # twice is harmless
    finally:
        serve_env.cleanup(env)
    pinned = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_SOCKET_PATH": "/run/ops/admin.sock"}
    serve_env.apply(pinned)
    assert pinned["RAY_SERVE_HAPROXY_SOCKET_PATH"] == "/run/ops/admin.sock"  # the operator's value wins
    serve_env.cleanup(pinned)


def test_every_haproxy_setting_is_one_ray_serve_reads() -> None:
    import importlib.util
    from pathlib import Path

    ray_dir = importlib.util.find_spec("ray").submodule_search_locations[0]
    source = (Path(ray_dir) / "serve" / "_private" / "constants.py").read_text()
    for key in (*serve_env.HAPROXY_PATHS, *serve_env.HAPROXY_LIMITS):
        assert f'"{key}"' in source, f"{key} is not a Ray Serve setting in this Ray version"


def test_haproxy_socket_paths_stay_within_what_haproxy_accepts() -> None:
    """HAProxy refuses a log socket path over 97 characters, and Ray adds its 56-character node id to each."""
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    serve_env.apply(env)
    try:
        for key in ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"):
            directory, name = env[key].rsplit("/", 1)
            assert len(f"{directory}/{'0' * serve_env.NODE_ID_CHARS}/{name}") <= serve_env.HAPROXY_SOCKET_PATH_MAX
    finally:
        serve_env.cleanup(env)


def test_the_proxy_reaches_the_ingress_over_grpc_only_when_told() -> None:
    """Throughput mode alone leaves Serve's proxy on Ray actor calls (Ray reads the proxy's setting before that
    mode sets its gRPC default); with SERVE_ENV the proxy uses gRPC, whose stream reset carries a client's
    disconnect to the ingress replica (deploy/serve_env.py)."""
    import os
    import subprocess
    import sys

    probe = "from ray.serve._private import constants as c; print(c.RAY_SERVE_USE_GRPC_BY_DEFAULT, c.RAY_SERVE_PROXY_USE_GRPC)"
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE_")}

    def read(env: dict[str, str]) -> list[str]:
        return subprocess.run([sys.executable, "-c", probe], env={**base, **env}, capture_output=True, text=True,
                              check=True, timeout=120).stdout.split()  # fmt: skip

    assert read({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}) == ["True", "False"]
    assert read(serve_env.SERVE_ENV) == ["True", "True"]

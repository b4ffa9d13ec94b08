"""Start the controller actor, or upgrade the running one when its code or configuration changed.

The controller is a detached actor: it outlives the application that created it,
so a redeployed application (a rolling config update, ``serveConfigV2`` edited on
KubeRay) would find the old actor by name and keep running the old code with the
old ``controller:`` settings. :func:`ensure_controller` compares the running
actor's :func:`identity` (a digest of the controller's source and its config)
with the one wanted and, when they differ, upgrades in place: the old actor
persists its state (:meth:`~ebplus.controller.actor.ControllerActor.checkpoint`),
is stopped, and a new one resumes from that state (migrated if its schema is
older, see :mod:`ebplus.controller.persistence`). Replicas serve on with their last
thresholds meanwhile and re-register on their next push.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path
from typing import Any

from ebplus.controller.config import ControllerConfig

logger = logging.getLogger("ebplus.controller")

#: Seconds to wait for the running controller to answer before leaving it alone (it may be restarting).
ANSWER_TIMEOUT_S = 10.0


@functools.cache
def code_digest() -> str:
    """Digest of the controller package's source: it changes with any change to the controller's code."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def identity(config: ControllerConfig) -> str:
    """What a controller runs: its code and its configuration, as one short digest."""
    return hashlib.sha256(f"{code_digest()}\n{config.model_dump_json()}".encode()).hexdigest()[:16]


def ensure_controller(config: ControllerConfig) -> Any:
    """The controller actor running ``config`` with this code: started, found, or upgraded.

    A controller that does not answer within :data:`ANSWER_TIMEOUT_S` (restarting
    after a node loss, paused) is left as it is: replacing it then would only lose
    what it has not persisted yet.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from ebplus.controller.actor import get_controller, start_controller

    handle = get_controller()
    if handle is None:
        return start_controller(config)
    wanted = identity(config)
    try:
        running = ray.get(handle.identity.remote(), timeout=ANSWER_TIMEOUT_S)
    except AttributeError:  # a controller from before identities existed
        running = None
    except (GetTimeoutError, RayActorError) as exc:
        logger.warning("controller did not answer (%s); leaving it as it is", type(exc).__name__)
        return handle
    if running == wanted:
        return handle
    logger.info("controller upgrade: running %s, wanted %s; persisting its state and replacing it", running, wanted)
    stop_controller(handle)
    return start_controller(config)


def stop_controller(handle: Any) -> int | None:
    """Persist the running controller's state, stop it and wait until its name is free.

    Returns the version persisted, or ``None`` when the controller did not answer (its
    last periodic snapshot stands). An upgrade starts the new controller next; ``ebplus
    shutdown`` leaves the state for the next ``serve`` or ``deploy`` to resume from.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from ebplus.controller.actor import get_controller

    version = None
    try:
        version = ray.get(handle.checkpoint.remote(), timeout=ANSWER_TIMEOUT_S)
        logger.info("controller: state persisted at version %d", version)
    except (AttributeError, GetTimeoutError, RayActorError) as exc:
        logger.warning("controller: no final snapshot (%s)", type(exc).__name__)
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + 60
    while get_controller() is not None:  # the name is free once the GCS saw the actor die
        if time.monotonic() > deadline:
            raise RuntimeError("the old controller actor did not go away within 60 s")
        time.sleep(0.2)
    return version

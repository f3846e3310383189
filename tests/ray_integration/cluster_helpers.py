"""Helpers of the Ray tests: node arguments, the stoker actors alive, the references held."""

from __future__ import annotations

import time
from typing import Any

from stoker import _proc

ACTOR_TITLE = "ray::_LoaderActor"  # what a stoker actor's process calls itself
_GONE_LIMIT_S = 10.0
SYSTEM_CONFIG = {
    # a lost node is declared dead after ~0.6 s instead of ~30 s
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 3,
}


def node_args(**extra: Any) -> dict[str, Any]:
    """Arguments of a node of the test cluster: loopback only, no dashboard, small store."""
    return {
        "node_ip_address": "127.0.0.1",
        "object_store_memory": 80 * 2**20,
        **extra,
    }


def stoker_actors() -> list[str]:
    """Names of the live stoker actors in the cluster."""
    import ray

    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("stoker-")
    )


def wait_no_stoker_actors(limit_s: float = _GONE_LIMIT_S) -> list[str]:
    """Waits until the cluster has no live stoker actor; returns those still alive."""
    deadline = time.monotonic() + limit_s
    alive = stoker_actors()
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = stoker_actors()
    return alive


def owned_references() -> set[str]:
    """The object references this process holds (Ray's reference table)."""
    import ray

    worker = ray._private.worker.global_worker
    return {ref.hex() for ref in worker.core_worker.get_all_reference_counts()}


def ray_pool_process(pid: int) -> bool:
    """A process of Ray's own (daemons, idle workers), not a stoker actor."""
    title = _proc.cmdline(pid)
    if title.startswith(ACTOR_TITLE):
        return False
    return title.startswith("ray::") or "/ray/" in title or "ray/core/src" in title

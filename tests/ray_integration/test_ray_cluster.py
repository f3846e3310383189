"""The test cluster stays on loopback; Ray stays optional: ``import stoker`` never imports it."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from harness import leaks
from harness.hidden import env_hiding
from ray_integration.ray_datasets import Noisy
from stoker import _proc

ray = pytest.importorskip("ray", reason="Ray workers need ray: pip install 'stoker[ray]'")


def _socket_addresses() -> dict[str, list[tuple[str, str]]]:
    """inode -> [(local, remote)] of every TCP socket in this network namespace."""
    found: dict[str, list[tuple[str, str]]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            found.setdefault(inode, []).append((_address(local), _address(remote)))
    return found


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` (or its 32-digit IPv6 form) as an IP address, in words."""
    host = hex_address.split(":")[0]
    raw = bytes.fromhex(host)
    # the kernel prints each 32-bit word in host (little-endian) order
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(swapped)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _is_loopback(text: str) -> bool:
    return ipaddress.ip_address(text).is_loopback


def test_every_ray_socket_is_on_loopback(cluster) -> None:
    # load through actors on both loading nodes first, so every kind of connection exists
    loader = stoker.DataLoader(
        Noisy(24), batch_size=4, num_workers=2,
        worker_mode=stoker.RayWorkers(resources={"preprocess": 1}),
    )  # fmt: skip
    assert len(list(loader)) == 6
    ray_pids = [p.pid for p in leaks.descendants(os.getpid())] + [os.getpid()]
    sockets = _socket_addresses()
    seen = 0
    outside = []
    for pid in ray_pids:
        for fd_target in _proc.open_fds(pid).values():
            if not fd_target.startswith("socket:["):
                continue
            inode = fd_target[len("socket:[") : -1]
            for local, remote in sockets.get(inode, []):
                seen += 1
                # a listening socket's remote is 0.0.0.0 / ::, which is no peer
                peer_ok = remote in ("0.0.0.0", "::") or _is_loopback(remote)
                if not (_is_loopback(local) and peer_ok):
                    outside.append(f"pid {pid} ({_proc.cmdline(pid)[:60]}): {local} <-> {remote}")
    assert seen > 10, "found almost no TCP socket of Ray's processes: the check saw nothing"
    assert not outside, "Ray sockets off loopback:\n" + "\n".join(outside)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 3
    assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


def test_import_stoker_does_not_import_ray() -> None:
    code = "import stoker, sys; assert 'ray' not in sys.modules, 'ray was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_ray_the_error_names_the_extra(tmp_path) -> None:
    env = env_hiding(tmp_path, ["ray"], note=" (hidden by the test)")
    code = (
        "import numpy as np, stoker\n"
        "loader = stoker.DataLoader(stoker.ArrayDataset(np.arange(4)), num_workers=1,"
        " worker_mode='ray')\n"
        "next(iter(loader))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "MissingExtraError: worker_mode='ray' needs ray" in result.stderr
    assert "pip install 'stoker[ray]'" in result.stderr


def test_invalid_resource_requests_are_refused_with_the_argument_named() -> None:
    with pytest.raises(
        ValueError, match=r"RayWorkers\(resources=\.\.\.\)\['preprocess'\] must be a number > 0"
    ):
        stoker.RayWorkers(resources={"preprocess": 0})
    with pytest.raises(ValueError, match=r"RayWorkers\(num_cpus=\.\.\.\) must be a number >= 0"):
        stoker.RayWorkers(num_cpus=-1)
    with pytest.raises(ValueError, match=r"worker_mode must be one of \(.*'ray'.*got 'rays'"):
        stoker.DataLoader(stoker.ArrayDataset(np.arange(4)), worker_mode="rays")

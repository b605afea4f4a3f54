"""`parl.utils.machine_info`: what this machine offers -- CPUs, GPUs, its address, free ports.

GPU detection never imports torch unless it is already imported: it reads
`CUDA_VISIBLE_DEVICES` first, then asks torch if loaded, then `nvidia-smi`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

__all__ = [
    "get_cpu_count",
    "get_free_tcp_port",
    "get_gpu_count",
    "get_ip_address",
    "is_gpu_available",
    "is_port_available",
]


def get_cpu_count() -> int:
    """Return the number of CPUs this process may run on (its affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without sched_getaffinity
        return os.cpu_count() or 1


def get_gpu_count() -> int:
    """Return how many CUDA GPUs this process may use (0 on a machine without any)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.cuda.device_count())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def is_gpu_available() -> bool:
    """Return whether at least one CUDA GPU is usable."""
    return get_gpu_count() > 0


def get_ip_address() -> str:
    """Return the address other machines would use to reach this one (127.0.0.1 if offline).

    No packet is sent: connecting a UDP socket only asks the kernel which interface routes out.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address: str = s.getsockname()[0]
            return address
        except OSError:
            return "127.0.0.1"


def get_free_tcp_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def is_port_available(port: int, host: str = "127.0.0.1") -> bool:
    """Return whether `port` can be bound on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True

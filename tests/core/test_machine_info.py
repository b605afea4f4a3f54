"""`parl.utils.machine_info`: CPU and GPU counts, addresses and ports."""

from __future__ import annotations

import os
import socket

from parl.utils import machine_info


def test_cpu_count_is_this_process_affinity():
    assert machine_info.get_cpu_count() == len(os.sched_getaffinity(0)) >= 1


def test_gpu_count_honours_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert machine_info.get_gpu_count() == 2 and machine_info.is_gpu_available()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine_info.get_gpu_count() == 0 and not machine_info.is_gpu_available()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert machine_info.get_gpu_count() == 0


def test_gpu_count_without_the_variable_matches_torch(monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine_info.get_gpu_count() == torch.cuda.device_count()


def test_ports():
    port = machine_info.get_free_tcp_port()
    assert machine_info.is_port_available(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not machine_info.is_port_available(port)
    socket.inet_aton(machine_info.get_ip_address())  # a valid IPv4 address

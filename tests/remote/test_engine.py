"""The engine seam: engines found by name, Ray's through its entry point, none by the handles."""

from __future__ import annotations

import importlib.metadata

import pytest

import parl_remote
from parl_remote.client import _engine


def test_an_unknown_backend_names_the_engines_there_are():
    with pytest.raises(ValueError, match=r"backend='nope' is not one of 'ray', 'xparl'"):
        parl_remote.connect(backend="nope")


def test_the_ray_engine_is_found_through_its_entry_point():
    points = importlib.metadata.entry_points(group=_engine.GROUP, name="ray")
    assert [point.value for point in points] == ["parl_remote.engines.ray:RayClient"]
    assert "ray" not in _engine._BUILTIN  # a plugin, as the dashboard is the master's
    from parl_remote.engines.ray import RayClient

    assert _engine.find("ray") is RayClient
    assert _engine.names() == ["ray", "xparl"]


def test_xparl_is_the_registrys_own_default():
    from parl_remote.engines.xparl import Client

    assert _engine.find(_engine.DEFAULT) is Client

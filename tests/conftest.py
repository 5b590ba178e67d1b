"""Fixtures for every test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def user_cache_dir(tmp_path_factory, monkeypatch):
    """A fresh user cache directory per test (XDG_CACHE_HOME), so no test reads or writes this user's own host
    profile (`liac.profile.host_profile_path()`)."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache

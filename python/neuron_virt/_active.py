"""The profile being recorded, if any: ``_observe`` registers it and ``_runtime`` tells
it of each execution start. A module of its own, so that those two do not import each
other."""

import threading

_profile = None
_lock = threading.Lock()


def activate(profile, start):
    """Makes ``profile`` the one being recorded, calling ``start()`` first; refuses a
    second one while one is recorded."""
    global _profile
    with _lock:
        if _profile is not None:
            raise RuntimeError(f"a profile is already being recorded into {_profile.path}")
        start()
        _profile = profile


def deactivate():
    """No profile is being recorded any more."""
    global _profile
    with _lock:
        _profile = None


def execution_starts():
    """Lets the profile being recorded, if any, see an execution start."""
    profile = _profile
    if profile is not None:
        profile._execution_starts()

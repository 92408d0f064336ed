"""Errors every layer may raise, so that no module needs to import upward to report one."""

from __future__ import annotations


class UsageError(Exception):
    """A bad argument or parameter: reported as one line naming it (the CLI exits 2)."""


class ParameterError(ValueError):
    """A parameter with a bad value: the message is one line naming the parameter and the value."""

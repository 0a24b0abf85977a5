"""The errors of the workloads package (both ValueErrors, so a caller may catch either)."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload cannot be loaded as configured; the message says what is wrong and how to fix it."""


class WorkloadConfigError(WorkloadError):
    """A `workload.*` value is wrong; the message names it and the valid values."""

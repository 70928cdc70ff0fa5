"""One exception hierarchy for the whole library.

Every error a user can provoke is a ``CuectlError``; the CLI maps ``exit_code`` to the
process status in one place (``cuectl.cli.root``) and prints ``error: <message>`` plus an
optional hint. Anything that is not a ``CuectlError`` is a bug and shows a traceback only
with ``--debug``.
"""

from __future__ import annotations


class CuectlError(Exception):
    """Base of every expected error. ``exit_code`` 1: the operation failed."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InvalidInput(CuectlError):
    """Bad usage or invalid input (exit 2). Raised before anything is changed."""

    exit_code = 2


class NotFound(CuectlError):
    """A job, frame, host or device named by the user does not exist."""


class Conflict(CuectlError):
    """The object is in a state that does not allow the operation."""


class Unproven(CuectlError):
    """Nothing proves who submitted a job (sched/identity.py): a root worker will not run it
    as the user its row names."""


class NotOwner(CuectlError):
    """A job or frame is changed by someone who is neither its owner nor an admin."""


class StoreError(CuectlError):
    """The store cannot be used: unreachable, locked too long, corrupt, full, too new."""


class StoreUnreachable(StoreError):
    """The store's server did not answer (refused, timed out, name not resolved): it may
    come back, so a long-running worker waits for it instead of exiting."""


class StoreStalled(StoreUnreachable):
    """A store call was abandoned because it did not return (a server that stopped
    answering) while the worker had to act on a signal."""


class StoreGone(StoreError):
    """The store's file was deleted or replaced while a process had it open."""


class StoreBusy(StoreError):
    """Another process held the store's write lock for longer than the busy timeout."""


class SchemaTooNew(StoreError):
    """The store was written by a newer cuectl; we refuse rather than damage it."""


class GpuError(CuectlError):
    """A GPU backend could not be used (no driver, tool missing, bad output)."""


class BackendUnavailable(GpuError):
    """The backend cannot run on this machine (library or tool missing, no driver)."""


class BackendOutputError(GpuError):
    """The backend's tool ran but printed something we cannot parse."""


class LeaseError(CuectlError):
    """Base of the ad-hoc/worker device lease errors."""


class NoMatchingDevice(LeaseError):
    """No device on this host could ever satisfy the request."""


class DevicesBusy(LeaseError):
    """Matching devices exist but are all leased by others right now."""

    def __init__(self, message: str, *, holders: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.holders = holders or []


class InsufficientFreeMemory(LeaseError):
    """Matching devices exist but have too little free memory right now."""


class InvalidDevice(LeaseError, InvalidInput):
    """An explicit device id/UUID that this host does not have."""

    exit_code = 2


class LeaseTimeout(LeaseError):
    """Waited for a lease for longer than the timeout; ``holders`` as in ``DevicesBusy``."""

    def __init__(self, message: str, *, holders: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.holders = holders or []

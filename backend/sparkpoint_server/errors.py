"""Errors of the control plane: one root, small subclasses; the API maps each to an HTTP status."""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Root of every error the control plane raises on purpose."""

    status_code = 400


class InvalidRequestError(ControlPlaneError):
    """A request's field is invalid; the message names the field and what is wrong."""

    status_code = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotAuthenticatedError(ControlPlaneError):
    """A mutating call (or a read, when reads are protected) came without the right token."""

    status_code = 401


class JobNotFoundError(ControlPlaneError):
    status_code = 404

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class CheckpointNotFoundError(ControlPlaneError):
    """A checkpoint that is unknown, no longer retained, or whose files are gone or corrupt."""

    status_code = 404


class RequestNotFoundError(ControlPlaneError):
    status_code = 404


class ConflictError(ControlPlaneError):
    """The job is in a state that does not allow the request (for example: not running)."""

    status_code = 409


class SettingsError(ControlPlaneError):
    """The control plane's settings (environment) are invalid."""


class StartupError(ControlPlaneError):
    """The control plane cannot start: Redis or its database cannot be used (the message
    names which, where, without a password, and why)."""


class StorageUnavailableError(ControlPlaneError):
    """Checkpoint storage failed or did not answer within ``SPARKPOINT_STORAGE_TIMEOUT``; the
    message names the path and the cause."""

    status_code = 503


class CorruptCheckpointError(ControlPlaneError):
    """A checkpoint or savepoint to restore exists but its files fail their checksums."""

    status_code = 422

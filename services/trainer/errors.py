"""The trainer's exceptions (no torch import, so the shell can classify failures cheaply)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """The checkpoint cannot be used by this launch (the message says why). Permanent."""


class BackendUnavailable(RuntimeError):
    """The requested backend or device cannot run here (not installed, no GPU). Permanent."""


class DatasetError(ValueError):
    """The dataset path is missing, corrupt or not the form the workload reads. Permanent."""


class SdkError(ValueError):
    """The trainer SDK (`loom.sdk`) was set up or used wrongly; the message names what and
    where."""


class TrainingFailed(RuntimeError):
    """A launch failed; carries the iteration it had reached (None before `started`)."""

    def __init__(self, iteration: int | None, cause: Exception) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.iteration = iteration
        self.cause = cause


PERMANENT: tuple[type[Exception], ...] = (CheckpointError, BackendUnavailable, DatasetError)

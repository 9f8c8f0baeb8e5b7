"""Exceptions that tell the user what went wrong and what to do about it."""


class AccelBackendError(RuntimeError):
    """Base class: every error of this package is one of these, so callers can catch them together."""


class BackendNotFoundError(AccelBackendError, LookupError):
    """No backend of the requested name is registered."""


class BackendUnavailableError(AccelBackendError):
    """The backend is registered but cannot run here (missing package, driver or device)."""


class BackendRegistrationError(AccelBackendError):
    """A plugin registered something invalid, or two plugins registered the same backend name."""


class DistributedSetupError(AccelBackendError):
    """The distributed environment is incomplete or does not match the backend."""

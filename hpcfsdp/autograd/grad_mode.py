"""Grad mode: no_grad, enable_grad, set_grad_enabled, is_grad_enabled (thread-local, as PyTorch)."""
import functools
import threading

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode"]

_state = threading.local()


def is_grad_enabled():
    """Whether operations record a graph for backward in this thread."""
    return getattr(_state, "enabled", True)


def _set(mode):
    _state.enabled = bool(mode)


class _GradModeContext:
    """Base of the grad-mode context managers; instances also work as function decorators."""

    _mode = True

    def __new__(cls, *args, **kwargs):
        if cls is not set_grad_enabled and len(args) == 1 and callable(args[0]) and not kwargs:
            return cls()(args[0])  # bare decorator: @hp.no_grad
        return super().__new__(cls)

    def __enter__(self):
        self._prev = is_grad_enabled()
        _set(self._mode)
        return None

    def __exit__(self, *exc):
        _set(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.clone():
                return fn(*args, **kwargs)

        return wrapper

    def clone(self):
        return self.__class__()


class no_grad(_GradModeContext):  # noqa: N801
    """Context manager / decorator disabling graph recording."""

    _mode = False


class inference_mode(_GradModeContext):  # noqa: N801
    """``inference_mode(mode=True)``: grad recording off (as no_grad; no separate inference tensors here)."""

    def __init__(self, mode=True):
        self._mode = not mode

    def clone(self):
        return inference_mode(not self._mode)


class enable_grad(_GradModeContext):  # noqa: N801
    """Context manager / decorator enabling graph recording."""

    _mode = True


class set_grad_enabled(_GradModeContext):  # noqa: N801
    """``set_grad_enabled(mode)``: sets grad mode now (function form) and restores it on exit (context form)."""

    def __init__(self, mode):
        self._prev = is_grad_enabled()
        self._mode = bool(mode)
        _set(self._mode)

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        _set(self._prev)
        return False

    def clone(self):
        return self.__class__(self._mode)

    def __call__(self, fn):
        _set(self._prev)  # decorator use: do not leave the mode changed

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(self._mode):
                return fn(*args, **kwargs)

        return wrapper

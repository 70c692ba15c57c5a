"""Stateful: the protocol of objects that ``save``/``load`` checkpoint through their own state dicts."""
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Stateful", "StatefulT"]


@runtime_checkable
class Stateful(Protocol):
    """An object with ``state_dict()`` and ``load_state_dict(state_dict)``. A top-level value of the state
    dict passed to ``save``/``async_save`` that is Stateful is saved as its ``state_dict()``; ``load`` loads
    into a fresh ``state_dict()`` in place and hands the result to ``load_state_dict`` (as PyTorch's DCP)."""

    def state_dict(self) -> dict[str, Any]:
        """The object's state; also called by ``load`` to get the tensors to load into in place."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the object's state from ``state_dict``."""
        ...


StatefulT = TypeVar("StatefulT", bound=Stateful)

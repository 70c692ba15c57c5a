"""File helpers shared by the writers of user-facing files (a leaf: the standard library only)."""
import os

__all__ = ["honour_umask"]


def honour_umask(path) -> None:
    """Give ``path`` the mode a plain ``open(path, "w")`` would: 0o666 less the user's umask. safetensors'
    ``save_file`` writes 0o600 whatever the umask, so a consolidated or exported model would be unreadable to
    the user's group, unlike every other file they write."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)

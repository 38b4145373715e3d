"""Files of a subtask's working state in its local directory, written whole or not at all."""

from __future__ import annotations

import contextlib
import os


def write_atomically(path: str, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename, so a reader sees the old file or
    the new one, never a part.

    Raises:
        OSError: naming the file, also where the system's error does not (a full disk's
            ``[Errno 28] No space left on device`` names none, and the operator must know
            that it is the local directory, not checkpoint storage, that filled up). The
            temporary file is removed, giving back what it took.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, tmp) from err

"""Reading files that untrusted code may have made or replaced: regular files only, never
blocking, never more than a cap. The grader reads submissions and what each learner's process
leaves in its job folder through these."""

from __future__ import annotations

import errno
import os
import stat


class Unusable(ValueError):
    """What the submission's process left in its job folder cannot be used."""


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_regular(name: str, cap: int, dir_fd: int | None = None) -> bytes | None:
    """A regular file's bytes, at most `cap` of them; None where it does not exist.
    Links, pipes, devices and larger files raise Unusable; nothing here can block."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        what = "a link" if error.errno == errno.ELOOP else error.strerror
        raise Unusable(f"{os.path.basename(name)} cannot be opened ({what})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unusable(f"{os.path.basename(name)} is not a regular file")
        if info.st_size > cap:
            raise Unusable(f"{os.path.basename(name)} is larger than {cap // 1024} KiB")
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            raise Unusable(f"{os.path.basename(name)} is larger than {cap // 1024} KiB")
        return b"".join(chunks)
    finally:
        os.close(fd)

"""Copying a model file into the models folder (``import``): its own bytes, never the user's file.

A hard link shared the user's inode: a new download written over the original in place changed
or broke the imported model without a word, and the registry's size went stale. The copy is

- a reflink where the file system can share blocks copy-on-write (btrfs, XFS, bcachefs): instant,
  no space taken, and independent of the original from its first changed block;
- else ``os.copy_file_range``: the kernel copies (and may share blocks itself, as NFS 4.2 does),
  or a plain copy in 1 MB blocks where that is not available;
- refused up front, in one line with the sizes, when the disk cannot hold it.

It writes into a file the caller opened (``import`` uses ``atomic.atomic_writer``: a temporary
name renamed once all is in place, so an interrupted import never leaves a file that looks like
a model).
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import BinaryIO

from localchat.errors import UserError
from localchat.models.progress import ProgressCallback, format_bytes

_FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h: clone all of a file's blocks
_BLOCK = 1024 * 1024
# copy_file_range gives up on these where the two files cannot share a kernel copy.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


def copy_model_file(source: BinaryIO, target: BinaryIO, what: str,
                    progress: ProgressCallback | None = None) -> None:
    """Copy all of ``source`` into the empty ``target``; ``what`` names the copy in the
    not-enough-space error. ``progress(done, total)`` is told as the bytes go (not for a reflink,
    which takes no time). Raises UserError for a full disk or a failed read or write."""
    if _reflink(source, target):
        return
    size = os.fstat(source.fileno()).st_size
    stats = os.fstatvfs(target.fileno())
    free = stats.f_bavail * stats.f_frsize
    if size > free:
        raise UserError(f"not enough disk space to copy {what}: it needs {format_bytes(size)}, "
                        f"{format_bytes(free)} free")
    try:
        _copy(source, target, size, progress)
    except OSError as exc:
        full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise UserError(f"could not copy {what}: {exc.strerror or exc}{full}") from None


def _reflink(source: BinaryIO, target: BinaryIO) -> bool:
    try:
        fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
    except OSError:  # not this file system (EOPNOTSUPP, EINVAL), or two of them (EXDEV)
        return False
    return True


def _copy(source: BinaryIO, target: BinaryIO, size: int,
          progress: ProgressCallback | None) -> None:
    done = 0
    kernel = hasattr(os, "copy_file_range")
    src, dst = source.fileno(), target.fileno()
    while done < size:
        if kernel:
            try:
                n = os.copy_file_range(src, dst, min(size - done, 64 * _BLOCK))
            except OSError as exc:
                if exc.errno not in _NO_KERNEL_COPY or done:
                    raise
                kernel = False
                continue
        else:
            n = _copy_block(source, target)
        if n == 0:  # the file got shorter while we copied it
            raise OSError(errno.EIO, f"the file ended after {done:,} of {size:,} bytes")
        done += n
        if progress is not None:
            progress(done, size)


def _copy_block(source: BinaryIO, target: BinaryIO) -> int:
    block = source.read(_BLOCK)
    target.write(block)
    return len(block)

"""The node's state directory: where the apply lock and the journal live.

vgpuctl runs as root and writes these files, so nobody else may have a say in what they are:

- the directory is opened once (``O_DIRECTORY | O_NOFOLLOW``: it is not a link) and must be
  owned by the user vgpuctl runs as and not writable by group or others; else it is refused,
  naming it and saying what to do (whoever can write it could plant a link that vgpuctl,
  following it, would truncate and overwrite: ``/etc/shadow``, say);
- missing, it is created with mode 0700;
- each file is opened relative to that descriptor with ``O_NOFOLLOW`` (a rename of the path
  meanwhile cannot redirect it), and must be a regular file with no other hard link.

File names are built from the node name, so it is checked to be one plain file-name component.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from reconciler.model import ApplyError

# Kubernetes node names (RFC 1123 subdomains), with upper case and '_' tolerated for hosts.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def node_file(state_dir: Path, node: str, suffix: str) -> Path:
    """``<state_dir>/<node><suffix>`` (the node name checked; nothing is opened)."""
    if not _NODE_NAME.fullmatch(node):
        raise ApplyError(f"invalid node name {node!r}: expected a host or Kubernetes node name")
    return Path(state_dir) / f"{node}{suffix}"


def open_state_dir(state_dir: Path, *, create: bool = True) -> int:
    """A descriptor of the state directory (``O_RDONLY``: it can be fsynced), checked as the
    module says; created (mode 0700) when missing and ``create``. Raises ``ApplyError``, or
    ``FileNotFoundError`` when it is missing and not ``create``."""
    path = Path(state_dir)
    if create:
        try:
            # Only root's own apply runs belong here: the journal names devices and commands.
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            pass  # a dangling link, a file: opening it says what it is
        except OSError as e:
            raise ApplyError(f"cannot create state directory {path}: {e.strerror or e}") from e
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        if create:
            raise ApplyError(f"cannot open state directory {path}: it vanished") from None
        raise
    except OSError as e:
        if os.path.islink(path):
            raise ApplyError(
                f"state directory {path} is a symbolic link: vgpuctl does not follow one there "
                f"(whoever can change it can point vgpuctl's writes anywhere); give the real "
                f"directory, {os.path.realpath(path)}, as --state-dir"
            ) from None
        if e.errno == errno.ENOTDIR:
            raise ApplyError(f"state directory {path} is not a directory") from None
        raise ApplyError(f"cannot open state directory {path}: {e.strerror or e}") from e
    try:
        _check_owner_and_mode(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_owner_and_mode(path: Path, st: os.stat_result) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise ApplyError(
            f"state directory {path} is owned by uid {st.st_uid}, not by uid {me} that vgpuctl "
            "runs as: its owner could plant a link there that vgpuctl would write through; "
            f"make it yours (chown {me} {path}; chmod 700 {path}) or give another --state-dir"
        )
    writable = [
        who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit
    ]
    if writable:
        raise ApplyError(
            f"state directory {path} is writable by {' and '.join(writable)} (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): they could plant a link there that vgpuctl "
            f"would write through; chmod go-w {path} (700 is what vgpuctl creates), or give "
            "another --state-dir"
        )


def open_node_file(dir_fd: int, path: Path, flags: int) -> tuple[int, bool]:
    """Open ``path``'s name in the state directory ``dir_fd`` with ``flags`` (``O_CREAT``
    creates it mode 0600), never through a link; the descriptor, and whether it was created.

    Raises ``ApplyError`` for a link, anything but a regular file, a file with another hard
    link; ``FileNotFoundError`` when it is missing and not to be created."""
    name = path.name
    created = False
    # O_NONBLOCK: a FIFO planted in the file's place must not hold vgpuctl up (it is refused
    # below); on a regular file the flag changes nothing.
    flags |= os.O_NONBLOCK
    try:
        if flags & os.O_CREAT:
            try:
                fd = os.open(
                    name, flags | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd
                )
                created = True
            except FileExistsError:
                fd = os.open(name, (flags & ~os.O_CREAT) | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        else:
            fd = os.open(name, flags | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ApplyError(
                f"{path} is a symbolic link: vgpuctl never opens one in its state directory "
                "(it would write wherever the link points); remove it"
            ) from None
        if isinstance(e, FileNotFoundError):
            raise
        raise ApplyError(f"cannot open {path}: {e.strerror or e}") from e
    problem = _problem(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        raise ApplyError(f"{path} {problem}; remove it (vgpuctl makes a new one)")
    return fd, created


def replace_node_file(dir_fd: int, path: Path, new_path: Path, *, opened: os.stat_result) -> None:
    """Rename ``path``'s name to ``new_path``'s in the state directory ``dir_fd``, replacing
    that file, and make the rename durable (the directory is synced).

    ``opened`` is the ``fstat`` of ``path`` as :func:`open_node_file` checked it: the name must
    still be that file (a rename works on names, so nothing is followed; the check keeps it to
    the file that was vetted). The file replaced, when there is one, must pass the same checks
    (a regular file, one link). Raises ``ApplyError`` otherwise, or when the rename fails."""
    try:
        now = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
            raise ApplyError(f"{path} was replaced while vgpuctl had it open; run again")
        try:
            there = os.stat(new_path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            problem = _problem(there)
            if problem is not None:
                raise ApplyError(f"{new_path} {problem}; remove it (vgpuctl makes a new one)")
        os.rename(path.name, new_path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as e:
        raise ApplyError(f"cannot rename {path} to {new_path}: {e.strerror or e}") from e


def _problem(st: os.stat_result) -> str | None:
    """What is wrong with a file in the state directory, or ``None``."""
    if stat.S_ISLNK(st.st_mode):
        return (
            "is a symbolic link: vgpuctl never opens one in its state directory (it would "
            "write wherever the link points)"
        )
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink != 1:
        return (
            f"has {st.st_nlink} hard links: another name for it may be a file vgpuctl must not "
            "write"
        )
    return None

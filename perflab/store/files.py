"""Files that never clobber: atomic rewrites that honour the umask and keep a file's mode and
group, appends that always start on a fresh line, and up-front checks of every output path.

Rules: never replace what is not a regular file (a device, a FIFO, a directory); write
*through* a symlink to its target; a new file gets the usual 0666 & ~umask; a rewritten file
keeps the mode and group it had. A file a command is told to write (``results export FILE``,
``report -o FILE``, ``compare --plot DIR``'s images) replaces only a file perflab wrote
(:func:`check_replace`): never one of the user's, nor one perflab wrote as truth (a run's
results.csv: :func:`check_file` asks ``layout.truth``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from perflab.errors import ConfigError
from perflab.store import layout

_KINDS = {
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a FIFO",
    stat.S_ISSOCK: "a socket",
    stat.S_ISDIR: "a directory",
}


def kind_of(path: Path) -> str:
    """``a regular file``, ``missing``, or what else sits at ``path`` (symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:  # a parent on the way is a file
        return "missing"
    except OSError as err:  # a name too long, a link loop, a dead network mount
        return f"unreachable ({err.strerror})"
    return _kind(mode)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS.items() if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The regular file at ``path`` (symlinks followed), open for reading; OSError for anything
    else there: a FIFO would block its reader forever, a device never end. Opened without
    blocking, then checked, so nothing waits for a writer that never comes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    f = os.fdopen(fd, "rb")
    kind = _kind(os.fstat(fd).st_mode)
    if kind != "a regular file":
        f.close()
        raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
    return f


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at ``path``; OSError for anything else (see open_regular).
    Every file perflab reads is read through this (or open_regular): no input path can block."""
    with open_regular(path) as f:
        return f.read()


def read_text(path: str | os.PathLike) -> str:
    """The text of the regular file at ``path`` (UTF-8); OSError for anything else."""
    return read_regular(path).decode()


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in the regular file at ``path``; OSError for anything else there, ValueError for
    what is not JSON, one nested too deeply included (Python's parser recurses: a RecursionError
    would be a traceback, not an answer). Every JSON file perflab reads is read through this."""
    data = read_regular(path)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply to be read") from None


def not_regular(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (``a FIFO``, ``unreachable (Too many levels of
    symbolic links)``...), or None for a regular file or a missing one: the one-line check of
    an input path before it is read."""
    kind = kind_of(path)
    return None if kind in ("a regular file", "missing") else kind


def not_a_folder(path: Path) -> str | None:
    """Why ``path`` cannot be a folder to read from (a FIFO, a file, a symlink loop, no
    permission), or None for a readable folder or a missing one."""
    kind = kind_of(path)
    if kind == "missing":
        return None
    if kind != "a directory":
        return f"{kind}, not a folder"
    try:  # tried for real (as this process's effective user): no permission, a dead mount
        with os.scandir(path):
            pass
    except OSError as err:
        return f"cannot read it ({err.strerror})"
    return None


def target(path: Path) -> Path:
    """Where writing ``path`` lands: the end of its symlink chain (so the link itself survives)."""
    return Path(os.path.realpath(path))


def in_flight(path: Path) -> bool:
    """A :func:`write_atomic` temp file: another writer's file on its way in, never to be removed
    by a clean-up (its rename would then fail)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path``'s content at once: write a temp file beside it, then rename.

    Readers see the old file or the new one, never half. Refuses (OSError) to replace a
    non-regular file. A new file honours the umask; an existing one keeps its mode and group.
    """
    path = target(path)
    kind = kind_of(path)
    if kind not in ("a regular file", "missing"):
        raise IsADirectoryError(f"{path}: {kind}, not a regular file; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.stat() if kind == "a regular file" else None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0666 & ~umask
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
            if old.st_gid != os.stat(tmp).st_gid:
                with contextlib.suppress(PermissionError):  # not in that group: the mode is still kept
                    os.chown(tmp, -1, old.st_gid)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno is not None and err.filename in (None, str(tmp)):  # name our file, not the temp one
            raise type(err)(err.errno, err.strerror, str(path)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """An OSError raised within names ``path`` where it names no file: a write or fsync that
    fails for a full disk or an I/O error says only ``[Errno 28] No space left on device``."""
    try:
        yield
    except OSError as err:
        if err.errno is not None and err.filename is None:
            raise type(err)(err.errno, err.strerror, str(path)) from None
        raise


def remove_made(folder: Path, names: Iterable[str]) -> None:
    """Remove what perflab (or Hydra) made in ``folder``: the files ``names`` (paths inside it),
    then each folder left empty, ``folder`` last. Nothing else is touched: a user's file there
    (``hydra.run.dir`` aimed at a folder of theirs) stays, and so does the folder holding it."""
    folder = Path(folder)
    for name in names:
        path = folder / name
        if kind_of(path) == "a regular file" or path.is_symlink():  # a link itself, never its target
            with contextlib.suppress(OSError):
                path.unlink()
    for sub in sorted({(folder / n).parent for n in names}, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: something of the user's is there
            sub.rmdir()


def os_line(err: OSError) -> str:
    """An OSError in one line naming its file: ``outputs/runs/x/results.csv: No space left on device``."""
    return f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)


# A write that failed for want of room, not for a wrong path: the disk or the quota is full.
FULL = (errno.ENOSPC, errno.EDQUOT)


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Overwrite an existing small file within the blocks it already holds: what still works
    on a full disk, where write_atomic cannot get a block for its temp file. Not atomic: only
    for a record whose reader takes a half-written one as unreadable (run.json: not done)."""
    with naming(path), open(target(path), "r+b") as f:
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


def append_text(path: Path, text: str, header: str = "") -> None:
    """Append ``text`` in one write; ``header`` first if the file is new or empty.

    If the file does not end with a newline (a torn write: disk full, a killed writer), a
    newline goes first, so the torn line stays one bad line instead of gluing onto ours.
    """
    path = target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        prefix = b""
        if size == 0:
            prefix = header.encode()
        else:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                prefix = b"\n"
        with naming(path):  # a full disk names no file
            f.write(prefix + text.encode())
            f.flush()


def check_dir(key: str, path: Path, shown: str | None = None) -> None:
    """``path`` is (or can become) a directory this process can write into; else one line.

    Tried for real (a probe file created and removed), so a read-only mount, a full quota or
    missing permissions are found before anything is measured, whoever runs it.
    """
    value = shown if shown is not None else str(path)
    probe = path
    while kind_of(probe) == "missing" and probe.parent != probe:
        probe = probe.parent
    if kind_of(probe).startswith("unreachable"):
        raise ConfigError(key, value, "a path this machine can reach", problem=f"{kind_of(probe)}")
    if not probe.is_dir():
        raise ConfigError(
            key, value, "a path whose folders are (or can become) directories", problem=f"{probe} is {kind_of(probe)}"
        )
    name = probe / f".perflab-probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:  # a byte written for real: a full disk still lets an empty file be made
            os.write(fd, b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        with contextlib.suppress(OSError):  # made but not written (a full disk); a read-only one made none
            name.unlink()
        raise ConfigError(
            key, value, "a place you can write to", problem=f"cannot write in {probe} ({err.strerror})"
        ) from None
    name.unlink(missing_ok=True)


def check_file(key: str, path: Path, allowed: str) -> bool:
    """``path`` is a regular file we can rewrite, or a new file in a writable place.

    Returns whether it exists. Symlinks are followed (the target is what gets written). Never
    a place that holds perflab's truth (a run dir's files, a sweep dir's, ``.perflab/``): the
    one rule (layout.truth) that every output path asks, here.
    """
    why = layout.truth(path)
    if why:
        raise ConfigError(key, str(path), allowed, problem=why)
    real = target(path)
    kind = kind_of(real)
    if kind == "missing":
        check_dir(key, real.parent, shown=str(path))
        return False
    if kind != "a regular file":
        raise ConfigError(key, str(path), allowed, problem=f"{kind}, not a regular file")
    try:
        with open(real, "ab"):
            pass
    except OSError as err:
        raise ConfigError(key, str(path), allowed, problem=f"cannot write it ({err.strerror})") from None
    check_dir(key, real.parent, shown=str(path))  # an atomic rewrite needs a temp file beside it
    return True


def check_replace(key: str, path: Path, is_ours: Callable[[Path], bool], allowed: str) -> bool:
    """The rule for every output file a command names: a new file in a writable place, or a
    file perflab wrote earlier (``is_ours`` judges what a symlink points to), replaced whole.
    A user's file, a device, a folder: one line, nothing touched. Returns whether it exists."""
    if not check_file(key, path, allowed):
        return False
    try:
        ours = is_ours(target(path))
    except OSError:
        ours = False
    if not ours:
        raise ConfigError(key, str(path), allowed, problem="exists and is not a file perflab wrote")
    return True


def holds(path: Path, marks: Iterable[bytes], head: int = 4096, tail: int = 0) -> bool:
    """Whether any of ``marks`` is in the first ``head`` (or last ``tail``) bytes of ``path``."""
    with open(path, "rb") as f:
        start = f.read(head)
        end = b""
        if tail:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail))
            end = f.read(tail)
    return any(m in start or m in end for m in marks)

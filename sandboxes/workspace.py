"""The host side of a sandbox's writable storage: a size-limited tmpfs per sandbox.

Layout on the host (``SANDBOXES_ROOT``, default ``/dev/shm/sandboxes`` for root where /dev/shm
is a tmpfs, else ``/tmp/sandboxes``)::

    <root>/<name>/        tmpfs, size = disk_mb, inodes = disk_mb * 256 (mode 0711, root)
    <root>/<name>/work    the sandbox's /work (owned by the sandbox uid)
    <root>/<name>/tmp     the sandbox's /tmp

One tmpfs holds both, so ``disk_mb`` bounds everything the sandbox can write and the inode
cap bounds "a million small files". Mounting needs root; without it the workspace is a plain
directory (only RLIMIT_FSIZE fences it), which is the ``disk_limit`` defence going missing.

The host reads and writes these files as root while the sandbox's code put them there, so
every access walks the path one component at a time with ``O_NOFOLLOW`` (a symlink planted by
the sandbox is refused, never followed) and only regular files are read or written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

from sandboxes.errors import SandboxError, SandboxPathError
from sandboxes.spec import TMP_DIR, WORK_DIR, relative_sandbox_path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
INODES_PER_MB = 256

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


#: The default root on disk (before 2026-12-05 the only default; still the one without root).
DISK_ROOT = Path("/tmp/sandboxes")  # noqa: S108


def sandboxes_root() -> Path:
    configured = os.environ.get("SANDBOXES_ROOT")
    return Path(configured) if configured else _default_root()


def roots_to_reap() -> list[Path]:
    """The root, and the disk root too while the default is elsewhere: an owner that ran older
    code and died left its workspaces there."""
    root = sandboxes_root()
    if "SANDBOXES_ROOT" in os.environ or root == DISK_ROOT:
        return [root]
    return [root, DISK_ROOT]


@functools.lru_cache(maxsize=1)
def _default_root() -> Path:
    """A directory on a memory filesystem when the machine has one (/dev/shm).

    Each sandbox's tmpfs is mounted on a directory of its own under the root, made and
    removed with the sandbox. On a disk filesystem that rmdir is a journalled metadata change:
    1.5 ms measured here (ext4 with ``discard``), the largest single host-side cost of closing
    a sandbox; on a tmpfs it is microseconds. The root holds only these empty mount points and
    the sandboxes' copied /etc (~1 MB), so it costs next to no memory. Only for root: without
    root no tmpfs can be mounted, the sandboxes' files would sit in the root itself, and
    /dev/shm is memory (64 MB in a default container).
    """
    if os.geteuid() != 0:
        return DISK_ROOT
    shm = "/dev/shm"  # noqa: S108 - planted entries are refused as in /tmp (ensure_private_dir)
    try:
        with open("/proc/self/mounts") as mounts:
            shm_is_tmpfs = any(line.split()[1:3] == [shm, "tmpfs"] for line in mounts)
    except OSError:
        shm_is_tmpfs = False
    if shm_is_tmpfs and os.access(shm, os.W_OK | os.X_OK):
        return Path(shm) / "sandboxes"
    return DISK_ROOT


def ensure_private_dir(path: Path) -> None:
    """Creates ``path`` or checks it is a real directory of ours.

    The default roots sit in world-writable /tmp and /var/tmp, where anyone could have planted
    a symlink or a directory of their own under the same name before us.
    """
    path.mkdir(parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise SandboxError(f"{path} is not a plain directory (a planted symlink?): refusing")
    if info.st_uid != os.geteuid():
        raise SandboxError(f"{path} belongs to uid {info.st_uid}, not to us: refusing")


def ensure_root(root: Path) -> None:
    ensure_private_dir(root)
    os.chmod(root, 0o711)  # noqa: S103 - the sandbox uid may pass through, never list other sandboxes


def mount_tmpfs(target: Path, options: str) -> None:
    result = _libc.mount(
        b"tmpfs", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


def unmount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
            raise OSError(code, os.strerror(code), str(target))


def is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


class Workspace:
    def __init__(self, root: Path, name: str, disk_mb: int, uid: int | None, gid: int | None):
        self.path = root / name
        self.disk_mb = disk_mb
        self.uid = uid
        self.gid = gid
        self.limited = False
        #: (free blocks, free inodes) of the empty tmpfs, right after it was made.
        self._empty: tuple[int, int] | None = None
        self._created_ns = 0

    @property
    def work(self) -> Path:
        return self.path / "work"

    @property
    def tmp(self) -> Path:
        return self.path / "tmp"

    @property
    def shm(self) -> Path:
        """The sandbox's /dev/shm: on the same tmpfs, so ``disk_mb`` bounds it too."""
        return self.path / "shm"

    @property
    def writable_dirs(self) -> tuple[Path, ...]:
        return (self.work, self.tmp, self.shm)

    def create(self) -> str | None:
        """Creates the storage; returns why the size limit is missing, or None."""
        ensure_root(self.path.parent)
        self.path.mkdir(mode=0o711)
        missing = None
        try:
            mount_tmpfs(
                self.path,
                f"size={self.disk_mb}m,nr_inodes={self.disk_mb * INODES_PER_MB},mode=0711",
            )
            self.limited = True
        except OSError as exc:
            missing = f"cannot mount a size-limited tmpfs: {exc.strerror}"
        for sub in self.writable_dirs:
            sub.mkdir(mode=0o700)
            if self.uid is not None and self.gid is not None:
                os.chown(sub, self.uid, self.gid)
        # One time for all of them, which a reset puts back: made one after another, they can
        # straddle a clock tick, and a recycled sandbox must look exactly like a fresh one.
        self._created_ns = os.lstat(self.work).st_mtime_ns
        for sub in self.writable_dirs:
            os.utime(sub, ns=(self._created_ns, self._created_ns), follow_symlinks=False)
        if self.limited:
            usage = os.statvfs(self.path)
            self._empty = (usage.f_bfree, usage.f_ffree)
        return missing

    def reset(self) -> None:
        """Makes /work, /tmp and /dev/shm as they were when created, and proves it.

        For a recycled sandbox, with none of its processes left: every entry removed, and the
        directories themselves (bind-mounted into the sandbox, so they stay) get back their
        owner, mode and times, with every extended attribute and ACL removed. Then the tmpfs
        must be exactly as full as when it was made (free blocks and inodes: a file still held
        somewhere, or hidden anywhere on it, shows) and each directory empty and as created.
        Raises SandboxError otherwise.
        """
        if self._empty is None:
            raise SandboxError("the workspace has no tmpfs of its own to check")
        for sub in self.writable_dirs:
            if not stat.S_ISDIR(os.lstat(sub).st_mode):
                raise SandboxError(f"{sub} is no longer a directory")
            for attribute in os.listxattr(sub, follow_symlinks=False):
                os.removexattr(sub, attribute, follow_symlinks=False)
        self.clear()
        for sub in self.writable_dirs:
            os.utime(sub, ns=(self._created_ns, self._created_ns), follow_symlinks=False)
        usage = os.statvfs(self.path)
        if (usage.f_bfree, usage.f_ffree) != self._empty:
            raise SandboxError(
                f"the workspace is not empty after clearing (free blocks, inodes: "
                f"{usage.f_bfree}, {usage.f_ffree}; empty: {self._empty})"
            )
        for sub in self.writable_dirs:
            info = os.lstat(sub)
            owner = (info.st_uid, info.st_gid)
            if (
                info.st_mode != stat.S_IFDIR | 0o700
                or info.st_nlink != 2
                or (self.uid is not None and owner != (self.uid, self.gid))
                or os.listdir(sub)
                or os.listxattr(sub, follow_symlinks=False)
            ):
                raise SandboxError(f"{sub} is not as created after clearing")

    def clear(self) -> None:
        """Empties /work, /tmp and /dev/shm (no process of the sandbox may be running).

        The directories themselves stay (they are mount points inside the sandbox) and get
        their owner and mode back, whatever the last program did to them. ``rmtree`` works
        through directory descriptors, so a symlink planted inside is removed, never followed.
        """
        for sub in self.writable_dirs:
            info = os.lstat(sub)
            if not stat.S_ISDIR(info.st_mode):
                raise SandboxError(f"{sub} is no longer a directory")
            os.chmod(sub, 0o700)
            if self.uid is not None and self.gid is not None:
                os.chown(sub, self.uid, self.gid)
            with os.scandir(sub) as entries:
                names = [entry.name for entry in entries]
            for name in names:
                path = sub / name
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)

    def remove(self) -> None:
        if self.limited or is_mount_point(self.path):
            unmount(self.path)
            self.limited = False
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
            if self.path.exists():
                raise SandboxError(f"cannot remove workspace {self.path}")

    # -- files --------------------------------------------------------------------------------
    def _open(self, path: str, flags: int, create_dirs: bool = False) -> int:
        try:
            relative = relative_sandbox_path(path)
        except ValueError as exc:
            raise SandboxPathError(f"{path!r}: {exc}") from exc
        parts = relative.split("/")
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                if create_dirs:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if self.uid is not None and self.gid is not None:
                            os.chown(part, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass
                next_fd = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
                os.close(fd)
                fd = next_fd
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise SandboxPathError(f"{path!r}: crosses a symlink or a non-directory") from exc
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path) from exc
            if exc.errno == errno.ENOSPC:
                raise SandboxError(f"{path!r}: the sandbox's disk is full") from exc
            raise
        finally:
            os.close(fd)

    def is_dir(self, path: str) -> bool:
        """True for /work, /tmp or a real directory under them (symlinks are not followed)."""
        if path.rstrip("/") in (WORK_DIR, TMP_DIR):
            return True
        try:
            fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
        except (OSError, SandboxPathError):
            return False
        os.close(fd)
        return True

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        fd = self._open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, create_dirs=True
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxPathError(f"{path!r} is not a regular file")
            if self.uid is not None and self.gid is not None:
                os.fchown(fd, self.uid, self.gid)
            view = memoryview(data)
            while view:
                try:
                    written = os.write(fd, view)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EFBIG):
                        raise SandboxError(f"{path!r}: the sandbox's disk is full") from exc
                    raise
                view = view[written:]
        finally:
            os.close(fd)

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        fd = self._open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"{path!r} is not a regular file")
            if limit is not None and info.st_size > limit:
                raise SandboxError(f"{path!r} is {info.st_size} bytes, over the {limit} limit")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    # -- archives -----------------------------------------------------------------------------
    def archive(self) -> bytes:
        """A tar of /work (symlinks stored as links, never followed)."""
        buffer = io.BytesIO()

        def plain_only(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
            # FIFOs, sockets and device nodes are runtime debris, not state worth restoring.
            return member if member.isfile() or member.isdir() or member.issym() else None

        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for entry in sorted(os.listdir(self.work)):
                tar.add(self.work / entry, arcname=entry, recursive=True, filter=plain_only)
        return buffer.getvalue()

    def extract(self, archive: bytes) -> None:
        """Unpacks a /work archive, refusing members that would land outside /work."""
        work = str(self.work)

        def only_plain_members(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
            if not (member.isfile() or member.isdir() or member.issym()):
                raise SandboxError(f"snapshot member {member.name!r}: only files, dirs, symlinks")
            filtered = tarfile.tar_filter(member, dest)
            if filtered is None:
                return None
            if self.uid is not None and self.gid is not None:
                filtered = filtered.replace(uid=self.uid, gid=self.gid, uname="", gname="")
            return filtered

        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                tar.extractall(work, filter=only_plain_members)  # noqa: S202 - filtered
        except (tarfile.TarError, OSError) as exc:
            raise SandboxError(f"cannot restore the work directory: {exc}") from exc

"""The sandbox's launcher: run one command in fresh Linux namespaces with a read-only, allow-listed root.

Run as a script (``python -I -S jail.py SPEC.json``; standard library only, so it starts in tens of
milliseconds and imports nothing from the repository under test). The spec is written by
:class:`aml_ray.coding.sandbox.SubprocessSandbox`; its keys are read in :func:`main`.

What it sets up, in order (the sources are the kernel's ``user_namespaces(7)``, ``pid_namespaces(7)``,
``mount_namespaces(7)``, ``pivot_root(2)``, ``setrlimit(2)`` manual pages; bubblewrap does the same):

1. The launcher forks a child that calls ``unshare(USER | MOUNT | PID | NET | IPC | UTS)``: a user
   namespace, a private mount table, a new pid namespace, a network namespace holding only a loopback
   device, private System V IPC and host name.
2. The launcher, still in the host's namespaces, writes the child's uid/gid maps: uid/gid 1000 inside
   is the caller outside, or ``nobody`` (65534) when the caller is host root (then inside 0 is host
   root too, used by pid 1's set-up only). The command always runs as 1000, so when started by root
   the sandbox's user is nobody on the host: the host's files are "other" to it, and ``RLIMIT_NPROC``
   applies (the kernel never applies it to host root). Host root's supplementary groups are dropped.
3. The child forks pid 1 of the new pid namespace. When pid 1 exits, the kernel kills every process
   left in the namespace (``setsid`` double forks included); pid 1 and the child die with their
   parent (``PR_SET_PDEATHSIG``), so killing the launcher's process group ends everything.
4. pid 1 builds the new root on a tmpfs: read-only bind mounts of the allow-listed host paths
   (``/usr``, ``/lib*``, the interpreter's prefixes, a few files of ``/etc``), a synthetic
   ``/etc/passwd``, ``/etc/group`` and ``/etc/hosts``, ``/dev`` with null, zero, full, random and
   urandom only, a private ``/tmp``, ``/dev/shm`` and home (tmpfs), a fresh ``/proc`` showing only the
   sandbox's processes (left empty when the host forbids mounting one), a copy of the launcher folder at
   ``/sandbox/plugin`` (read-only with the root), and the task's copy at ``/testbed``: a tmpfs of ``disk_bytes`` into which the
   host's copy is copied, so everything the tests write there counts against one size (the disk
   quota), and no host path shows in ``/proc/self/mountinfo`` for it. Then ``pivot_root`` and the old
   root detached, and the new root itself remounted read-only. Nothing else of the host is reachable.
5. pid 1 brings the loopback device up, forks the command with ``RLIMIT_AS``, ``RLIMIT_FSIZE``,
   ``RLIMIT_CORE = 0`` and ``RLIMIT_NPROC`` (counted in the new user namespace: only the sandbox's
   processes), ``PR_SET_NO_NEW_PRIVS``, the given environment only, and fd 3 the write end of a pipe
   (the results channel, see :mod:`aml_ray.coding.boot`). The command runs as uid 1000 with no
   capabilities (``execve`` by a non-zero uid clears them), so it cannot undo the mounts.
6. Until the command exits, pid 1 reaps orphans, copies the pipe into the host's results file (the
   ``results_fd`` the host opened; the command never holds it, so it cannot rewrite what was already
   relayed), at most ``results_cap`` bytes plus one, and, when ``watch_memory`` is set and ``/proc`` is
   fresh, sums the proportional set size (``Pss`` of ``/proc/<pid>/smaps_rollup``) of every process
   of the sandbox every 0.1 s: above ``memory_bytes`` it kills them all and records
   ``{"stage": "memory_limit", ...}`` in the status file. This bounds the sandbox's total memory where
   no cgroup can be had; allocation between two polls can overshoot by what the tests allocate in
   0.1 s, and each process is also held to ``RLIMIT_AS``.

Exit status: the command's (128 + signal when killed). A setup failure writes one JSON object
``{"stage": ..., "error": ...}`` to the spec's ``status_file`` and exits with status 97; a finished
setup writes ``{"stage": "ready", "proc": "fresh" | "empty"}`` there before the command starts; later
lines record limits that struck (``memory_limit``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import select
import shutil
import signal
import socket
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SETUP_FAILED = 97
INNER_UID = INNER_GID = 1000
NOBODY = 65534
_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41}
# statvfs flags -> mount flags a remount must keep (the kernel locks them in a user namespace)
_KEEP = ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME), (2048, MS_NODIRATIME),
         (4096, MS_RELATIME))

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


class SetupError(Exception):
    """One setup step failed; ``stage`` names it."""

    def __init__(self, stage: str, error: str):
        super().__init__(f"{stage}: {error}")
        self.stage, self.error = stage, error


def _check(rc: int, stage: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(stage, f"{errno.errorcode.get(err, err)} ({os.strerror(err)})")


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None, stage: str) -> None:
    _check(_libc.mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), stage)


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _bind_ro(src: str, dst: str) -> None:
    """Bind ``src`` at ``dst`` (non-recursive: submounts stay hidden) and remount it read-only."""
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst):
            open(dst, "wb").close()
    _mount(src, dst, None, MS_BIND, None, f"bind {src}")
    keep = 0
    flags = os.statvfs(dst).f_flag
    for st, ms in _KEEP:
        if flags & st:
            keep |= ms
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | keep, None, f"read-only {src}")


def _copy_repo(src: str, dst: str, size: int) -> None:
    """The task's copy on its own tmpfs of ``size`` bytes, owned by the sandbox's user (step 4)."""
    os.makedirs(dst, exist_ok=True)
    _mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={size},uid={INNER_UID},gid={INNER_GID}",
           "tmpfs /testbed")
    try:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        for dirpath, dirnames, filenames in os.walk(dst):
            for name in (*dirnames, *filenames):
                os.lchown(os.path.join(dirpath, name), INNER_UID, INNER_GID)
    except (OSError, shutil.Error) as exc:
        raise SetupError("copy the repository into /testbed",
                         f"{exc}; the copy needs more than disk_bytes={size}: raise SandboxConfig.disk_mb") from None


def _replicate(path: str, root: str) -> None:
    """A top-level host path inside the new root: the same symlink (merged /usr), or a read-only bind."""
    target = root + path
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
    elif os.path.exists(path):
        _bind_ro(path, target)


def _private_tmpfs(root: str, path: str, mode: str, spec: dict) -> None:
    """A tmpfs of ``spec['tmp_mb']`` MiB at ``root + path``, owned by the sandbox's user."""
    os.makedirs(root + path, exist_ok=True)
    _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode={mode},size={spec['tmp_mb']}m,uid={INNER_UID},gid={INNER_GID}", f"tmpfs {path}")


def _build_root(spec: dict) -> str:
    """Steps 4 (module docstring): the new root at ``spec['root']``; returns ``"fresh"`` or ``"empty"`` /proc."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make / private")
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m", "tmpfs root")
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        _replicate(top, root)
    # the private /tmp and home first: an interpreter prefix under /tmp (a venv in a /tmp checkout) is
    # then bound on top of the private /tmp instead of being hidden by it
    _private_tmpfs(root, "/tmp", "1777", spec)
    _private_tmpfs(root, "/home/sandbox", "0700", spec)
    for path in spec["readonly"]:
        if os.path.exists(path) and not os.path.exists(root + path):
            _bind_ro(path, root + path)
    for path in spec["etc"]:
        if os.path.exists(path):
            _bind_ro(path, root + path)
    os.makedirs(root + "/etc", exist_ok=True)
    _write(root + "/etc/passwd", f"sandbox:x:{INNER_UID}:{INNER_GID}:sandbox:/home/sandbox:/bin/sh\n")
    _write(root + "/etc/group", f"sandbox:x:{INNER_GID}:\n")
    _write(root + "/etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")
    _write(root + "/etc/hostname", "sandbox\n")
    dev = root + "/dev"
    os.makedirs(dev)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m", "tmpfs /dev")
    for node in ("null", "zero", "full", "random", "urandom"):
        open(f"{dev}/{node}", "wb").close()
        _mount(f"/dev/{node}", f"{dev}/{node}", None, MS_BIND, None, f"bind /dev/{node}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    _private_tmpfs(root, "/dev/shm", "1777", spec)
    _copy_repo(spec["repo"], root + "/testbed", spec["disk_bytes"])
    os.makedirs(root + "/sandbox/plugin")  # copied, not bound: no host path in the sandbox's mount table
    for name in os.listdir(spec["plugin"]):
        shutil.copyfile(os.path.join(spec["plugin"], name), os.path.join(root, "sandbox/plugin", name))
    os.makedirs(root + "/proc")
    proc = "fresh"
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount /proc")
    except SetupError:
        proc = "empty"  # the host hides parts of its /proc (a container): leave /proc empty, never the host's
    os.makedirs(root + "/.oldroot")
    nr = _PIVOT_ROOT.get(platform.machine().lower())
    if nr is None:
        raise SetupError("pivot_root", f"no pivot_root syscall number known for {platform.machine()}")
    _check(_libc.syscall(nr, _b(root), _b(root + "/.oldroot")), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.oldroot", MNT_DETACH), "detach the old root")
    os.rmdir("/.oldroot")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=16m", "read-only root")
    return proc


def _loopback_up() -> None:
    """``ip link set lo up`` through SIOCSIFFLAGS (no ``ip`` binary needed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), 0x8913, req))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH22x", b"lo", flags | 0x1 | 0x40))  # IFF_UP|IFF_RUNNING


def _exec_command(spec: dict, channel: int) -> None:
    """The grandchild: the results pipe at fd 3, limits, no new privileges, then execve (never returns)."""
    import resource

    if channel != 3:
        os.dup2(channel, 3)
        os.close(channel)
    os.set_inheritable(3, True)
    for name, value in (("RLIMIT_AS", spec["memory_bytes"]), ("RLIMIT_FSIZE", spec["file_size_bytes"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", spec["pids"])):
        resource.setrlimit(getattr(resource, name), (value, value))
    os.setresgid(INNER_GID, INNER_GID, INNER_GID)
    os.setresuid(INNER_UID, INNER_UID, INNER_UID)  # drops every capability on execve
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.chdir("/testbed")
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _init(spec: dict, status_fd: int) -> int:
    """pid 1: build the root, start the command, relay and watch until it exits; returns its status."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(PR_SET_DUMPABLE, 0)
    proc = _build_root(spec)
    _loopback_up()
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")
    os.write(status_fd, json.dumps({"stage": "ready", "proc": proc}).encode() + b"\n")
    channel_r, channel_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(channel_r)
            _exec_command(spec, channel_w)
        except BaseException as exc:  # noqa: BLE001 - report why the command could not start
            os.write(2, f"aml-sandbox: cannot start {spec['argv'][0]}: {exc}\n".encode())
        os._exit(127)
    os.close(channel_w)
    relay = _Relay(channel_r, spec["results_fd"], spec["results_cap"])
    watch = spec["watch_memory"] and proc == "fresh"
    next_check = 0.0
    while True:
        if select.select([channel_r] if relay.open else [], [], [], 0.05)[0]:
            relay.pump()
        while True:  # pid 1 reaps every orphan; when the command exits, the kernel kills the rest
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 1
            if done == 0:
                break
            if done == pid:
                relay.drain()
                return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if watch and time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.1
            used = _sandbox_pss()
            if used > spec["memory_bytes"]:
                os.kill(-1, signal.SIGKILL)  # every process of the namespace but pid 1
                os.write(status_fd, json.dumps({"stage": "memory_limit", "pss_bytes": used,
                                                "limit_bytes": spec["memory_bytes"]}).encode() + b"\n")
                watch = False


class _Relay:
    """Copies the results pipe into the host's file, at most ``cap`` + 1 bytes (step 6)."""

    def __init__(self, src: int, dst: int, cap: int):
        self.src, self.dst, self.left, self.open = src, dst, cap + 1, True
        os.set_blocking(src, False)

    def pump(self) -> bool:
        """Copy what is waiting; False at end of file or when nothing is waiting."""
        if not self.open:
            return False
        try:
            data = os.read(self.src, 65536)
        except BlockingIOError:
            return False
        if not data:
            self.open = False
            return False
        if self.left > 0:
            os.write(self.dst, data[:self.left])
            self.left -= min(len(data), self.left)
        return True

    def drain(self) -> None:
        """Copy what is left once the command has exited (a forked child may still hold the pipe)."""
        while self.pump():
            pass


def _sandbox_pss() -> int:
    """Bytes of proportional set size of every process in this pid namespace but pid 1."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            with open(f"/proc/{entry}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return total


def host_root() -> bool:
    """Whether this process is root of the host's user namespace (not root of a nested one)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map", "rb") as fh:
            return fh.read().split() == [b"0", b"0", b"4294967295"]
    except OSError:
        return False


def _maps(child: int) -> None:
    """Step 2's maps, written by the launcher (still in the host's namespaces) for ``child``."""
    uid, gid = os.geteuid(), os.getegid()
    if host_root():  # inside 0 stays host root for pid 1's set-up only; the command runs as 1000 -> nobody
        umap, gmap = f"0 0 1\n{INNER_UID} {NOBODY} 1\n", f"0 0 1\n{INNER_GID} {NOBODY} 1\n"
    else:
        umap, gmap = f"{INNER_UID} {uid} 1\n", f"{INNER_GID} {gid} 1\n"
    try:
        _write(f"/proc/{child}/setgroups", "deny")
        _write(f"/proc/{child}/uid_map", umap)
        _write(f"/proc/{child}/gid_map", gmap)
    except OSError as exc:
        raise SetupError("map the sandbox user", str(exc)) from None


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str]) -> int:
    """Steps 1-3 (module docstring); returns the exit status."""
    with open(argv[1], "rb") as fh:
        spec = json.loads(fh.read())
    os.set_inheritable(spec["results_fd"], False)  # the command must never hold the host's file
    status_fd = os.open(spec["status_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

    def fail(exc: SetupError) -> int:
        os.write(status_fd, json.dumps({"stage": exc.stage, "error": exc.error}).encode() + b"\n")
        return SETUP_FAILED

    if host_root():
        os.setgroups([])  # host root's supplementary groups must not reach the sandbox
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # the namespaces' owner
        os.close(ready_r)
        os.close(go_w)
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
                                 | CLONE_NEWUTS), "unshare(user, mount, pid, net, ipc, uts namespaces)")
        except SetupError as exc:
            os._exit(fail(exc))
        os.write(ready_w, b"u")
        if os.read(go_r, 1) != b"g":
            os._exit(SETUP_FAILED)  # the launcher could not map the user (it wrote why)
        init = os.fork()
        if init == 0:
            try:
                code = _init(spec, status_fd)
            except SetupError as exc:
                code = fail(exc)
            except OSError as exc:
                code = fail(SetupError("prepare the root", str(exc)))
            os._exit(code)
        os.close(status_fd)
        os._exit(_wait(init))
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":
        try:
            _maps(child)
            os.write(go_w, b"g")
        except SetupError as exc:
            fail(exc)
    os.close(go_w)
    os.close(status_fd)
    return _wait(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

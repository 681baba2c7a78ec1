"""The supervisor that lives inside an open sandbox (its pid 1) and starts each command there.

It is started by the host (``sandboxes.supervisor``) as
``/usr/bin/python3 -I [-S] -c <this file's text> MODE CONTROL_FD [MODULE ...]`` inside bwrap,
so it uses the standard library only and is never imported on the host. ``MODE`` is ``exec``
(fork + exec the command, for a tool step) or ``python`` (a zygote: the ``MODULE``\\ s are
imported once, then each request forks a child that runs a Python script itself, without a new
interpreter).

Protocol over the SOCK_SEQPACKET control socket (one message per datagram):

- supervisor -> host ``ready`` once set up;
- host -> supervisor ``NUL``-joined ``cwd, argc, argv..., NAME=VALUE...`` with the descriptors
  stdin, stdout, stderr and the run's ``cgroup.procs`` files (opened by the host) attached;
- host -> supervisor ``quiet`` when the host kills the run (timeout, ``kill``): no ``Killed``
  note on stderr then, as none comes on the bwrap path, where the init dies too;
- supervisor -> host ``exit <wait status>`` when the command's first process has ended.

The host kills whatever else the run left in its cgroup. Why this process can be trusted with
model-written code beside it: as the pid namespace's init it ignores every signal sent from
inside that it has no handler for (SIGKILL included); it is not dumpable, so nothing in the
sandbox can read or write its memory or take its descriptors (/proc/1/mem, pidfd_getfd), and
seccomp forbids ptrace; a command gets none of its descriptors. A zygote child that corrupts
its own memory corrupts a forked copy. When the host goes away the control socket reports
EOF and the supervisor exits, and with it (the kernel sees to that) everything in the sandbox.
"""

import errno
import os
import select
import signal
import socket
import sys

PR_SET_DUMPABLE = 4
SHELL = "/bin/sh"
_MAX_FDS = 16


def make_undumpable():
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def reap(waiting_for, statuses):
    """Collects every exited child (orphans are ours too); keeps the status of ``waiting_for``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == waiting_for:
            statuses.append(status)


def remove_sysv_ipc():
    """SysV objects outlive their processes in the ipc namespace: a run must not inherit any."""
    found = {}
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as listing:
                ids = [int(line.split()[1]) for line in listing.readlines()[1:] if line.strip()]
        except OSError:
            continue
        if ids:
            found[kind] = ids
    if not found:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for ident in found.get("shm", ()):
        libc.shmctl(ident, ipc_rmid, None)
    for ident in found.get("sem", ()):
        libc.semctl(ident, 0, ipc_rmid)
    for ident in found.get("msg", ()):
        libc.msgctl(ident, ipc_rmid, None)


def parse_request(data):
    fields = data.split(b"\0")
    cwd = os.fsdecode(fields[0])
    argc = int(fields[1])
    argv = [os.fsdecode(a) for a in fields[2 : 2 + argc]]
    env = {}
    for item in fields[2 + argc :]:
        name, _, value = os.fsdecode(item).partition("=")
        env[name] = value
    return cwd, argv, env


def serve(control, wakeup_read, mode):
    """Answers requests until the host goes away; returns only in a forked child (its job)."""
    while True:
        reap(None, [])
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, _MAX_FDS)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the host is gone: leaving ends the pid namespace and all in it
        if data == b"quiet":  # a kill that came after its run had ended: nothing to do
            for fd in fds:
                os.close(fd)
            continue
        remove_sysv_ipc()
        cwd, argv, env = parse_request(data)
        pid = os.fork()
        if pid == 0:
            return become_command(control, wakeup_read, fds, cwd, argv, env, mode)
        # Kept to report a killed command on its stderr, as the bwrap path's init shell does.
        stderr = os.dup(fds[2]) if mode == "exec" and len(fds) > 2 else -1
        for fd in fds:
            os.close(fd)
        statuses: list[int] = []
        quiet = False  # the host is killing the run: the old path's init died with it, silently
        reap(pid, statuses)
        while not statuses:
            # A SIGCHLD (or a spurious one sent from inside) wakes us; so does the host leaving.
            readable, _, _ = select.select([wakeup_read, control], [], [])
            if control in readable:
                message = control.recv(64)
                if not message:
                    os._exit(0)
                quiet = quiet or message == b"quiet"
            if wakeup_read in readable:
                os.read(wakeup_read, 512)
            reap(pid, statuses)
        if stderr >= 0:
            quiet = quiet or pending_message(control) == b"quiet"
            if not quiet:
                report_signal(stderr, statuses[0])
            os.close(stderr)
        control.send(b"exit %d" % statuses[0])


def pending_message(control):
    try:
        return control.recv(64, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None


def report_signal(stderr, status):
    """What ``sh`` prints when the job it waits for dies of a signal (``Killed``, ...)."""
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) in (signal.SIGINT, signal.SIGPIPE):
        return
    note = signal.strsignal(os.WTERMSIG(status)) or f"Signal {os.WTERMSIG(status)}"
    if os.WCOREDUMP(status):
        note += " (core dumped)"
    try:  # noqa: SIM105 - contextlib is one more import at every supervisor start
        os.write(stderr, note.encode() + b"\n")
    except OSError:
        pass  # the host stopped reading (it gave up on this run)


def become_command(control, wakeup_read, fds, cwd, argv, env, mode):
    """In the forked child: join the run's cgroup, take the run's stdio, drop our state."""
    try:
        stdin, stdout, stderr, *cgroup_procs = fds
        for fd in cgroup_procs:  # first, so everything the command does is counted and killable
            os.write(fd, b"0")
            os.close(fd)
        signal.set_wakeup_fd(-1)
        os.close(wakeup_read)
        control.close()
        os.setsid()
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
        for fd in {stdin, stdout, stderr}:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(cwd)
    except BaseException as exc:  # noqa: BLE001 - the child must never return into serve()
        os.write(2, f"sandbox supervisor: {exc}\n".encode())
        os._exit(127)
    if mode == "exec":
        exec_command(argv, env)
    return argv, env


def exec_command(argv, env):
    """Starts ``argv`` as the bwrap path's init shell starts its background job."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    # A non-interactive shell's background job ignores SIGINT and SIGQUIT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        try:
            os.execvpe(argv[0], argv, env)  # noqa: S606 - argv is the command itself
        except OSError as exc:
            if exc.errno != errno.ENOEXEC:
                raise
            path = argv[0] if "/" in argv[0] else shutil_which(argv[0], env)
            # A script without #!: sh runs it, as the init shell would have.
            os.execve(SHELL, [SHELL, path, *argv[1:]], env)  # noqa: S606
    except OSError as exc:
        missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
        why = "not found" if missing else exc.strerror
        os.write(2, f"sandbox-init: 1: {argv[0]}: {why}\n".encode(errors="replace"))
        os._exit(127 if missing else 126)


def shutil_which(name, env):
    for directory in env.get("PATH", "").split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return name


def run_python(argv, env):
    """Runs ``argv[0]`` as ``python3 -I argv[0] argv[1:]`` would, in this (forked) interpreter."""
    import types

    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = list(argv)
    path = os.path.abspath(argv[0])  # as python3 sets __file__ and names it in tracebacks
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": path, "__cached__": None, "__builtins__": __builtins__})
    sys.modules["__main__"] = main
    try:
        with open(path, "rb") as script:
            code = compile(script.read(), path, "exec", dont_inherit=True)
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {argv[0]!r}: {exc}\n")
        raise SystemExit(2) from None
    except SyntaxError as exc:
        sys.excepthook(type(exc), exc.with_traceback(None), None)
        raise SystemExit(1) from None
    try:
        exec(code, main.__dict__)  # noqa: S102 - this is the sandboxed program itself
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as python3 would, without our frame
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


def main():
    mode, control_fd, preload = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    # Default dispositions: the kernel then drops every signal sent to pid 1 from inside.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    make_undumpable()
    control = socket.socket(fileno=control_fd)
    control.set_inheritable(False)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    for name in preload:
        __import__(name)
    import gc

    gc.collect()
    gc.freeze()  # the children's garbage collector then leaves the shared pages alone
    control.send(b"ready")
    job = serve(control, wakeup_read, mode)
    os.close(wakeup_write)
    return job


if __name__ == "__main__":
    _job = main()
    del main, serve
    run_python(*_job)

"""The supervisor that lives inside an open sandbox (its pid 1) and starts each command there.

It is started by the host (``sandboxes.supervisor``) as
``/usr/bin/python3 -I [-S] -c <this file's text> MODE CONTROL_FD [MODULE ...]`` inside bwrap,
so it uses the standard library only and is never imported on the host. ``MODE`` is ``exec``
(posix_spawn of the command, for a tool step) or ``python`` (a zygote: the ``MODULE``\\ s are
imported once, then each request forks a child that runs a Python script itself, without a new
interpreter).

Protocol over the SOCK_SEQPACKET control socket (one message per datagram):

- supervisor -> host ``ready`` once set up;
- host -> supervisor ``NUL``-joined ``cwd, n, argc, argv..., NAME=VALUE...`` with these
  descriptors attached: stdin, stdout, stderr, then ``n`` join files (v1 ``tasks``, v2
  ``cgroup.procs``) of the run's own cgroup and those of the supervisor's (opened by the host);
- host -> supervisor ``quiet`` when the host kills the run (timeout, ``kill``): no ``Killed``
  note on stderr then, as none comes on the bwrap path, where the init dies too;
- supervisor -> host ``exit <wait status>`` when the command's first process has ended;
- host -> supervisor ``reset`` between two users of a recycled sandbox (``sandboxes.pool``),
  once the host has killed every run: the supervisor reaps what is left, removes SysV IPC and
  checks that its ipc namespace is empty, that no other process is left in its pid namespace,
  and that its own hostname, limits, priority, affinity, scheduling, umask and credentials are
  what they were when it started (which its commands inherit); it answers ``clean`` or
  ``dirty <what>``, and the host discards a dirty sandbox.

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
    try:
        result, error = prctl_without_ctypes(PR_SET_DUMPABLE, 0)
    except Exception:  # noqa: BLE001 - the ctypes package below does the same, slower
        import ctypes

        result = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        error = ctypes.get_errno()
    if result != 0:
        raise OSError(error, "prctl(PR_SET_DUMPABLE, 0) failed")


def prctl_without_ctypes(option, value):
    """``prctl`` through the `_ctypes` extension alone: importing the `ctypes` package costs
    about 1.5 ms of CPU, a sizeable part of a supervisor's start."""
    import _ctypes

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    libc = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]
    function = Function(_ctypes.dlsym(libc, "prctl"))
    function.argtypes = (Int, Int, Int, Int, Int)
    _ctypes.set_errno(0)
    return function(option, value, 0, 0, 0), _ctypes.get_errno()


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


def wait_for_every_child():
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


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


def own_state():
    """What of this process its commands inherit and a command might have changed."""
    with open("/proc/self/limits") as limits:
        state = [limits.read(), os.uname().nodename]
    with open("/proc/self/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    state.append(" ".join(fields[i] for i in (15, 16, 37, 38)))  # priority, nice, rt, policy
    keep = ("Umask", "Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Cap", "Cpus_allowed")
    with open("/proc/self/status") as status:
        state += [line for line in status if line.startswith(keep)]
    return state


def reset(baseline):
    """Between two users of a recycled sandbox: returns ``clean`` or ``dirty <what>``."""
    wait_for_every_child()  # the host killed them all: only their exits are left to collect
    remove_sysv_ipc()
    os.chdir("/")  # nothing of ours pins a directory of the last user's
    problems = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as listing:
                if any(line.strip() for line in listing.readlines()[1:]):
                    problems.append(f"SysV {kind} left")
        except OSError:
            problems.append(f"cannot list SysV {kind}")
    others = [name for name in os.listdir("/proc") if name.isdigit() and name != "1"]
    if others:
        problems.append(f"processes left: {others}")
    now = own_state()
    if now != baseline:
        changed = [line.strip() for line in now if line not in baseline]
        problems.append(f"supervisor changed: {changed}"[:500])
    if problems:
        return ("dirty " + "; ".join(problems)).encode(errors="replace")[:4000]
    return b"clean"


def parse_request(data):
    fields = data.split(b"\0")
    cwd = os.fsdecode(fields[0])
    run_fds = int(fields[1])
    argc = int(fields[2])
    argv = [os.fsdecode(a) for a in fields[3 : 3 + argc]]
    env = {}
    for item in fields[3 + argc :]:
        name, _, value = os.fsdecode(item).partition("=")
        env[name] = value
    return cwd, run_fds, argv, env


def join(cgroup_procs):
    for fd in cgroup_procs:
        os.write(fd, b"0")


def serve(control, wakeup_read, mode, baseline):
    """Answers requests until the host goes away; returns only in a forked child (its job)."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the host is gone: leaving ends the pid namespace and all in it
        if data == b"quiet":  # a kill that came after its run had ended: nothing to do
            for fd in fds:
                os.close(fd)
            continue
        if data == b"reset":
            for fd in fds:
                os.close(fd)
            control.send(reset(baseline))
            continue
        # The host killed everything the last run left (its cgroup is empty), but a killed
        # process is still exiting for a moment after it leaves its cgroup: wait for each, so
        # that no run sees the last one's processes (not even as zombies, which count as pids).
        wait_for_every_child()
        remove_sysv_ipc()
        cwd, run_fds, argv, env = parse_request(data)
        stdio, run_cgroup, own_cgroup = fds[:3], fds[3 : 3 + run_fds], fds[3 + run_fds :]
        # We step into the run's cgroup to start the command and step back out after, so the
        # command is inside from its first instruction and never needs to write there itself.
        join(run_cgroup)
        if mode == "python":
            pid = os.fork()
            if pid == 0:
                for fd in run_cgroup + own_cgroup:
                    os.close(fd)
                return become_python(control, wakeup_read, stdio, cwd, argv, env)
            status = None
        else:
            pid, status = spawn_command(stdio, cwd, argv, env)
        join(own_cgroup)
        stderr = fds[2]  # kept to report a killed command, as the bwrap path's init shell does
        for fd in fds:
            if fd != stderr:
                os.close(fd)
        statuses = [] if status is None else [status]
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
        if mode == "exec":
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


def spawn_command(stdio, cwd, argv, env):
    """Starts ``argv`` as the bwrap path's init shell starts its command (a subshell).

    Returns (pid, None), or (None, wait status) when it could not start; then the error is on
    the command's stderr as ``sh`` words it. posix_spawn (a vfork) runs no Python in the child.
    SIGINT and SIGQUIT stay ignored (as ours are), as the init shell's ``trap ''`` leaves them;
    the others start at their defaults.
    """
    os.chdir(cwd)
    stdin, stdout, stderr = stdio
    actions = [
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    name = argv[0]
    if "/" in name:
        candidates = [name]
    else:
        path = env.get("PATH", "")
        candidates = [os.path.join(d or ".", name) for d in path.split(":")] if name else []
        # Only those that exist: a failed spawn still uses up a pid of the sandbox's.
        candidates = [c for c in candidates if os.path.lexists(c)]
    denied = None
    for candidate in candidates:
        for program, args in ((candidate, argv), (SHELL, [SHELL, candidate, *argv[1:]])):
            try:
                pid = os.posix_spawn(
                    program,
                    args,
                    env,
                    file_actions=actions,
                    setsid=True,
                    setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD),
                )
                return pid, None
            except OSError as exc:
                if exc.errno == errno.ENOEXEC:
                    continue  # a script without #!: sh runs it, as the init shell would have
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    denied = denied or exc
                break
    why = denied.strerror if denied is not None else "not found"
    try:  # noqa: SIM105 - see report_signal
        os.write(stderr, f"sandbox-init: 1: {name}: {why}\n".encode(errors="replace"))
    except OSError:
        pass
    return None, (126 if denied is not None else 127) << 8


def become_python(control, wakeup_read, stdio, cwd, argv, env):
    """In a zygote's forked child: take the run's stdio and drop every descriptor of ours."""
    try:
        signal.set_wakeup_fd(-1)
        os.close(wakeup_read)
        control.close()
        os.setsid()
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        for fd in set(stdio):
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        os.chdir(cwd)
    except BaseException as exc:  # noqa: BLE001 - the child must never return into serve()
        os.write(2, f"sandbox supervisor: {exc}\n".encode())
        os._exit(127)
    return argv, env


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
        return 2
    except SyntaxError as exc:
        sys.excepthook(type(exc), exc.with_traceback(None), None)
        return 1
    try:
        exec(code, main.__dict__)  # noqa: S102 - this is the sandboxed program itself
    except SystemExit as exc:
        return exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - reported as python3 would, without our frame
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return 1
    return 0


def exit_status(exc):
    """The status python3 exits with for an uncaught SystemExit (a message goes to stderr)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:  # noqa: SIM105 - see report_signal
        sys.stderr.write(f"{exc.code}\n")
    except Exception:  # noqa: BLE001, S110 - as the interpreter does: the status still stands
        pass
    return 1


def finish(status):
    """Ends the child as the interpreter's exit would, as far as a program can tell: other
    threads joined, atexit functions run, output flushed. The teardown of every module that
    follows in a real exit is invisible to the program and the costliest part, so it is skipped.
    """
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # noqa: SLF001 - what the interpreter calls at exit
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001 - idem
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - python3 exits 120 when its output cannot be flushed
            status = 120
    os._exit(status)


def main():
    mode, control_fd, preload = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    # No handlers: the kernel then drops every signal sent to pid 1 from inside. Ignored (not
    # default) so that the commands we spawn inherit what the bwrap path's init gives them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
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
    baseline = own_state()
    control.send(b"ready")
    job = serve(control, wakeup_read, mode, baseline)
    os.close(wakeup_write)
    return job


if __name__ == "__main__":
    _job = main()
    del main, serve
    finish(run_python(*_job))

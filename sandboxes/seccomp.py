"""A seccomp filter (classic BPF, built here; bwrap installs it with ``--seccomp FD``).

It is a second wall behind the namespaces: calls a sandboxed program never needs and that
have a history of kernel escapes fail with EPERM (ptrace, mount and the new mount API,
unshare/setns, keyrings, bpf, perf, userfaultfd, io_uring, kexec and modules, clock and
swap changes, handle-based opens, cross-process memory access, taking another process's
descriptors with pidfd_getfd). Nothing may change the scheduling, priority or resource limits
of pid 1 (the sandbox's init or supervisor): those calls check only that the uids match, so
without this a command could lower the supervisor's limits or priority for every later run
(a zygote's next evaluation, a recycled pool sandbox's next user), since its children inherit
them; a process may still change its own. With ``network="none"``,
creating AF_INET/AF_INET6 sockets fails too, so there is no network at all, not even a
private loopback. Calls from another ABI (i386 ``int 0x80``, x32) are refused outright,
since their numbers would slip past the table.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from functools import lru_cache

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
AF_INET = 2
AF_INET6 = 10

#: Offsets of the low 32 bits of seccomp_data.args[0] and [1] (little-endian; a pid_t or an
#: int ``which`` is those bits alone in the kernel).
_ARG_LOW = (16, 24)

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06

_DENIED_X86_64 = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "vhangup": 153,
    "pivot_root": 155, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212,
    "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
}  # fmt: skip
_DENIED_AARCH64 = {
    "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "quotactl": 60, "acct": 89,
    "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106,
    "clock_settime": 112, "syslog": 116, "ptrace": 117, "reboot": 142, "settimeofday": 170,
    "add_key": 217, "request_key": 218, "keyctl": 219, "swapon": 224, "swapoff": 225,
    "perf_event_open": 241, "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268,
    "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273, "bpf": 280,
    "userfaultfd": 282, "kexec_file_load": 294,
}  # fmt: skip
# Numbered alike on every architecture since Linux 5.1.
_DENIED_COMMON = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "pidfd_getfd": 438,
}  # fmt: skip
#: POSIX message queues outlive their processes in the ipc namespace and cannot be listed
#: without mounting mqueue: a zygote (one namespace, many samples) forbids them.
_MQ_OPEN = {"x86_64": 240, "aarch64": 180}
_SOCKET = {"x86_64": 41, "aarch64": 198}
#: Calls whose first argument names a process: refused when it names pid 1.
_PID_FIRST = {
    "x86_64": {"sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
               "prlimit64": 302, "sched_setattr": 314},
    "aarch64": {"sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
                "prlimit64": 261, "sched_setattr": 274},
}  # fmt: skip
#: (number, "every process of the uid" value of ``which``, the two ``which`` values that take a
#: process or group id as ``who``): refused for a whole uid, or for pid / process group 1.
_WHICH_WHO = {
    "x86_64": {"setpriority": (141, 2, (0, 1)), "ioprio_set": (251, 3, (1, 2))},
    "aarch64": {"setpriority": (140, 2, (0, 1)), "ioprio_set": (30, 3, (1, 2))},
}


def supported() -> str | None:
    """None when a filter can be built here, else why not."""
    if platform.machine() not in AUDIT_ARCH:
        return f"no syscall table for {platform.machine()}"
    return None


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@lru_cache(maxsize=4)
def build_filter(block_ip_sockets: bool, deny_message_queues: bool = False) -> bytes:
    machine = platform.machine()
    table = _DENIED_X86_64 if machine == "x86_64" else _DENIED_AARCH64
    denied = sorted(set(table.values()) | set(_DENIED_COMMON.values()))
    if deny_message_queues:
        denied = sorted({*denied, _MQ_OPEN[machine]})
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    # Program: check arch -> load nr -> x32 check -> one JEQ per denied call -> socket check.
    program: list[bytes] = []
    program.append(_insn(_LD_W_ABS, 4))  # seccomp_data.arch
    program.append(_insn(_JEQ_K, AUDIT_ARCH[machine], jt=1, jf=0))
    program.append(_insn(_RET_K, SECCOMP_RET_KILL_PROCESS))
    program.append(_insn(_LD_W_ABS, 0))  # seccomp_data.nr
    if machine == "x86_64":
        program.append(_insn(_JGE_K, X32_SYSCALL_BIT, jt=0, jf=1))
        program.append(_insn(_RET_K, deny))
    for nr in denied:  # JEQ nr falls through to RET deny; any other number skips it
        program.append(_insn(_JEQ_K, nr, jt=0, jf=1))
        program.append(_insn(_RET_K, deny))
    for nr in sorted(_PID_FIRST[machine].values()):
        program.append(_insn(_JEQ_K, nr, jt=0, jf=4))  # another call: skip the block
        program.append(_insn(_LD_W_ABS, _ARG_LOW[0]))
        program.append(_insn(_JEQ_K, 1, jt=0, jf=1))
        program.append(_insn(_RET_K, deny))
        program.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
    for nr, whole_uid, by_id in sorted(_WHICH_WHO[machine].values()):
        program.append(_insn(_JEQ_K, nr, jt=0, jf=8))
        program.append(_insn(_LD_W_ABS, _ARG_LOW[0]))  # which
        program.append(_insn(_JEQ_K, whole_uid, jt=4, jf=0))
        program.append(_insn(_JEQ_K, by_id[0], jt=1, jf=0))
        program.append(_insn(_JEQ_K, by_id[1], jt=0, jf=3))
        program.append(_insn(_LD_W_ABS, _ARG_LOW[1]))  # who
        program.append(_insn(_JEQ_K, 1, jt=0, jf=1))
        program.append(_insn(_RET_K, deny))
        program.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
    if block_ip_sockets:
        program.append(_insn(_JEQ_K, _SOCKET[machine], jt=0, jf=5))
        program.append(_insn(_LD_W_ABS, 16))  # low half of args[0]: the address family
        program.append(_insn(_JEQ_K, AF_INET, jt=2, jf=0))
        program.append(_insn(_JEQ_K, AF_INET6, jt=1, jf=0))
        program.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
        program.append(_insn(_RET_K, SECCOMP_RET_ERRNO | errno.EACCES))
    program.append(_insn(_RET_K, SECCOMP_RET_ALLOW))
    return b"".join(program)


def filter_fd(program: bytes) -> int:
    """A fresh descriptor, positioned at 0, holding ``program`` (bwrap reads it to the end)."""
    fd = os.memfd_create("sandbox-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

"""A tiny seccomp-BPF filter, installed by the worker on itself before any environment runs.

Standard library only (ctypes): it is loaded inside the sandbox next to ``worker.py``.
Linux x86-64 only; elsewhere ``install`` returns False and the pool warns.

What it denies (EPERM unless noted), so environment code cannot:
- create processes: fork, vfork, clone without CLONE_THREAD, clone3 (ENOSYS, so glibc
  falls back to clone and threads still work) -> no fork bombs, no daemons, no subprocess;
- signal anything but itself: kill/tgkill with another pid (kill(0) and -pgid stay out:
  the worker leads its own group), tkill, rt_(tg)sigqueueinfo, pidfd_send_signal;
- trace, read or poke other processes: ptrace, process_vm_readv/writev, kcmp, pidfd_getfd;
  change namespaces: unshare, setns, clone with any CLONE_NEW* flag;
- reach kernel surface no game needs (the rest of what Docker's default seccomp profile
  refuses): perf_event_open, bpf, open_by_handle_at / name_to_handle_at, modules, kexec,
  swap, reboot, acct, quotactl, iopl/ioperm, move_pages, fanotify_init, personality, and the
  key syscalls, io_uring and userfaultfd;
- park memory outside the limits or change the filesystem: mount, umount2, pivot_root, chroot,
  the new mount API (open_tree, move_mount, fsopen, fsconfig, fsmount, fspick,
  mount_setattr), memfd_create, memfd_secret, System V shmget, POSIX mq_open (a mount made
  inside the sandbox's user namespace, a memfd or a SysV segment is RAM that neither the
  address-space limit nor a tmpfs size counts, and a SysV segment outlives the process).
Wrong-architecture (i386/x32) syscalls kill the process.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
_RET = 0x06

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000


def _errno(code: int) -> int:
    return 0x00050000 | code


AUDIT_ARCH_X86_64 = 0xC000003E
CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEW_ANY = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)
NR = {
    "shmget": 29, "clone": 56, "fork": 57, "vfork": 58, "kill": 62, "ptrace": 101,
    "rt_sigqueueinfo": 129, "pivot_root": 155, "chroot": 161, "mount": 165, "umount2": 166,
    "tkill": 200, "tgkill": 234, "mq_open": 240, "unshare": 272, "rt_tgsigqueueinfo": 297,
    "setns": 308, "process_vm_writev": 311, "memfd_create": 319, "pidfd_send_signal": 424,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "clone3": 435, "mount_setattr": 442, "memfd_secret": 447,
    "add_key": 248, "request_key": 249, "keyctl": 250, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    # what Docker's default profile also refuses, and no environment needs
    "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139, "acct": 163,
    "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212,
    "kexec_load": 246, "move_pages": 279, "perf_event_open": 298, "fanotify_init": 300,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "process_vm_readv": 310, "kcmp": 312,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "pidfd_getfd": 438,
}  # fmt: skip
DENIED = ("fork", "vfork", "ptrace", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
          "unshare", "setns", "process_vm_writev", "pidfd_send_signal", "shmget", "mq_open",
          "pivot_root", "chroot", "mount", "umount2", "memfd_create", "open_tree",
          "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
          "memfd_secret", "add_key", "request_key", "keyctl", "userfaultfd", "io_uring_setup",
          "io_uring_enter", "io_uring_register",
          # kernel surface (Docker's default profile refuses these too): profiling and BPF
          # (perf_event_open, bpf), other processes' memory and files (process_vm_readv, kcmp,
          # pidfd_getfd), file handles (open_by_handle_at: the "shocker" container escape;
          # name_to_handle_at), modules, kexec, swap, reboot, accounting, quotas, port I/O,
          # NUMA page moves, fanotify, personality (ASLR off), and the obsolete uselib/ustat/sysfs
          "uselib", "personality", "ustat", "sysfs", "acct", "swapon", "swapoff", "reboot",
          "iopl", "ioperm", "init_module", "delete_module", "quotactl", "lookup_dcookie",
          "kexec_load", "move_pages", "perf_event_open", "fanotify_init", "name_to_handle_at",
          "open_by_handle_at", "process_vm_readv", "kcmp", "finit_module", "kexec_file_load",
          "bpf", "pidfd_getfd")  # fmt: skip
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (little endian)


def _assemble(prog: list[tuple]) -> bytes:
    """Resolve label jumps. Items: (op, k, jt_label, jf_label) | ('label', name)."""
    labels, code = {}, []
    for item in prog:
        if item[0] == "label":
            labels[item[1]] = len(code)
        else:
            code.append(item)
    out = b""
    for i, (op, k, *jumps) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if j else 0 for j in (jumps + [None, None])[:2])
        out += struct.pack("<HBBI", op, jt, jf, k)
    return out


def build_filter(pid: int, threads: bool = True) -> bytes:
    """``threads=False``: clone is refused even with CLONE_THREAD (a one-task worker)."""
    eperm = _errno(errno.EPERM)
    prog: list[tuple] = [
        (_LD_ABS, _OFF_ARCH),
        (_JEQ, AUDIT_ARCH_X86_64, "arch_ok", "kill"),
        ("label", "arch_ok"),
        (_LD_ABS, _OFF_NR),
        (_JGE, 0x40000000, "kill", None),  # x32 ABI
        (_JEQ, NR["clone3"], "enosys", None),
        (_JEQ, NR["clone"], "clone", None),
        (_JEQ, NR["kill"], "kill_sys", None),
        (_JEQ, NR["tgkill"], "tgkill", None),
    ]
    prog += [(_JEQ, NR[name], "eperm", None) for name in DENIED]
    prog += [
        (_RET, ALLOW),
        ("label", "clone"),
        (_LD_ABS, _OFF_ARG0),
        (_JSET, CLONE_NEW_ANY, "eperm", None),
        (_JSET, CLONE_THREAD if threads else 0, "allow", "eperm"),
        ("label", "kill_sys"),
        (_LD_ABS, _OFF_ARG0),
        (_JEQ, 0, "allow", None),
        (_JEQ, pid, "allow", "eperm"),
        ("label", "tgkill"),
        (_LD_ABS, _OFF_ARG0),
        (_JEQ, pid, "allow", "eperm"),
        ("label", "allow"),
        (_RET, ALLOW),
        ("label", "eperm"),
        (_RET, eperm),
        ("label", "enosys"),
        (_RET, _errno(errno.ENOSYS)),
        ("label", "kill"),
        (_RET, KILL_PROCESS),
    ]
    return _assemble(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(pid: int, threads: bool = True) -> bool:
    """Install the filter on the calling process (irreversible). False when unsupported."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    code = build_filter(pid, threads)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True


KEYCTL_JOIN_SESSION_KEYRING = 1


def join_empty_keyring() -> bool:
    """Replace the session keyring inherited from the parent with a new, empty, anonymous
    one (keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)): nothing the host keeps in its session
    keyring is reachable, and nothing planted here reaches another worker. Called before
    the filter denies keyctl. False when the kernel has no keys support."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(NR["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def mount_tmpfs(target: str, size_bytes: int) -> bool:
    """Mount a size-capped tmpfs on ``target`` (a private mount namespace only: used at the
    ``unshare`` level, before the filter forbids mounts). False when it cannot."""
    if platform.system() != "Linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"size={size_bytes},mode=1777".encode()
    return libc.mount(b"tmpfs", target.encode(), b"tmpfs", 0x2 | 0x4, opts) == 0  # NOSUID|NODEV


def remount_ro(target: str) -> bool:
    """Make the mount at ``target`` read-only in this (private) mount namespace."""
    if platform.system() != "Linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mount(None, target.encode(), None, 32 | 4096 | 1, None) == 0  # REMOUNT|BIND|RDONLY


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): die when the parent (thread) that started us exits."""
    if platform.system() == "Linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL

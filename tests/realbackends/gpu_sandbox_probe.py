"""Which of the backend units' sandbox settings a CUDA process survives, on a GPU host without systemd.

Not a test (the GPU host has no systemd, so nothing here runs under ``pytest``): a measurement,
run by hand on a GPU machine, whose results docs/real-backends.md ("Hardening the backend units")
records.  Each configuration runs the same CUDA workload in a fresh child process that first puts
on the kernel mechanism systemd uses for the setting:

* ``mdwe-seccomp``: systemd 252's ``MemoryDenyWriteExecute=`` (a seccomp filter: ``mmap`` with
  PROT_WRITE|PROT_EXEC, any ``mprotect``/``pkey_mprotect`` with PROT_EXEC, ``shmat`` with SHM_EXEC
  fail with EPERM); ``mdwe-prctl``: the ``PR_SET_MDWE`` form that systemd 253+ uses where it can;
* ``syscalls``: ``SystemCallFilter=@system-service`` with ``SystemCallErrorNumber=EPERM`` (the
  names, expanded by ``systemd-analyze syscall-filter`` of systemd 252, come in a file);
* ``af-inet``/``af-netlink``: ``RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6`` without and with
  ``AF_NETLINK`` (other families fail with EAFNOSUPPORT, as systemd does it);
* ``procsubset``/``tunables``: ``ProcSubset=pid`` and ``ProtectKernelTunables=`` (a private mount
  namespace with ``/proc`` mounted ``subset=pid``, or ``/sys`` and ``/proc/sys`` read-only);
* ``procinvisible``: ``ProtectProc=invisible`` (``/proc`` mounted ``hidepid=invisible``);
* ``all``: the unit's set together (read-only ``/sys``, ``hidepid=invisible``), as user ``nobody``
  with no capabilities.

Usage (as root, with ``python3`` holding a CUDA torch)::

    python3 gpu_sandbox_probe.py SYSCALL_NAMES_FILE [LIBSECCOMP_SO [CONFIG,...]]

It prints one JSON line per configuration: each workload step's result (``ok`` or the error).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 4, 7
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
PR_SET_NO_NEW_PRIVS = 38
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_MAX = 1, 2, 10, 16, 46


def act_errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class Seccomp:
    def __init__(self, so: str) -> None:
        self.lib = ctypes.CDLL(so, use_errno=True)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_init.argtypes = [ctypes.c_uint32]
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(ArgCmp),
        ]
        self.lib.seccomp_load.argtypes = [ctypes.c_void_p]

    def nr(self, name: str) -> int:
        return int(self.lib.seccomp_syscall_resolve_name(name.encode()))

    def filter(self, default: int, rules: list[tuple[int, str, list[tuple[int, int, int, int]]]]) -> None:
        ctx = self.lib.seccomp_init(default)
        assert ctx, "seccomp_init failed"
        for action, name, cmps in rules:
            nr = self.nr(name)
            if nr < 0:
                continue
            arr = (ArgCmp * max(1, len(cmps)))(*[ArgCmp(*c) for c in cmps])
            rc = self.lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
            if rc < 0:
                raise OSError(-rc, f"seccomp_rule_add_array({name})")
        rc = self.lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, "seccomp_load")


def mdwe_seccomp(sc: Seccomp) -> None:
    wx = PROT_WRITE | PROT_EXEC
    sc.filter(
        SCMP_ACT_ALLOW,
        [
            (act_errno(errno.EPERM), "mmap", [(2, SCMP_CMP_MASKED_EQ, wx, wx)]),
            (act_errno(errno.EPERM), "mprotect", [(2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)]),
            (act_errno(errno.EPERM), "pkey_mprotect", [(2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)]),
            (act_errno(errno.EPERM), "shmat", [(2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC)]),
        ],
    )


def syscalls(sc: Seccomp, names_file: str) -> None:
    with open(names_file, encoding="utf-8") as f:
        names = [n.strip() for n in f if n.strip()]
    sc.filter(act_errno(errno.EPERM), [(SCMP_ACT_ALLOW, n, []) for n in names])


def families(sc: Seccomp, allowed: set[int]) -> None:
    rules = [
        (act_errno(errno.EAFNOSUPPORT), "socket", [(0, SCMP_CMP_EQ, fam, 0)])
        for fam in range(AF_MAX)
        if fam not in allowed
    ]
    sc.filter(SCMP_ACT_ALLOW, rules)


# a[threadIdx.x] = threadIdx.x, written by hand as PTX for sm_80 (the H200, sm_90, JITs it)
PTX = """.version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 a)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<4>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [a];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    cvt.rn.f32.u32 %f1, %r1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd2, %rd2, %rd3;
    st.global.f32 [%rd2], %f1;
    ret;
}
"""


def step(results: dict[str, str], name: str, fn: Any) -> None:
    t0 = time.monotonic()
    try:
        out = fn()
        results[name] = f"ok ({time.monotonic() - t0:.1f} s){'' if out is None else ': ' + str(out)}"
    except BaseException as e:  # noqa: BLE001 - each step's failure is the measurement
        results[name] = f"FAILED: {type(e).__name__}: {str(e)[:300]}"


def workload() -> dict[str, str]:
    r: dict[str, str] = {}
    import torch

    step(r, "cuda_init", lambda: torch.cuda.get_device_name(0))
    step(
        r,
        "matmul",
        lambda: float((torch.ones(512, 512, device="cuda") @ torch.ones(512, 512, device="cuda"))[0, 0]),
    )

    def compiled() -> float:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + x.sin())
        return float(fn(torch.ones(4096, device="cuda")).sum())

    step(r, "torch_compile_triton", compiled)

    def graph() -> float:
        x = torch.ones(256, device="cuda")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = x * 2
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 3
        g.replay()
        torch.cuda.synchronize()
        return float(y.sum())

    step(r, "cuda_graph", graph)

    def ptx_jit() -> str:
        import cupy

        mod = cupy.cuda.function.Module()
        mod.load(PTX.encode())  # cuModuleLoadData on PTX text: the driver compiles it (no cubin)
        a = cupy.zeros(32, dtype=cupy.float32)
        mod.get_function("k")((1,), (32,), (a,))
        return str(float(a.sum()))  # 0 + 1 + ... + 31 = 496

    step(r, "driver_ptx_jit", ptx_jit)

    def dist(backend: str) -> float:
        import torch.distributed as d

        port = 29500 + os.getpid() % 1000 + (0 if backend == "nccl" else 1000)
        d.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
        try:
            t = torch.ones(8, device="cuda" if backend == "nccl" else "cpu")
            d.all_reduce(t)
            return float(t.sum())
        finally:
            d.destroy_process_group()

    step(r, "nccl_all_reduce", lambda: dist("nccl"))
    step(r, "gloo_all_reduce", lambda: dist("gloo"))
    return r


def child(config: str, names_file: str, so: str) -> None:
    sc = Seccomp(so)
    ctypes.CDLL(None).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    parts = config.split("+")
    if "mdwe-prctl" in parts:
        rc = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)
        assert rc == 0, f"PR_SET_MDWE failed: errno {ctypes.get_errno()}"
    if "mdwe-seccomp" in parts:
        mdwe_seccomp(sc)
    if "af-inet" in parts:
        families(sc, {AF_UNIX, AF_INET, AF_INET6})
    if "af-netlink" in parts:
        families(sc, {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK})
    if "syscalls" in parts:
        syscalls(sc, names_file)
    print(json.dumps({"config": config, "uid": os.getuid(), **workload()}), flush=True)


MOUNTS = {
    "procsubset": "mount -t proc -o subset=pid proc /proc",
    "tunables": "mount -o bind,ro /sys /sys && mount -o bind,ro /proc/sys /proc/sys",
    "procinvisible": "mount -t proc -o hidepid=invisible proc /proc",
}
ALL = "mdwe-seccomp+af-netlink+syscalls"
CONFIGS = [
    "baseline",
    "mdwe-seccomp",
    "mdwe-prctl",
    "syscalls",
    "af-inet",
    "af-netlink",
    "procsubset",
    "tunables",
    "procinvisible",
    "all",
]


def main() -> None:
    names_file = os.path.abspath(sys.argv[1])
    so = sys.argv[2] if len(sys.argv) > 2 else "libseccomp.so.2"
    me = os.path.abspath(__file__)
    with open("/proc/devices", encoding="utf-8") as f:
        print(json.dumps({"devices": sorted(os.listdir("/dev")), "proc_devices": f.read()}))
    for config in sys.argv[3].split(",") if len(sys.argv) > 3 else CONFIGS:
        home = tempfile.mkdtemp(prefix=f"probe-{config}-")
        os.chmod(home, 0o777)
        env = dict(
            os.environ,
            HOME=home,
            TORCHINDUCTOR_CACHE_DIR=f"{home}/inductor",
            TRITON_CACHE_DIR=f"{home}/triton",
            XDG_CACHE_HOME=f"{home}/cache",
            NCCL_SOCKET_IFNAME="lo",
            GLOO_SOCKET_IFNAME="lo",
            CUDA_CACHE_DISABLE="1",  # the PTX is compiled each time, not read from ~/.nv
        )
        parts = ALL if config == "all" else config
        inner = f"{sys.executable} {me} --child {parts} {names_file} {so}"
        if config in MOUNTS:
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"{MOUNTS[config]} && exec {inner}",
            ]
        elif config == "all":
            argv = [
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"{MOUNTS['tunables']} && {MOUNTS['procinvisible']} && exec setpriv --reuid=65534 --regid=65534 --clear-groups "
                f"--inh-caps=-all --bounding-set=-all {inner}",
            ]  # fmt: skip
        else:
            argv = inner.split()
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        print(
            lines[-1]
            if lines
            else json.dumps({"config": config, "rc": p.returncode, "stderr": p.stderr[-1500:]}),
            f"# {time.monotonic() - t0:.0f} s, rc {p.returncode}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()

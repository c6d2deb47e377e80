"""Ansible connection to a throwaway root of ``tests/support/debroot.py`` (the role's tests).

ansible-core has no chroot connection of its own; this one runs each command as root inside the
root (``nsenter --mount`` into the mount namespace that holds its overlay, then ``chroot``) and copies
files through ``/proc/PID/root``, the way :class:`tests.support.debroot.ThrowawayRoot` does.  The
inventory names the namespace holder's PID and the root's directory::

    host-a ansible_connection=gpushift_nsroot gpushift_nsroot_pid=1234 gpushift_nsroot_dir=/tmp/x/root
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection import ConnectionBase

DOCUMENTATION = """
name: gpushift_nsroot
short_description: run tasks inside a gpushift test's throwaway root (nsenter + chroot)
description:
  - Commands run as root through nsenter --mount into the namespace holder's mount namespace, then
    chroot into the root; files are copied through /proc/PID/root.
options:
  nsroot_pid:
    description: PID of the process that holds the root's mount namespace.
    vars:
      - name: gpushift_nsroot_pid
  nsroot_dir:
    description: The root's directory, as the holder's mount namespace sees it.
    vars:
      - name: gpushift_nsroot_dir
"""

ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
}


class Connection(ConnectionBase):  # type: ignore[misc]
    transport = "gpushift_nsroot"
    has_pipelining = True
    default_user = "root"

    def _where(self) -> tuple[int, str]:
        pid, root = self.get_option("nsroot_pid"), self.get_option("nsroot_dir")
        if not pid or not root:
            raise AnsibleConnectionFailure(
                "gpushift_nsroot needs gpushift_nsroot_pid and gpushift_nsroot_dir"
            )
        return int(pid), str(root)

    def _connect(self) -> Connection:
        pid, root = self._where()
        if not os.path.isdir(f"/proc/{pid}/root{root}"):
            raise AnsibleConnectionFailure(f"no throwaway root {root} in the mount namespace of PID {pid}")
        self._connected = True
        return self

    def _host_path(self, path: str) -> str:
        pid, root = self._where()
        if not os.path.isabs(path):
            raise AnsibleConnectionFailure(f"not an absolute path inside the root: {path}")
        return f"/proc/{pid}/root{root}{os.path.normpath(path)}"

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        pid, root = self._where()
        argv = ["nsenter", f"--target={pid}", "--mount", "chroot", root, "/bin/sh", "-c", cmd]
        p = subprocess.run(argv, input=in_data or b"", capture_output=True, env=ENV, timeout=3600)
        return p.returncode, p.stdout, p.stderr

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        try:
            shutil.copyfile(in_path, self._host_path(out_path))
        except OSError as e:
            raise AnsibleConnectionFailure(f"could not copy {in_path} to {out_path}: {e}") from e

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        try:
            shutil.copyfile(self._host_path(in_path), out_path)
        except OSError as e:
            raise AnsibleConnectionFailure(f"could not copy {in_path} to {out_path}: {e}") from e

    def close(self) -> None:
        self._connected = False

    def reset(self, *args: Any) -> None:
        self.close()

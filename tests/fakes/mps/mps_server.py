# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulated ``nvidia-cuda-mps-server``: started by mps_sim.py, one process per server.

argv[0] is ``nvidia-cuda-mps-server`` and the process name (comm) is set to
``nvidia-cuda-mps`` (the real server's comm, truncated to 15 bytes).  It drops to
the client's uid, opens ``<pipe>/log`` and connects back to ``<pipe>/control`` as
that uid (so an untraversable pipe-dir parent makes it fail as a real server
does), logs its start in server.log through the FIFO, then follows the daemon's
orders until told to shut down or the daemon goes away.

With ``FAKE_MPS_SHM=check`` (the default; the daemon passes the value it validated) the
server, running as its final uid, creates ``/dev/shm/mps-sim-server.<pid>`` (0644) and
removes it when it exits: the rendezvous a client looks for in its own /dev/shm.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import signal
import socket
import sys
import time
from typing import Optional

MSG_MAX = 1 << 18
PR_SET_NAME = 15
SHM_DIR = '/dev/shm'  # the same names as mps_common.SHM_DIR / SHM_PREFIX (this script stands alone)
SHM_PREFIX = 'mps-sim-server.'
# r580's server took ~0.1 s to exit once told to (gpu-evidence probe3.txt: `Try shutting down server` at .977, `exited` at
# .072), so a get_server_list in the same batch as shutdown_server still lists it (probe.txt, "restart")
SHUTDOWN_SECONDS = 0.1


class Server:
    """The server side of the simulator's protocol."""

    def __init__(self, pipe: str, shm: bool = True) -> None:
        self.pipe = pipe
        self.pid = os.getpid()
        self.log_fd = -1
        self.sock: Optional[socket.socket] = None
        self.shm = shm
        self.shm_path: Optional[str] = None
        self.kind = 'Server'  # the log tag of the server's own lines ('Legacy Server' before Volta)

    def log(self, kind: str, message: str) -> None:
        """One line into <pipe>/log (the daemon copies it to server.log)."""
        if self.log_fd < 0:
            return
        now = datetime.datetime.now()
        line = f'[{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d} {kind} {self.pid:5d}] {message}\n'
        try:
            os.write(self.log_fd, line.encode())
        except OSError:
            pass

    def send(self, obj: dict) -> None:
        """A message to the daemon."""
        if self.sock is not None:
            try:
                self.sock.send(json.dumps(obj).encode())
            except OSError:
                pass

    def recv(self) -> Optional[dict]:
        """A message from the daemon; None when it is gone."""
        if self.sock is None:
            return None
        try:
            data = self.sock.recv(MSG_MAX)
        except OSError:
            return None
        if not data:
            return None
        try:
            obj = json.loads(data.decode())
        except (ValueError, UnicodeDecodeError):
            return None
        return obj if isinstance(obj, dict) else None

    def create_shm(self) -> None:
        """Create the /dev/shm rendezvous file; when that fails, say so in server.log and carry on."""
        path = os.path.join(SHM_DIR, f'{SHM_PREFIX}{self.pid}')
        try:
            os.unlink(path)  # a left-over of a SIGKILLed server that had this pid
        except OSError:
            pass
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self.log(self.kind, f'Failed to create {path}: {exc.strerror or exc}')
            return
        self.shm_path = path
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove_shm(self) -> None:
        """Remove the rendezvous file (every exit but SIGKILL)."""
        path, self.shm_path = self.shm_path, None
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass

    def run(self) -> int:
        """Start, serve, exit (0 when told to shut down)."""
        try:
            self.log_fd = os.open(os.path.join(self.pipe, 'log'), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return 1
        self.log('Other', 'Startup')
        control = os.path.join(self.pipe, 'control')
        self.log('Other', f'Connecting to control daemon on socket: {control}')
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.connect(control)
        except OSError as exc:
            self.log('Other', f'Failed to connect to control daemon: {exc.strerror}')
            return 1
        self.send({'type': 'server', 'pid': self.pid})
        self.log('Other', 'Initializing server process')
        config = self.recv()
        if config is None:
            return 1
        if config.get('cmd') == 'shutdown':
            return 0
        # a pre-Volta server's lines carry the tag "Legacy Server" where a Volta one's say "Server"
        # (a real Tesla P4 log: "Legacy Server   425] Failed to start : invalid argument")
        legacy = bool(config.get('legacy'))
        self.kind = 'Legacy Server' if legacy else 'Server'
        if config.get('fail'):
            self.log(self.kind, f'Failed to start : {config["fail"]}')
            return 1
        for dev in config.get('devices', []):
            self.log(self.kind, f'Creating server context on device {dev["ordinal"]} ({dev["name"]})')
        if self.shm:
            self.create_shm()
        self.log(self.kind, f'Created anonymous shared memory region mps.shm.{os.getuid()}.{self.pid}')
        self.log(self.kind, f'CUDA MPS Server for Linux/Unix. Binary version: {config.get("version", "0")}')
        if not legacy:  # limits are Volta features: one line per limit the server applies
            self.log(self.kind, f'Active Threads Percentage set to {float(config.get("pct", 100.0)):.1f}')
            for ordinal, mib in sorted(config.get('mem', {}).items(), key=lambda item: int(item[0])):
                self.log(self.kind, f'Device pinned memory limit for device {ordinal} set to {int(mib) * 1024 * 1024:#x} bytes')
        self.log(self.kind, f'Server Priority set to {config.get("priority", 0)}')
        self.log(self.kind, 'Server has started')
        self.send({'type': 'started'})
        while True:
            msg = self.recv()
            if msg is None:
                self.log(self.kind, 'Lost connection to the control daemon, exiting')
                return 1
            cmd = msg.get('cmd')
            if cmd == 'client_connected':
                self.log(self.kind, f'Client {{PID: {msg.get("pid")}, Context ID: {msg.get("context")}}} connected')
            elif cmd == 'client_disconnected':
                self.log(self.kind, f'Client {{PID: {msg.get("pid")}, Context ID: {msg.get("context")}}} disconnected')
            elif cmd == 'shutdown':
                self.log(self.kind, 'Server is shutting down')
                time.sleep(SHUTDOWN_SECONDS)
                return 0


def set_process_name(name: bytes) -> None:
    """Set comm (what ps -o comm and /proc/PID/comm show)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def drop_privileges(uid: int, gid: int) -> bool:
    """Become the client's uid, as the real daemon does (setuid) before the server runs."""
    if os.geteuid() == uid:
        return True
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError:
        return False
    return True


def main(argv: list[str]) -> int:
    """Entry point: ``nvidia-cuda-mps-server mps_server.py --pipe DIR --uid N --gid N [--delay S]``."""
    parser = argparse.ArgumentParser(prog='nvidia-cuda-mps-server')
    parser.add_argument('--pipe', required=True)
    parser.add_argument('--uid', type=int, required=True)
    parser.add_argument('--gid', type=int, required=True)
    parser.add_argument('--delay', type=float, default=0.0)
    args = parser.parse_args(argv)
    set_process_name(b'nvidia-cuda-mps')
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(0))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if not drop_privileges(args.uid, args.gid):
        return 1
    if args.delay > 0:
        time.sleep(args.delay)
    server = Server(args.pipe, shm=os.environ.get('FAKE_MPS_SHM', '').strip() != 'off')
    try:
        return server.run()
    finally:
        server.remove_shm()  # also on SIGTERM / SIGINT (SystemExit, KeyboardInterrupt)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

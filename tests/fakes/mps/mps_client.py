# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CUDA client stand-in for the MPS simulator (``mps-sim-client``).

Connects to ``$CUDA_MPS_PIPE_DIRECTORY/control`` as a CUDA application would at
``cuInit``; the daemon picks or starts the server of the client's uid.  Prints ONE
JSON line with what it got, then stays connected until stdin closes or SIGTERM /
SIGINT arrives, then disconnects and exits 0.

Failures print a JSON line ``{"ok": false, "error": "CUDA_ERROR_...", ...}`` on
stdout and the CUDA-style message on stderr, exit 1.  Losing the server while
connected (forced quit, server or daemon killed) prints the same two lines; then,
with ``FAKE_MPS_CLIENT_ON_SERVER_LOSS=lives`` (the default: a real r580 client
process outlived its server, gpu-evidence probe.txt and probe3.txt), the process
stays until stdin closes or SIGTERM / SIGINT arrives and exits 1; with ``exits`` it
exits 1 at once.  ``terminate_client`` always ends it at once, exit 1 (its effect on
a real client process is not recorded: the simulator's old behaviour).

Options:
  --uid N         drop to uid N (and its group, or --gid) before connecting
  --gid N         group to drop to with --uid
  --device LIST   device ordinal(s) the client uses, e.g. ``0`` or ``0,1`` (default: all)
  --timeout S     give up waiting for a server after S seconds (default: wait for ever)
  --once          disconnect right after printing the JSON line

Environment read like a CUDA client: CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (both may only
lower what the server hands out), CUDA_MPS_SM_PARTITION (a static partitioning
daemon's clients must set it).  And the simulator's FAKE_MPS_SHM: ``check`` (the
default) makes the client, once the daemon named its server, look for the server's
``/dev/shm/mps-sim-server.<server pid>`` in its OWN mount namespace, as a real client
must map the server's shared memory; missing: CUDA_ERROR_MPS_CONNECTION_FAILED.
``off`` skips that.  Any other value: a message on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import pwd
import select
import signal
import socket
import sys
from typing import Optional

MSG_MAX = 1 << 18
DEFAULT_PIPE_DIR = '/tmp/nvidia-mps'
SUN_PATH_MAX = 107
SHM_DIR = '/dev/shm'  # the same names as mps_common.SHM_DIR / SHM_PREFIX (this script stands alone)
SHM_PREFIX = 'mps-sim-server.'
SHM_MODES = ('check', 'off')
LOSS_MODES = ('lives', 'exits')  # FAKE_MPS_CLIENT_ON_SERVER_LOSS (the same values as mps_common.SWITCHES)

CUDA_ERRORS = {
    'CUDA_ERROR_NO_DEVICE': (100, 'no CUDA-capable device is detected'),
    'CUDA_ERROR_NOT_PERMITTED': (800, 'operation not permitted'),
    'CUDA_ERROR_INVALID_DEVICE': (101, 'invalid device ordinal'),
    'CUDA_ERROR_MPS_CONNECTION_FAILED': (805, 'MPS client failed to connect to the MPS control daemon or the MPS server'),
    'CUDA_ERROR_MPS_RPC_FAILURE': (806, 'the remote procedural call between the MPS server and the MPS client failed'),
    'CUDA_ERROR_MPS_SERVER_NOT_READY': (807, 'MPS server is not ready to accept new MPS client requests'),
    'CUDA_ERROR_MPS_MAX_CLIENTS_REACHED': (808, 'the hardware resources required to create MPS client have been exhausted'),
    'CUDA_ERROR_MPS_CLIENT_TERMINATED': (810, 'the MPS client has been terminated by the server'),
}


def fail(error: str, detail: str = '') -> int:
    """Report a CUDA error the way the helper's callers expect; exit status 1."""
    code, text = CUDA_ERRORS.get(error, (999, 'unknown error'))
    print(json.dumps({'ok': False, 'error': error, 'code': code, 'message': text, 'detail': detail}, sort_keys=True), flush=True)
    print(f'CUDA error {code} ({error}): {text}' + (f' [{detail}]' if detail else ''), file=sys.stderr, flush=True)
    return 1


def drop_to(uid: int, gid: Optional[int]) -> None:
    """Become uid (clients of other users connect as themselves)."""
    if gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def parse_devices(text: Optional[str]) -> Optional[list[int]]:
    """``0,1`` to [0, 1]; None = every device."""
    if text is None:
        return None
    return [int(part) for part in text.split(',') if part.strip()]


def recv(sock: socket.socket) -> Optional[dict]:
    """One message from the daemon; None when the connection ended."""
    try:
        data = sock.recv(MSG_MAX)
    except OSError:
        return None
    if not data:
        return None
    try:
        obj = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def shm_missing(server_pid: object) -> Optional[str]:
    """Why this client cannot reach its server's shared memory (None: it can)."""
    path = os.path.join(SHM_DIR, f'{SHM_PREFIX}{server_pid}')
    if isinstance(server_pid, int) and os.path.exists(path):
        return None
    return (f'{path} not found: this client\'s /dev/shm is not the MPS server\'s '
            '(mount the daemon\'s /dev/shm into the container, or use --ipc=host)')


def main(argv: list[str]) -> int:
    """Connect, report, hold, disconnect."""
    parser = argparse.ArgumentParser(prog='mps-sim-client')
    parser.add_argument('--uid', type=int)
    parser.add_argument('--gid', type=int)
    parser.add_argument('--device')
    parser.add_argument('--timeout', type=float)
    parser.add_argument('--once', action='store_true')
    args = parser.parse_args(argv)
    shm_mode = os.environ.get('FAKE_MPS_SHM', '').strip() or 'check'
    if shm_mode not in SHM_MODES:
        print(f'mps-sim-client: FAKE_MPS_SHM={shm_mode!r}: expected one of {", ".join(SHM_MODES)}', file=sys.stderr, flush=True)
        return 2
    loss_mode = os.environ.get('FAKE_MPS_CLIENT_ON_SERVER_LOSS', '').strip() or 'lives'
    if loss_mode not in LOSS_MODES:
        print(f'mps-sim-client: FAKE_MPS_CLIENT_ON_SERVER_LOSS={loss_mode!r}: expected one of {", ".join(LOSS_MODES)}',
              file=sys.stderr, flush=True)
        return 2
    try:
        devices = parse_devices(args.device)
    except ValueError:
        return fail('CUDA_ERROR_INVALID_DEVICE', f'bad --device {args.device!r}')
    if args.uid is not None:
        try:
            drop_to(args.uid, args.gid)
        except OSError as exc:
            return fail('CUDA_ERROR_MPS_CONNECTION_FAILED', f'cannot become uid {args.uid}: {exc.strerror}')

    stop_r, stop_w = os.pipe()

    def on_signal(_signum: int, _frame: object) -> None:
        os.write(stop_w, b'x')

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY') or DEFAULT_PIPE_DIR
    control = os.path.join(pipe, 'control')
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if len(os.fsencode(control)) > SUN_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, 'File name too long')
        sock.connect(control)
    except OSError as exc:
        return fail('CUDA_ERROR_MPS_CONNECTION_FAILED', f'{control}: {exc.strerror or exc}')
    try:
        with open('/proc/self/cmdline', 'rb') as handle:
            argv = [part.decode(errors='replace') for part in handle.read().split(b'\0') if part]
    except OSError:
        argv = list(sys.argv)
    cmdline = ' '.join(argv)
    # argv0: what r580's ps shows as COMMAND (the interpreter's path for a python client, gpu-evidence probe.txt)
    hello = {'type': 'client', 'devices': devices, 'cmdline': cmdline, 'argv0': argv[0] if argv else '',
             'env_pct': os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'),
             'env_mem': os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'),
             'sm_partition': os.environ.get('CUDA_MPS_SM_PARTITION'),
             'env_priority': os.environ.get('CUDA_MPS_CLIENT_PRIORITY')}
    try:
        sock.send(json.dumps(hello).encode())
    except OSError as exc:
        return fail('CUDA_ERROR_MPS_CONNECTION_FAILED', str(exc))

    ready = select.select([sock, stop_r], [], [], args.timeout)[0]
    if stop_r in ready:
        return 0
    if not ready:
        return fail('CUDA_ERROR_MPS_SERVER_NOT_READY', f'no server after {args.timeout}s')
    reply = recv(sock)
    if reply is None:
        return fail('CUDA_ERROR_MPS_CONNECTION_FAILED', 'the control daemon closed the connection')
    if not reply.get('ok'):
        return fail(str(reply.get('error')), str(reply.get('message', '')))
    if shm_mode == 'check':
        missing = shm_missing(reply.get('server_pid'))
        if missing:
            sock.close()  # the daemon sees the client go, as when it disconnects
            return fail('CUDA_ERROR_MPS_CONNECTION_FAILED', missing)
    print(json.dumps(reply, sort_keys=True), flush=True)
    if args.once:
        sock.close()
        return 0

    watch: list = [sock, stop_r]
    stdin_fd = -1
    try:
        stdin_fd = sys.stdin.fileno() if sys.stdin is not None else -1
        os.fstat(stdin_fd)
        watch.append(stdin_fd)
    except (OSError, ValueError):
        stdin_fd = -1
    lost = False
    while True:
        ready = select.select(watch, [], [])[0]
        if stop_r in ready:
            break
        if sock in ready:
            event = recv(sock)
            error = str(event.get('error')) if event else 'CUDA_ERROR_MPS_RPC_FAILURE'
            detail = str(event.get('message', '')) if event else 'the connection to MPS was lost'
            fail(error, detail)
            if loss_mode == 'exits' or (event or {}).get('scope') == 'client' or stdin_fd < 0:
                return 1
            # its GPU work is gone, the process is not: it waits for the end of its stdin like a healthy one
            lost = True
            watch.remove(sock)
            sock.close()
        if stdin_fd in ready and not os.read(stdin_fd, 65536):
            break
    if not lost:
        sock.close()
    return 1 if lost else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

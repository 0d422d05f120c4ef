# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulator of ``nvidia-cuda-mps-control``: the program.

Run exactly like the real binary: ``python mps_sim.py -d`` / ``-f`` [``-multiuser-server``]
starts the control daemon (implemented in mps_daemon.py); no arguments is the control UI,
which reads commands from stdin, one per line, sends them over one connection and prints
the replies in order.  Behaviour follows ``shared/mps-reference.md``; every point the
reference marks unknown is a ``FAKE_MPS_*`` switch documented in README.md.

Standard library only.  Servers are real child processes (mps_server.py, argv[0]
``nvidia-cuda-mps-server``); clients are real processes (mps_client.py).
"""
from __future__ import annotations

import os
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mps_common import (  # noqa: E402  pylint: disable=wrong-import-position
    CONTROL, DEFAULT_PIPE_DIR, NO_DAEMON, SUN_PATH_MAX, SwitchError, recv_msg, send_msg, switch,
)

USAGE = """Usage: nvidia-cuda-mps-control [-d | -f] [-multiuser-server]
  -d                  start the MPS control daemon in the background
  -f                  start the MPS control daemon in the foreground (log to stdout)
  -multiuser-server   one root MPS server shared by all users (root only, with -d or -f)
  -h, --help          show this help
Without arguments: read control commands from stdin, one per line."""


# --------------------------------------------------------------------------
# Control UI: no arguments
# --------------------------------------------------------------------------

GARBAGE = b'\x1b[?1049h\x00\xff\xfeMPS\x01\x02 \xc3\x28 ctl\x9f\x92\x96 ?? \r\n\x00garbage\x07\n'


def run_ui() -> int:
    """Read commands from stdin, send them over one connection, print the replies in order."""
    try:
        stream_name = switch('FAKE_MPS_NO_DAEMON_STREAM')
        fault = switch('FAKE_MPS_FAULT_UI')
        dropped_rc = 1 if switch('FAKE_MPS_UI_DROPPED') == 'fail' else 0
    except SwitchError as exc:
        print(f'nvidia-cuda-mps-control (simulator): {exc}', file=sys.stderr)
        return 2
    pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY') or DEFAULT_PIPE_DIR
    control = os.path.join(pipe, CONTROL)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if len(os.fsencode(control)) > SUN_PATH_MAX:
            raise OSError('path too long')
        sock.connect(control)
    except OSError:
        print(NO_DAEMON, file=sys.stderr if stream_name == 'stderr' else sys.stdout, flush=True)
        return 1
    send_msg(sock, {'type': 'ui'})
    data = sys.stdin.buffer.read().decode(errors='replace')
    commands = [line.rstrip('\r') for line in data.split('\n') if line.strip()]
    out = sys.stdout.buffer
    answered = 0
    for command in commands:
        if not send_msg(sock, {'cmd': command}):
            break
        reply = recv_msg(sock)
        if reply is None:
            break
        answered += 1
        text = str(reply.get('out', ''))
        if fault != 'none':
            out.write(GARBAGE)
            out.flush()
            if fault == 'crash':
                signal.signal(signal.SIGSEGV, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGSEGV)
            continue
        if text:
            out.write(text.encode() + b'\n')
            out.flush()
    if send_msg(sock, {'bye': True}):
        recv_msg(sock)
    sock.close()
    # the daemon closed the session before answering every command (it died, or quit without an
    # answer): what it did answer is printed; the status is FAKE_MPS_UI_DROPPED's
    return dropped_rc if answered < len(commands) else 0


def main(argv: list[str]) -> int:
    """Entry point with the real binary's argv."""
    args = argv[1:]
    if not args:
        return run_ui()
    if any(a in ('-h', '--help', '-help') for a in args):
        print(USAGE, flush=True)
        return 0
    known = {'-d', '-f', '-multiuser-server'}
    if any(a not in known for a in args) or len(set(args)) != len(args):
        print(USAGE, flush=True)
        return 1
    background, foreground = '-d' in args, '-f' in args
    if background == foreground:
        print(USAGE, flush=True)
        return 1
    import mps_daemon  # pylint: disable=import-outside-toplevel  # the UI stays light
    return mps_daemon.start_daemon(foreground, '-multiuser-server' in args)


if __name__ == '__main__':
    sys.exit(main(sys.argv))

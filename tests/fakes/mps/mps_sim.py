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
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mps_common import (  # noqa: E402  pylint: disable=wrong-import-position
    CONTROL, DEFAULT_PIPE_DIR, NO_DAEMON, SUN_PATH_MAX, SwitchError, recv_msg, send_msg, switch,
)
import mps_partitions  # noqa: E402  pylint: disable=wrong-import-position
import mps_v3  # noqa: E402  pylint: disable=wrong-import-position

# FAKE_MPS_USAGE=short: the simulator's own usage text (its answer before r580 was recorded)
USAGE = """Usage: nvidia-cuda-mps-control [-d | -f] [-multiuser-server]
  -d                  start the MPS control daemon in the background
  -f                  start the MPS control daemon in the foreground (log to stdout)
  -multiuser-server   one root MPS server shared by all users (root only, with -d or -f)
  -h, --help          show this help
Without arguments: read control commands from stdin, one per line."""

# FAKE_MPS_USAGE=r580: r580's help text, byte for byte (gpu-evidence probe2.txt, after its "Unrecognized option" line)
R580_HELP = (
    'CUDA MPS Control for Linux/Unix/QNX.\n'
    'Copyright (C) 2003 - 2025 NVIDIA Corporation.\n'
    '\n'
    '  This program allows multiple CUDA processes to share a single GPU context. For information on how to use'
    ' the CUDA MPS, see the nvidia-cuda-mps-control manual page.\n'
    '\n'
    'nvidia-cuda-mps-control [options] [command]\n'
    'OPTIONS:\n'
    '  -h,--help                Print this message\n'
    '  -d,--daemon              Setup the daemon in the background\n'
    '  -f,--forground           Setup the daemon in the foreground\n'
    '  -M,--multiuser-server    Enable multi-user mode\n'
    '  -q,--ready-devices      Prepare the daemon to query devices on startup\n'
    '\n'
    'COMMAND:\n'
    '  start_server -uid <user id>\n'
    '                       Start a new instance of nvidia-cuda-mps-server with the given user ID\n'
    '  quit\n'
    '                       Terminate the controller\n'
    '  get_server_list\n'
    '                       Print out a list of servers\n'
    '  get_server_status <PID>\n'
    '                       Print out the status of the server\n'
    '  get_client_list <PID>\n'
    '                       List the client applications connected to the server\n'
    '  get_device_client_list [<PID>]\n'
    '                       List the devices and their client applications\n'
    '  ps [-p PID]\n'
    '                       Report a snapshot of the current client processes\n'
    '  set_default_active_thread_percentage <percentage>\n'
    '                       Set default active thread percentage for upcoming servers\n'
    '  get_default_active_thread_percentage\n'
    '                       Query the current default available thread percentage\n'
    '  set_active_thread_percentage <PID> <percentage>\n'
    '                       Override the active thread percentage of the MPS server\n'
    '  get_active_thread_percentage <PID>\n'
    '                       Query the current active thread percentage of the MPS server\n'
    '  set_default_device_pinned_mem_limit <dev> <value>\n'
    '                       Set default device pinned memory for upcoming servers\n'
    '  get_default_device_pinned_mem_limit <dev>\n'
    '                       Query the current default pinned memory limit for the device\n'
    '  set_device_pinned_mem_limit <PID> <dev> <value>\n'
    '                       Override the device pinned memory limit for MPS servers\n'
    '  get_device_pinned_mem_limit <PID> <dev>\n'
    '                       Query the current device pinned memory limit of the MPS server for the device\n'
    '  set_default_client_priority <priority>\n'
    '                       Sets default client priority for incoming clients\n'
    '  get_default_client_priority\n'
    '                       Query the current priority value that will be used for new clients\n'
    '  terminate_client <server PID> <client PID>\n'
    '                       Terminate all the outstanding GPU work of the MPS client process running on the MPS server\n'
    '  device_query [<PID>] [--csv]\n'
    '                       Enumerate all usable devices\n'
    '\n'
)
# r580 printed this line, its last byte a NUL, before the help for an option it did not know (probe2.txt: -S, -p)
UNRECOGNIZED_OPTION = b'Unrecognized option \x00\n'
# r580's options (its help text; -multiuser-server from the strings of the binary), by what each does
R580_OPTIONS = {
    '-h': 'help', '--help': 'help', '-d': '-d', '--daemon': '-d', '-f': '-f', '--forground': '-f',
    '-M': '-multiuser-server', '--multiuser-server': '-multiuser-server', '-multiuser-server': '-multiuser-server',
    '-q': '-q', '--ready-devices': '-q',
}


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


def run_v3_ui(words: list[str]) -> int:
    """A v3 command given as arguments (``server list --format=csv``), or ``quit`` for ``-q``: one request on the main
    socket; the reply printed, its status returned. A v2 daemon reads it as a legacy command line [ref 1.1, I]."""
    pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY') or DEFAULT_PIPE_DIR
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(os.path.join(pipe, CONTROL))
    except OSError:
        print(NO_DAEMON, file=sys.stderr, flush=True)
        return 1
    send_msg(sock, {'type': 'ui'})
    send_msg(sock, {'v3': words})
    reply = recv_msg(sock)
    if reply is not None and send_msg(sock, {'bye': True}):
        recv_msg(sock)
    sock.close()
    if reply is None:
        return 0 if words == ['quit'] else 1
    text = str(reply.get('out', ''))
    if text:
        sys.stdout.write(text + '\n')
        sys.stdout.flush()
    return int(reply.get('rc', 0))


def v3_arguments(args: list[str]) -> tuple[Optional[int], dict, list[str]]:
    """A v3 binary's own options (13040 and later): (exit status when refused, {protocol, apply, quit, module words},
    the arguments left for the legacy parser). ``-m`` is ``-M``."""
    found: dict = {'protocol': None, 'apply': None, 'quit': False, 'words': []}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in mps_v3.MODULES:
            found['words'] = args[i:]
            break
        if arg in ('-p', '--protocol', '-a', '--apply'):
            if i + 1 >= len(args) or (arg in ('-p', '--protocol') and args[i + 1] not in ('2', '3')):
                sys.stdout.write(r580_help())
                sys.stdout.flush()
                return 1, found, []
            found['protocol' if arg in ('-p', '--protocol') else 'apply'] = args[i + 1]
            i += 2
            continue
        if arg in ('-q', '--quit'):
            found['quit'] = True
        elif arg in ('-m', '--multiuser'):
            rest.append('-multiuser-server')
        else:
            rest.append(arg)
        i += 1
    return None, found, rest


def binary_version() -> str:
    """The simulated binary's version: NVML's CUDA driver version of FAKE_NVML_CONFIG (13000 on r580), '0' when unknown."""
    import mps_daemon  # pylint: disable=import-outside-toplevel
    return mps_daemon.driver_versions(mps_daemon.read_config(os.environ.get('FAKE_NVML_CONFIG') or None))[1]


def static_options() -> dict[str, str]:
    """The options of static partitioning, where the binary has them (13010 and later; inferred, mps_partitions.py)."""
    if not mps_partitions.supported(binary_version()):
        return {}
    return {'-S': '-S', '--static-partitioning': '-S', '-v': 'version', '--version': 'version'}


def r580_help() -> str:
    """r580's help text; without its client priority commands where the binary has none (FAKE_MPS_CLIENT_PRIORITY);
    with the options and commands of static partitioning where it has them (binary 13010 and later)."""
    base = mps_partitions.with_help(R580_HELP) if static_options() else R580_HELP
    if mps_v3.supported(binary_version()):
        base = mps_v3.with_help(base)
    if switch('FAKE_MPS_CLIENT_PRIORITY') == 'supported':
        return base
    lines = base.split('\n')
    drop = {n for n, line in enumerate(lines) if line.strip().startswith(('set_default_client_priority', 'get_default_client_priority'))}
    return '\n'.join(line for n, line in enumerate(lines) if n not in drop and n - 1 not in drop)


def r580_options(args: list[str]) -> tuple[Optional[int], list[str]]:
    """FAKE_MPS_USAGE=r580: (exit status when the help text was printed, else None; the options as -d/-f/... words).

    ``-h``/``--help``: the help, exit 0. An option r580 does not know: ``Unrecognized option``, the help, exit 0,
    nothing started (gpu-evidence probe2.txt). ``-q`` is accepted and does nothing here.
    """
    words = []
    known = dict(R580_OPTIONS, **static_options())
    for arg in args:
        word = known.get(arg)
        if word == 'version':
            sys.stdout.write(mps_partitions.version_text(binary_version()))
            sys.stdout.flush()
            return 0, []
        if word == 'help' or (word is None and arg.startswith('-')):
            out = sys.stdout.buffer
            if word is None:
                out.write(UNRECOGNIZED_OPTION)
            out.write(r580_help().encode())
            out.flush()
            return 0, []
        words.append(word or arg)
    return None, [w for w in words if w != '-q']


def main(argv: list[str]) -> int:
    """Entry point with the real binary's argv."""
    args = argv[1:]
    if not args:
        return run_ui()
    try:
        style = switch('FAKE_MPS_USAGE')
    except SwitchError as exc:
        print(f'nvidia-cuda-mps-control (simulator): {exc}', file=sys.stderr)
        return 2
    usage = USAGE + '\n' if style == 'short' else r580_help()
    v3: dict = {'protocol': None, 'apply': None, 'quit': False, 'words': []}
    if mps_v3.supported(binary_version()):
        code, v3, args = v3_arguments(args)
        if code is not None:
            return code
        if v3['words']:
            return run_v3_ui(v3['words'])
        if v3['quit'] and not args:
            return run_v3_ui(['quit'])
    if style == 'r580':
        code, args = r580_options(args)
        if code is not None:
            return code
    elif any(a in ('-h', '--help', '-help') for a in args):
        print(USAGE, flush=True)
        return 0
    else:
        args = [static_options().get(a, a) if static_options().get(a) == '-S' else a for a in args]
    # not recorded on r580 (a command word, -d with -f, an option twice, -M alone): the help text, exit 1
    known = {'-d', '-f', '-multiuser-server'} | ({'-S'} if static_options() else set())
    background, foreground = '-d' in args, '-f' in args
    if any(a not in known for a in args) or len(set(args)) != len(args) or background == foreground:
        sys.stdout.write(usage)
        sys.stdout.flush()
        return 1
    import mps_daemon  # pylint: disable=import-outside-toplevel  # the UI stays light
    # CUDA_MPS_PROTOCOL_VERSION wins over -p [ref 1.1]; -a only with protocol 3 [I]
    protocol = (os.environ.get('CUDA_MPS_PROTOCOL_VERSION', '').strip() or v3['protocol'] or '2') if mps_v3.supported(binary_version()) else '2'
    if protocol not in ('2', '3') or (v3['apply'] and protocol != '3') or v3['quit']:
        sys.stdout.write(usage)
        sys.stdout.flush()
        return 1
    return mps_daemon.start_daemon(foreground, '-multiuser-server' in args, '-S' in args, protocol=int(protocol),
                                   apply=os.path.abspath(v3['apply']) if v3['apply'] else None)


if __name__ == '__main__':
    sys.exit(main(sys.argv))

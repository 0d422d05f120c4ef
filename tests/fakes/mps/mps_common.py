# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared by the MPS simulator's UI (mps_sim.py) and daemon (mps_daemon.py): names, switches, messages.

Kept light (no heavy imports): every control UI call loads it.
"""
from __future__ import annotations

import json
import os
import socket

DEFAULT_PIPE_DIR = '/tmp/nvidia-mps'
DEFAULT_LOG_DIR = '/var/log/nvidia-mps'
SUN_PATH_MAX = 107
MSG_MAX = 1 << 18

CONTROL = 'control'
CONTROL_PRIVILEGED = 'control_privileged'
CONTROL_LOCK = 'control_lock'
LOG_FIFO = 'log'
PID_FILE = 'nvidia-cuda-mps-control.pid'
PIPE_FILES = (CONTROL, CONTROL_LOCK, CONTROL_PRIVILEGED, LOG_FIFO, PID_FILE)

ALREADY_RUNNING = 'An instance of this daemon is already running'
NO_DAEMON = 'Cannot find MPS control daemon process'
# -d on r580 with a missing log directory / pipe directory (gpu-evidence compare.json, step 'start' of the real binary)
NO_LOGS = 'Warning: Failed writing log files to directory [{log}]. No logs will be available.'
NO_PIPE_DIR = 'Cannot access CUDA_MPS_PIPE_DIRECTORY={pipe}'
MAX_SERVER_START_ATTEMPTS = 6

# The client/server rendezvous in /dev/shm (FAKE_MPS_SHM): mps_server.py and mps_client.py
# keep their own copy of these two names (both stand alone, standard library only).
SHM_DIR = '/dev/shm'
SHM_PREFIX = 'mps-sim-server.'


# --------------------------------------------------------------------------
# Switches (FAKE_MPS_*): every [U] item of the reference.  Documented in README.md.
# --------------------------------------------------------------------------

SWITCHES: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (default, allowed values; empty tuple = free-form, validated elsewhere)
    'FAKE_MPS_MISSING_DIRS': ('fail', ('fail', 'create')),
    'FAKE_MPS_QUIT_REMOVES': ('r580', ()),
    'FAKE_MPS_NO_DAEMON_STREAM': ('stderr', ('stdout', 'stderr')),
    'FAKE_MPS_ERROR_STYLE': ('r580', ('r580', 'text', 'alt', 'silent')),
    'FAKE_MPS_USAGE': ('r580', ('r580', 'short')),
    'FAKE_MPS_SERVER_CMD_OUTPUT': ('none', ('none', 'pid')),
    'FAKE_MPS_UNSET_MEM_LIMIT': ('empty', ('0M', '0', 'empty', 'N/A', 'No limit')),
    'FAKE_MPS_PRIORITY_OUTPUT': ('number', ('number', 'echo', 'name')),
    # missing: a binary without client priority (its two commands unrecognized, absent from its help text)
    'FAKE_MPS_CLIENT_PRIORITY': ('supported', ('supported', 'missing')),
    'FAKE_MPS_PS_FORMAT': ('r580', ('r580', 'spaces')),
    'FAKE_MPS_DEVICE_CLIENT_LIST_FORMAT': ('r580', ('r580', 'uuid', 'pairs')),
    'FAKE_MPS_CLIENT_LIST_SEP': ('newline', ('newline', 'space')),
    'FAKE_MPS_ENV_PINNED_MEM': ('default', ('default', 'servers', 'ignored')),
    'FAKE_MPS_MEM_READBACK': ('lossy', ('lossy', 'exact', 'unparseable')),
    'FAKE_MPS_UUID_LIMITS': ('ignored', ('ignored', 'applied')),
    'FAKE_MPS_BIND_FAILURE': ('silent', ('silent', 'error')),
    'FAKE_MPS_PIPE_DIR_MAX': ('87', ()),  # bytes, a non-negative integer (validated by mps_daemon.DaemonConfig)
    'FAKE_MPS_LONG_PIPE': ('r580', ('r580', 'forum')),
    'FAKE_MPS_LOCK_KIND': ('posix', ('posix', 'ofd', 'flock', 'hidden')),
    'FAKE_MPS_UI_DROPPED': ('fail', ('fail', 'ok')),
    'FAKE_MPS_QUIT_REPLY': ('answer', ('answer', 'drop')),
    'FAKE_MPS_SERVER_INIT_DELAY': ('0', ()),
    'FAKE_MPS_FAULT_HANG': ('0', ('0', '1')),
    'FAKE_MPS_FAULT_QUIT_HANG': ('0', ('0', '1')),
    'FAKE_MPS_FAULT_UI': ('none', ('none', 'garbage', 'crash')),
    'FAKE_MPS_FAULT_KILL_ON': ('', ()),  # a UI command name (mps_daemon.UI_COMMANDS); empty = off
    'FAKE_MPS_SHM': ('check', ('check', 'off')),
    # lspart's layout (binary 13010 and later, not recorded): NVIDIA's documented example ('docs', '-' placeholders) or
    # the five-number rows client code parses ('code')
    'FAKE_MPS_LSPART': ('code', ('code', 'docs')),
    # MPS v3 (binary 13040 and later, mps_v3.py; none recorded): an error in the -a file ends the start or skips the
    # item; how a CSV list quotes a cell with commas (a multi-GPU allowed-devices); which spelling `get` takes for
    # pipe-directory; what a v3 daemon answers to a legacy (stdin) command
    'FAKE_MPS_V3_CONFIG_ERROR': ('abort', ('abort', 'skip')),
    'FAKE_MPS_V3_LIST_QUOTE': ('quoted', ('quoted', 'semicolon')),
    'FAKE_MPS_V3_FIELD_SPELLING': ('dash', ('dash', 'underscore')),
    'FAKE_MPS_V3_LEGACY_UI': ('refuse', ('refuse', 'serve')),
    # an int where the -a file's examples quote a string (active_thread_percentage = 40): an error, or taken as the string
    'FAKE_MPS_V3_CONFIG_INTS': ('refuse', ('refuse', 'accept')),
    # read by each mps_client.py process (it keeps its own copy of the values: it stands alone)
    'FAKE_MPS_CLIENT_ON_SERVER_LOSS': ('lives', ('lives', 'exits')),
}


class SwitchError(ValueError):
    """A FAKE_MPS_* variable holds a value the simulator does not know."""


def switch(name: str, environ: dict[str, str] | None = None) -> str:
    """Value of a FAKE_MPS_* switch (empty or unset = default); unknown values raise SwitchError."""
    env = os.environ if environ is None else environ
    default, allowed = SWITCHES[name]
    value = env.get(name, '').strip() or default
    if allowed and value not in allowed:
        raise SwitchError(f'{name}={value!r}: expected one of {", ".join(allowed)}')
    return value


def quit_removes(value: str) -> tuple[str, ...]:
    """Pipe-dir entries a clean quit removes, from FAKE_MPS_QUIT_REMOVES."""
    presets = {
        # what r580 left after a quit (gpu-evidence probe.txt): the sockets and the lock file stay
        'r580': (LOG_FIFO, PID_FILE),
        'all': PIPE_FILES,
        'none': (),
        'all-but-lock': tuple(n for n in PIPE_FILES if n != CONTROL_LOCK),
        'sockets': (CONTROL, CONTROL_PRIVILEGED),
    }
    if value in presets:
        return presets[value]
    names = tuple(n.strip() for n in value.split(',') if n.strip())
    unknown = [n for n in names if n not in PIPE_FILES]
    if unknown or not names:
        raise SwitchError(f'FAKE_MPS_QUIT_REMOVES={value!r}: expected r580, all, none, all-but-lock, sockets or a comma list of {", ".join(PIPE_FILES)}')
    return names


# --------------------------------------------------------------------------
# Messages on the SEQPACKET sockets: one JSON object per packet
# --------------------------------------------------------------------------

def send_msg(sock: socket.socket, obj: dict) -> bool:
    """Send one message; False when the peer is gone."""
    try:
        sock.send(json.dumps(obj).encode())
        return True
    except OSError:
        return False


def recv_msg(sock: socket.socket) -> dict | None:
    """Receive one message; None on EOF, error or garbage."""
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

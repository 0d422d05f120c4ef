# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The control daemon of the MPS simulator (``nvidia-cuda-mps-control -d`` / ``-f``).

Loaded by mps_sim.py only to start a daemon.  Holds the lock on ``control_lock``,
listens on ``control`` / ``control_privileged`` (SOCK_SEQPACKET), copies what servers
write on the ``log`` FIFO to server.log, writes control.log, runs the UI commands,
starts servers (mps_server.py child processes, one per uid) and attaches clients
(mps_client.py connections) to them.  See README.md for the model and the switches.
"""
from __future__ import annotations

import configparser
import ctypes
import datetime
import fcntl
import json
import math
import os
import pwd
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO

PR_SET_NAME = 15  # prctl(2)

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_SCRIPT = os.path.join(HERE, 'mps_server.py')
sys.path.insert(0, HERE)

from mps_common import (  # noqa: E402  pylint: disable=wrong-import-position
    ALREADY_RUNNING, CONTROL, CONTROL_LOCK, CONTROL_PRIVILEGED, LOG_FIFO, MAX_SERVER_START_ATTEMPTS, MSG_MAX, NO_LOGS, NO_PIPE_DIR,
    PID_FILE, SUN_PATH_MAX, DEFAULT_LOG_DIR, DEFAULT_PIPE_DIR, SwitchError, quit_removes, recv_msg, send_msg, switch,
)
from mps_partitions import Partition, StaticPartitions, supported as partitions_supported  # noqa: E402  pylint: disable=wrong-import-position
from mps_v3 import ProtocolThree  # noqa: E402  pylint: disable=wrong-import-position

# --------------------------------------------------------------------------
# GPUs: the [gpuN] sections of FAKE_NVML_CONFIG, filtered by CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------

# MPS clients per GPU (reference section 4): 16 before Volta, 48 from Volta on, 60 on the drivers
# whose documentation says so (r590, CUDA 13.1: "increased from 48")
MAX_CLIENTS_PRE_VOLTA = 16
MAX_CLIENTS_VOLTA = 48
MAX_CLIENTS_R590 = 60
DRIVER_60_CLIENTS = 590
# control.log's third start line, `CUDA MPS Control binary version: <n>`, is seen from r580 on (section 7)
DRIVER_BINARY_VERSION_LINE = 580
# From R570 CUDA enumerates one compute instance per GPU instance (several MIG devices, whole GPUs beside
# them); before it, one MIG device per process and no whole GPU once a MIG device is visible (MIG user guide) [C]
DRIVER_MIG_PER_GI = 570


class Gpu:  # pylint: disable=too-few-public-methods
    """One GPU of the fake host, as the INI file describes it."""

    def __init__(self, index: int, uuid: str, name: str, memory_total_mib: int, cc_major: int, cc_minor: int,  # pylint: disable=too-many-positional-arguments
                 compute_mode: str = 'default', driver_major: int = 0) -> None:
        self.index = index
        # A MIG device (set by load_gpus): its MIG index, GPU instance, compute instance, slices, the parent's slots
        self.mig: Optional[tuple[int, int, int]] = None
        self.ci_slices = 0
        self.max_slices = 7
        self.mig_devices: list['Gpu'] = []
        self.mig_mode = False
        self.parent_uuid = ''
        self.uuid = uuid
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.cc_major = cc_major
        self.cc_minor = cc_minor
        self.compute_mode = compute_mode
        self.driver_major = driver_major

    def __repr__(self) -> str:
        return f'Gpu({self.index}, {self.uuid}, {self.name!r}, cc {self.compute_capability})'

    @property
    def pre_volta(self) -> bool:
        """Compute capability below 7.0: legacy MPS (no limits, 16 clients)."""
        return (self.cc_major, self.cc_minor) < (7, 0)

    @property
    def max_clients(self) -> int:
        """MPS clients per GPU: 16 before Volta (compute capability 7.0), 48 from Volta on, 60 from driver r590.

        On a MIG device the cap is "lowered proportionally to the Compute Instance size" (MIG user guide) [C];
        rounded down, at least 1 [I].
        """
        if self.pre_volta:
            return MAX_CLIENTS_PRE_VOLTA
        cap = MAX_CLIENTS_R590 if self.driver_major >= DRIVER_60_CLIENTS else MAX_CLIENTS_VOLTA
        if self.mig is not None:
            return max(1, cap * self.ci_slices // self.max_slices)
        return cap

    @property
    def compute_capability(self) -> str:
        """Compute capability as ``major.minor``."""
        return f'{self.cc_major}.{self.cc_minor}'


def read_config(path: Optional[str]) -> Optional[configparser.ConfigParser]:
    """Parse the INI GPU set; None when unset or unreadable (a host without a loaded driver)."""
    if not path:
        return None
    parser = configparser.ConfigParser(inline_comment_prefixes=(';', '#'), interpolation=None)
    try:
        with open(path, encoding='utf-8') as handle:
            parser.read_file(handle)
    except (OSError, configparser.Error, UnicodeDecodeError):
        return None
    return parser


def driver_versions(parser: Optional[configparser.ConfigParser]) -> tuple[int, str]:
    """(driver major, CUDA driver version as NVML reports it, e.g. 13000) from [system]; (0, '0') when unknown."""
    if parser is None or not parser.has_section('system'):
        return 0, '0'
    system = parser['system']
    match = re.match(r'\s*(\d+)', system.get('driver_version', ''))
    cuda = system.get('cuda_driver_version', '0').strip()
    return (int(match.group(1)) if match else 0), (cuda if cuda.isdigit() else '0')


def load_gpus(path: Optional[str]) -> list[Gpu]:
    """The GPUs of FAKE_NVML_CONFIG in index order (sections gpu0, gpu1, ... contiguous)."""
    parser = read_config(path)
    if parser is None:
        return []
    driver_major = driver_versions(parser)[0]
    gpus: list[Gpu] = []
    index = 0
    while parser.has_section(f'gpu{index}'):
        sec = parser[f'gpu{index}']
        major, minor = 0, 0
        match = re.fullmatch(r'\s*(\d+)(?:\.(\d+))?\s*', sec.get('compute_capability', '0.0'))
        if match:
            major, minor = int(match.group(1)), int(match.group(2) or 0)
        try:
            mem = int(sec.get('memory_total_mib', '0'))
        except ValueError:
            mem = 0
        gpu = Gpu(index=index, uuid=sec.get('uuid', f'GPU-{index:08x}-0000-0000-0000-000000000000').strip(),
                  name=sec.get('name', 'NVIDIA GPU').strip(), memory_total_mib=mem,
                  cc_major=major, cc_minor=minor, compute_mode=sec.get('compute_mode', 'default').strip().lower(),
                  driver_major=driver_major)
        if sec.get('mig_mode', '').strip().lower() in ('enabled', 'true', 'yes', 'on', '1'):
            gpu.mig_mode = True
            gpu.mig_devices = _load_migs(parser, gpu, int(sec.get('max_mig_devices', '7')))
        gpus.append(gpu)
        index += 1
    return gpus


def _load_migs(parser: configparser.ConfigParser, gpu: Gpu, max_slices: int) -> list[Gpu]:
    """The [gpuN.migM] sections of a GPU in MIG mode, as devices of their own (the fake NVML's format)."""
    migs: list[Gpu] = []
    while parser.has_section(f'gpu{gpu.index}.mig{len(migs)}'):
        sec = parser[f'gpu{gpu.index}.mig{len(migs)}']
        profile = sec.get('profile', '1g.10gb').strip()
        match = re.fullmatch(r'(?:(\d+)c\.)?(\d+)g\.\d+gb', profile)
        mig = Gpu(index=gpu.index, uuid=sec.get('uuid', '').strip(), name=f'{gpu.name} MIG {profile}',
                  memory_total_mib=int(sec.get('memory_total_mib', '0')), cc_major=gpu.cc_major, cc_minor=gpu.cc_minor,
                  compute_mode='default', driver_major=gpu.driver_major)
        mig.mig = (len(migs), int(sec.get('gpu_instance_id', '0')), int(sec.get('compute_instance_id', '0')))
        mig.ci_slices = int(sec.get('compute_instance_slices') or (match and (match.group(1) or match.group(2))) or 1)
        mig.max_slices = max_slices
        mig.parent_uuid = gpu.uuid
        migs.append(mig)
    return migs


def _match_visible_entry(gpus: list[Gpu], entry: str) -> Optional[Gpu]:
    if entry[:4].upper() == 'MIG-':
        return _match_mig(gpus, entry)
    if re.fullmatch(r'\d+', entry):
        idx = int(entry)
        return gpus[idx] if idx < len(gpus) and not gpus[idx].mig_mode else None
    if entry[:4].upper() == 'GPU-':
        found = [g for g in gpus if g.uuid.lower().startswith(entry.lower())]
        return found[0] if len(found) == 1 and not found[0].mig_mode else None
    return None


def _match_mig(gpus: list[Gpu], entry: str) -> Optional[Gpu]:
    """``MIG-<uuid>`` (drivers >= R470) or the legacy ``MIG-GPU-<gpu uuid>/<gi>/<ci>`` (R450/R460) [C]."""
    legacy = re.fullmatch(r'MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)', entry)
    for gpu in gpus:
        for mig in gpu.mig_devices:
            if legacy and gpu.uuid.lower() == legacy.group(1).lower() and mig.mig and mig.mig[1:] == (int(legacy.group(2)), int(legacy.group(3))):
                return mig
            if not legacy and mig.uuid.lower() == entry.lower():
                return mig
    return None


def visible_gpus(gpus: list[Gpu], cuda_visible_devices: Optional[str]) -> list[Gpu]:
    """Apply CUDA_VISIBLE_DEVICES as CUDA does.

    Entries are indices, full UUIDs or unique UUID prefixes (``GPU-...``) and MIG devices
    (``MIG-...``), in the order given; the first invalid (unknown, ambiguous, duplicate) entry
    ends the list.  Unset means every GPU not in MIG mode and, from R570, the first compute
    instance of each GPU instance; an empty string means none. MIG rules of the MIG user guide
    [C]: before R570 a process enumerates one MIG device only, and no whole GPU beside it; from
    R570 one compute instance per GPU instance, whole GPUs too.
    """
    if cuda_visible_devices is None:
        seen = [device for gpu in gpus for device in (gpu.mig_devices if gpu.mig_mode else [gpu])]
    else:
        seen = []
        for raw in cuda_visible_devices.split(','):
            gpu = _match_visible_entry(gpus, raw.strip())
            if gpu is None or gpu in seen:
                break
            seen.append(gpu)
    migs = [gpu for gpu in seen if gpu.mig is not None]
    if not migs:
        return seen
    if any(gpu.driver_major < DRIVER_MIG_PER_GI for gpu in migs):
        return migs[:1]
    first_per_gi: dict[tuple[str, int], Gpu] = {}
    for mig in migs:
        assert mig.mig is not None
        first_per_gi.setdefault((mig.parent_uuid, mig.mig[1]), mig)
    return [gpu for gpu in seen if gpu.mig is None or first_per_gi.get((gpu.parent_uuid, gpu.mig[1])) is gpu]


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------

PCT_RE = re.compile(r'(?:\d+(?:\.\d*)?|\.\d+)')
UUID_RE = re.compile(r'(?:GPU|MIG)-\S+', re.IGNORECASE)  # a DEV argument in UUID form (any UUID: not checked)
MEM_RE = re.compile(r'(\d+)([MG])')


def parse_percentage(text: str) -> Optional[float]:
    """An active thread percentage (0 < p <= 100), or None when invalid."""
    if not PCT_RE.fullmatch(text):
        return None
    value = float(text)
    if not math.isfinite(value) or value <= 0 or value > 100:
        return None
    return value


def format_percentage(value: float) -> str:
    """Percentages read back with one decimal."""
    return f'{value:.1f}'


def parse_mem(text: str) -> Optional[int]:
    """``<int>M`` or ``<int>G`` to MiB, or None when invalid."""
    match = MEM_RE.fullmatch(text)
    if not match:
        return None
    value = int(match.group(1))
    return value * 1024 if match.group(2) == 'G' else value


def format_mem(mib: int, mode: str = 'lossy') -> str:
    """Readback of a memory limit: lossy (whole GiB floored from 1 GiB on) or exact MiB."""
    if mode == 'exact' or mib < 1024:
        return f'{mib}M'
    return f'{mib // 1024}G'


# --------------------------------------------------------------------------
# Sockets and logs
# --------------------------------------------------------------------------

def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize('3i'))
    pid, uid, gid = struct.unpack('3i', raw)
    return pid, uid, gid


def log_line(kind: str, pid: int, message: str) -> str:
    """``[YYYY-MM-DD HH:MM:SS.mmm Control %5d] message`` (kind: Control, Server, Other)."""
    now = datetime.datetime.now()
    return f'[{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d} {kind} {pid:5d}] {message}'


# --------------------------------------------------------------------------
# Errors of UI commands
# --------------------------------------------------------------------------

ERROR_TEXTS: dict[str, tuple[str, str]] = {
    # kind: (style "text", style "alt")
    'unknown': ('Unrecognized command: {cmd}', 'Error: unknown command'),
    'usage': ('Invalid arguments for {cmd}', 'Error: invalid number of arguments'),
    'value': ('Invalid value: {value}', 'Error: invalid value'),
    'server': ('Server with PID {pid} not found', 'Error: invalid server PID'),
    'client': ('Client with PID {pid} not found on server {server}', 'Error: invalid client PID'),
    'device': ('Invalid device: {dev}', 'Error: invalid device'),
    'uid': ('Invalid user id: {uid}', 'Error: invalid uid'),
    'busy': ('A server for user {uid} is active with clients', 'Error: server busy'),
    'denied': ('Permission denied: {cmd} requires root', 'Error: permission denied'),
}
# Style r580: the texts the real r580 binary printed (gpu-evidence probe.txt, "unknown + bad"); every other kind
# keeps the "text" style's text (not recorded). A bad percentage is not an error there: the value in force is printed.
R580_TEXTS: dict[str, str] = {
    'unknown': 'Unknown command "{cmd}"',
}


# name -> Daemon method; the one list of the UI's commands (FAKE_MPS_FAULT_KILL_ON is checked against it)
# What a binary without client priority (FAKE_MPS_CLIENT_PRIORITY=missing) does not know.
PRIORITY_COMMANDS = ('set_default_client_priority', 'get_default_client_priority')
# What a binary before 13010 (CUDA 13.1) does not know.
PARTITION_COMMANDS = ('sm_partition', 'lspart')
UI_COMMANDS: dict[str, str] = {
    'get_server_list': 'cmd_get_server_list',
    'get_server_status': 'cmd_get_server_status',
    'start_server': 'cmd_start_server',
    'shutdown_server': 'cmd_shutdown_server',
    'get_client_list': 'cmd_get_client_list',
    'quit': 'cmd_quit',
    'set_default_active_thread_percentage': 'cmd_set_default_pct',
    'get_default_active_thread_percentage': 'cmd_get_default_pct',
    'set_active_thread_percentage': 'cmd_set_pct',
    'get_active_thread_percentage': 'cmd_get_pct',
    'set_default_device_pinned_mem_limit': 'cmd_set_default_mem',
    'get_default_device_pinned_mem_limit': 'cmd_get_default_mem',
    'set_device_pinned_mem_limit': 'cmd_set_mem',
    'get_device_pinned_mem_limit': 'cmd_get_mem',
    'set_default_client_priority': 'cmd_set_default_priority',
    'get_default_client_priority': 'cmd_get_default_priority',
    'terminate_client': 'cmd_terminate_client',
    'ps': 'cmd_ps',
    'get_device_client_list': 'cmd_get_device_client_list',
    # static SM partitions: binary 13010 (CUDA 13.1) and later only (mps_partitions.py, inferred)
    'sm_partition': 'cmd_sm_partition',
    'lspart': 'cmd_lspart',
    # simulator-only commands (never sent by the collection; see README.md)
    'sim_devices': 'cmd_sim_devices',
    'sim_state': 'cmd_sim_state',
    'sim_fault_server': 'cmd_sim_fault_server',
}


class CmdError(Exception):
    """A rejected UI command."""

    def __init__(self, kind: str, **fields: object) -> None:
        super().__init__(kind)
        self.kind = kind
        self.fields = fields

    def render(self, style: str) -> Optional[str]:
        """The error text of the configured style (None for silent)."""
        if style == 'silent':
            return None
        text, alt = ERROR_TEXTS[self.kind]
        if style == 'r580':
            if 'in_force' in self.fields:  # a rejected percentage: r580 answers with the value still in force
                return str(self.fields['in_force'])
            text = R580_TEXTS.get(self.kind, text)
        return (alt if style == 'alt' else text).format(**self.fields)


# --------------------------------------------------------------------------
# Daemon state
# --------------------------------------------------------------------------

MemKey = tuple[str, object]  # ('ord', 0) or ('uuid', 'GPU-...')

# struct flock on 64-bit Linux (l_type, l_whence, l_start, l_len, l_pid, padding): F_OFD_SETLK takes it
FLOCK_STRUCT = 'hhqqi4x'
# FAKE_MPS_LOCK_KIND=hidden: the abstract socket name, followed by control_lock's device:inode
HIDDEN_LOCK_PREFIX = 'nvidia-mps-sim-lock.'


class DaemonConfig:  # pylint: disable=too-many-instance-attributes
    """Everything the daemon reads from its environment at start (plain attributes, see from_env)."""

    pipe_dir: str
    log_dir: str
    gpus: list[Gpu]
    all_gpus: list[Gpu]
    nvml_config: Optional[str]
    driver_major: int
    cuda_version: str
    env_pct: Optional[float]
    env_mem: dict[int, int]
    env_priority: int
    missing_dirs: str
    quit_removes: tuple[str, ...]
    error_style: str
    server_cmd_output: str
    unset_mem: str
    priority_output: str
    client_priority: str
    ps_format: str
    device_client_list_format: str
    client_list_sep: str
    env_pinned_mem: str
    mem_readback: str
    uuid_limits: str
    bind_failure: str
    pipe_dir_max: int
    long_pipe: str
    lock_kind: str
    quit_reply: str
    server_init_delay: float
    fault_hang: bool
    fault_quit_hang: bool
    fault_kill_on: str
    shm: str
    lspart: str
    v3_config_error: str
    v3_list_quote: str
    v3_field_spelling: str
    v3_legacy_ui: str
    v3_config_ints: str

    def __init__(self, **values: object) -> None:
        self.__dict__.update(values)

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> DaemonConfig:
        """Read the daemon's environment (raises SwitchError on a bad FAKE_MPS_* value)."""
        env = dict(os.environ if environ is None else environ)
        nvml = env.get('FAKE_NVML_CONFIG') or None
        all_gpus = load_gpus(nvml)
        gpus = visible_gpus(all_gpus, env.get('CUDA_VISIBLE_DEVICES'))
        try:
            delay = float(switch('FAKE_MPS_SERVER_INIT_DELAY', env))
        except ValueError as exc:
            raise SwitchError(f'FAKE_MPS_SERVER_INIT_DELAY={env.get("FAKE_MPS_SERVER_INIT_DELAY")!r}: expected seconds') from exc
        pipe_max = switch('FAKE_MPS_PIPE_DIR_MAX', env)
        if not pipe_max.isdigit():
            raise SwitchError(f'FAKE_MPS_PIPE_DIR_MAX={pipe_max!r}: expected a number of bytes')
        kill_on = switch('FAKE_MPS_FAULT_KILL_ON', env)
        if kill_on and kill_on not in UI_COMMANDS:
            raise SwitchError(f'FAKE_MPS_FAULT_KILL_ON={kill_on!r}: expected the name of a control command '
                              '(e.g. set_default_active_thread_percentage) or nothing')
        env_pct = parse_percentage(env.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '').strip())
        prio = env.get('CUDA_MPS_CLIENT_PRIORITY', '').strip()
        driver_major, cuda_version = driver_versions(read_config(nvml))
        return cls(
            pipe_dir=env.get('CUDA_MPS_PIPE_DIRECTORY') or DEFAULT_PIPE_DIR,
            log_dir=env.get('CUDA_MPS_LOG_DIRECTORY') or DEFAULT_LOG_DIR,
            gpus=gpus, all_gpus=all_gpus, nvml_config=nvml, driver_major=driver_major, cuda_version=cuda_version,
            env_pct=env_pct,
            env_mem=parse_env_mem(env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', ''), gpus),
            env_priority=int(prio) if prio in ('0', '1') else 0,
            missing_dirs=switch('FAKE_MPS_MISSING_DIRS', env),
            quit_removes=quit_removes(switch('FAKE_MPS_QUIT_REMOVES', env)),
            error_style=switch('FAKE_MPS_ERROR_STYLE', env),
            server_cmd_output=switch('FAKE_MPS_SERVER_CMD_OUTPUT', env),
            unset_mem=switch('FAKE_MPS_UNSET_MEM_LIMIT', env),
            priority_output=switch('FAKE_MPS_PRIORITY_OUTPUT', env),
            client_priority=switch('FAKE_MPS_CLIENT_PRIORITY', env),
            ps_format=switch('FAKE_MPS_PS_FORMAT', env),
            device_client_list_format=switch('FAKE_MPS_DEVICE_CLIENT_LIST_FORMAT', env),
            client_list_sep=switch('FAKE_MPS_CLIENT_LIST_SEP', env),
            env_pinned_mem=switch('FAKE_MPS_ENV_PINNED_MEM', env),
            mem_readback=switch('FAKE_MPS_MEM_READBACK', env),
            uuid_limits=switch('FAKE_MPS_UUID_LIMITS', env),
            bind_failure=switch('FAKE_MPS_BIND_FAILURE', env),
            pipe_dir_max=int(pipe_max),
            long_pipe=switch('FAKE_MPS_LONG_PIPE', env),
            lock_kind=switch('FAKE_MPS_LOCK_KIND', env),
            quit_reply=switch('FAKE_MPS_QUIT_REPLY', env),
            server_init_delay=max(0.0, delay),
            fault_hang=switch('FAKE_MPS_FAULT_HANG', env) == '1',
            fault_quit_hang=switch('FAKE_MPS_FAULT_QUIT_HANG', env) == '1',
            fault_kill_on=kill_on,
            shm=switch('FAKE_MPS_SHM', env),
            lspart=switch('FAKE_MPS_LSPART', env),
            v3_config_error=switch('FAKE_MPS_V3_CONFIG_ERROR', env),
            v3_list_quote=switch('FAKE_MPS_V3_LIST_QUOTE', env),
            v3_field_spelling=switch('FAKE_MPS_V3_FIELD_SPELLING', env),
            v3_legacy_ui=switch('FAKE_MPS_V3_LEGACY_UI', env),
            v3_config_ints=switch('FAKE_MPS_V3_CONFIG_INTS', env),
        )


def parse_env_mem(text: str, gpus: list[Gpu]) -> dict[int, int]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=1G,1=2G``; keys ordinals or UUIDs) to {ordinal: MiB}."""
    out: dict[int, int] = {}
    for item in text.split(','):
        key, sep, value = item.strip().partition('=')
        mib = parse_mem(value.strip())
        if not sep or mib is None:
            continue
        key = key.strip()
        if key.isdigit() and int(key) < len(gpus):
            out[int(key)] = mib
        else:
            for ordinal, gpu in enumerate(gpus):
                if gpu.uuid.lower() == key.lower():
                    out[ordinal] = mib
    return out


class ClientRec:  # pylint: disable=too-many-instance-attributes,too-few-public-methods
    """An MPS client: a connection from a client process (pending or attached to a server)."""

    def __init__(self, pid: int, uid: int, conn: socket.socket, cmdline: str, namespace: str) -> None:
        self.pid = pid
        self.uid = uid
        self.conn = conn
        self.cmdline = cmdline
        self.argv0 = cmdline.split(' ', 1)[0]  # what r580's ps shows as COMMAND (see handle_client)
        self.namespace = namespace
        self.devices: list[int] = []
        self.env_pct: Optional[float] = None
        self.env_mem: dict[int, int] = {}
        self.state = 'pending'  # pending | attached | gone
        self.server: Optional[ServerRec] = None
        self.context_id = 0
        self.pct = 100.0
        self.mem: dict[int, Optional[int]] = {}
        self.priority = 0
        self.partition: Optional[Partition] = None  # its CUDA_MPS_SM_PARTITION on a static daemon
        self.env_priority: Optional[str] = None  # protocol 3: its CUDA_MPS_CLIENT_PRIORITY
        self.v3_route: tuple[str, str] = ('', '')  # protocol 3: (server, namespace)


class ServerRec:  # pylint: disable=too-many-instance-attributes,too-few-public-methods
    """An MPS server: a real child process (mps_server.py)."""

    def __init__(self, proc: subprocess.Popen, uid: int, pct: float, mem: dict[MemKey, int], priority: int) -> None:
        self.pid = proc.pid
        self.uid = uid
        self.proc = proc
        self.pct = pct
        self.mem = mem
        self.priority = priority
        self.state = 'INITIALIZING'  # INITIALIZING | ACTIVE | FAULT
        self.conn: Optional[socket.socket] = None
        self.clients: list[ClientRec] = []
        self.draining = False
        self.shutdown_sent = False
        self.became_active = False
        self.next_context = 0
        self.exited = False
        self.v3: Any = None  # protocol 3: its named server (mps_v3.Server)


class Daemon(StaticPartitions, ProtocolThree):  # pylint: disable=too-many-public-methods
    """The control daemon: sockets, lock, logs, servers, clients, UI commands."""

    def __init__(self, cfg: DaemonConfig, multiuser: bool, foreground: bool, static: bool = False,  # pylint: disable=too-many-arguments
                 protocol: int = 2, apply: Optional[str] = None) -> None:
        self.cfg = cfg
        # -p 3 (mps_v3.py): named servers and namespaces; apply: the -a file, read once at start
        self.protocol = protocol
        self.apply = apply
        self.v3_init()
        self.multiuser = multiuser
        # -S: static SM partitions (mps_partitions.py)
        self.static = static
        self.partitions: list[Partition] = []
        self.foreground = foreground
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.log_lock = threading.Lock()
        self.servers: dict[int, ServerRec] = {}
        self.pending: list[ClientRec] = []
        self.default_pct = cfg.env_pct if cfg.env_pct is not None else 100.0
        self.default_mem: dict[MemKey, int] = {}
        if cfg.env_pinned_mem == 'default':
            self.default_mem = {('ord', k): v for k, v in cfg.env_mem.items()}
        self.default_priority = cfg.env_priority
        self.quitting = False
        self.quit_done = False
        self.start_failures: dict[int, int] = {}
        # a legacy (pre-Volta) daemon: every device it sees is below compute capability 7.0
        self.legacy = bool(cfg.gpus) and all(g.pre_volta for g in cfg.gpus)
        self.pid_namespace = _pid_namespace(self.pid)
        self.lock_fd = -1
        self.instance_sock: Optional[socket.socket] = None  # FAKE_MPS_LOCK_KIND=hidden
        self.fifo_fd = -1
        self.control_log: Optional[TextIO] = None
        self.server_log: Optional[TextIO] = None
        self.listeners: list[socket.socket] = []
        self.wake_r, self.wake_w = -1, -1
        self.finished = threading.Event()
        # UI sessions that sent quit and have not had their answer yet: the process ends only when every one has
        # (two quits both return, as on a real daemon)
        self.quit_sessions = 0
        self.replied = threading.Condition()
        self.commands: dict[str, Callable[[list[str], bool], Optional[str]]] = {
            name: getattr(self, method) for name, method in UI_COMMANDS.items()
            if (cfg.client_priority == 'supported' or name not in PRIORITY_COMMANDS)
            and (partitions_supported(cfg.cuda_version) or name not in PARTITION_COMMANDS)}
        self.privileged_commands = {
            'start_server', 'shutdown_server', 'quit', 'terminate_client', 'sim_fault_server',
            'set_default_active_thread_percentage', 'set_active_thread_percentage',
            'set_default_device_pinned_mem_limit', 'set_device_pinned_mem_limit', 'set_default_client_priority',
            'sm_partition',
        }

    # ---------------------------------------------------------------- paths, logs

    def path(self, name: str) -> str:
        """A path in the pipe directory."""
        return os.path.join(self.cfg.pipe_dir, name)

    def log(self, message: str, pid: Optional[int] = None) -> None:
        """Append a Control line to control.log (and stdout in the foreground)."""
        line = log_line('Control', self.pid if pid is None else pid, message)
        with self.log_lock:
            if self.control_log is not None:
                try:
                    self.control_log.write(line + '\n')
                    self.control_log.flush()
                except OSError:
                    pass
            if self.foreground:
                try:
                    sys.stdout.write(line + '\n')
                    sys.stdout.flush()
                except (OSError, ValueError):
                    pass

    def server_log_write(self, text: str) -> None:
        """Append lines received on the log FIFO to server.log."""
        with self.log_lock:
            if self.server_log is not None:
                try:
                    self.server_log.write(text)
                    self.server_log.flush()
                except OSError:
                    pass

    # ---------------------------------------------------------------- setup

    def setup(self) -> tuple[int, Optional[str]]:
        """Check (or create) the pipe/log dirs, take the lock, bind the sockets.

        Returns (exit code, message for stdout).  Exit code 0: the daemon listens (the message, if any, a warning).
        """
        pipe = self.cfg.pipe_dir
        refusal, warning = self.check_dirs()
        if refusal:
            return 1, refusal
        try:
            self.lock_fd = os.open(self.path(CONTROL_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            return 1, f'Failed to open {self.path(CONTROL_LOCK)}: {exc.strerror}'
        if not self.take_lock():
            self.release_lock()
            return 1, ALREADY_RUNNING
        try:
            os.fchmod(self.lock_fd, 0o666)
        except OSError:
            pass
        too_long = len(os.fsencode(pipe)) > self.cfg.pipe_dir_max
        if too_long and self.cfg.long_pipe == 'forum':
            self.fail_silently()
            return 0, None
        if warning is None:
            try:
                self.control_log = open(os.path.join(self.cfg.log_dir, 'control.log'), 'a', encoding='utf-8')  # pylint: disable=consider-using-with
                self.server_log = open(os.path.join(self.cfg.log_dir, 'server.log'), 'a', encoding='utf-8')  # pylint: disable=consider-using-with
            except OSError as exc:
                if self.cfg.missing_dirs == 'create':
                    return 1, f'Failed to open log files in {self.cfg.log_dir}: {exc.strerror}'
                warning = NO_LOGS.format(log=self.cfg.log_dir)  # [I]: as a missing log dir
        control = self.path(CONTROL)
        self.log(f'Starting control daemon using socket {control}')
        for name in (CONTROL, CONTROL_PRIVILEGED, LOG_FIFO, PID_FILE):
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.log(f'Failed to remove stale {self.path(name)}: {exc.strerror}')
        if too_long:
            return self.fail_long_pipe()
        if len(os.fsencode(control)) > SUN_PATH_MAX:
            self.log(f'Failed to bind socket {control}: File name too long')
            return (1 if self.cfg.bind_failure == 'error' else 0), (f'Failed to bind socket {control}' if self.cfg.bind_failure == 'error' else None)
        try:
            ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            ctl.bind(control)
            os.chmod(control, 0o666)
            ctl.listen(128)
            priv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            # the privileged socket's path is 11 bytes longer than control's: bind it relative to the pipe dir
            cwd = os.open('.', os.O_RDONLY)
            try:
                os.chdir(pipe)
                priv.bind(CONTROL_PRIVILEGED)
            finally:
                os.fchdir(cwd)
                os.close(cwd)
            os.chmod(self.path(CONTROL_PRIVILEGED), 0o755)
            priv.listen(128)
        except OSError as exc:
            self.log(f'Failed to bind socket {control}: {exc.strerror or exc}')
            return (1 if self.cfg.bind_failure == 'error' else 0), (f'Failed to bind socket {control}' if self.cfg.bind_failure == 'error' else None)
        self.listeners = [ctl, priv]
        try:
            os.mkfifo(self.path(LOG_FIFO), 0o777)
            os.chmod(self.path(LOG_FIFO), 0o777)
            self.fifo_fd = os.open(self.path(LOG_FIFO), os.O_RDWR | os.O_CLOEXEC)
            fd = os.open(self.path(PID_FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            os.write(fd, str(self.pid).encode())
            os.fchmod(fd, 0o666)
            os.close(fd)
        except OSError as exc:
            self.log(f'Failed to set up {pipe}: {exc.strerror}')
            return 1, f'Failed to set up {pipe}: {exc.strerror}'
        if self.protocol == 3:  # v3's wording (V3I) [ref 1.1]
            self.log(f'To connect CUDA applications to this daemon, set CUDA_MPS_PIPE_DIRECTORY={pipe}')
        else:
            self.log(f'To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}')
        if self.cfg.driver_major >= DRIVER_BINARY_VERSION_LINE:
            self.log(f'CUDA MPS Control binary version: {self.cfg.cuda_version}')
        self.wake_r, self.wake_w = os.pipe()
        threading.Thread(target=self.fifo_reader, daemon=True).start()
        if self.protocol == 3 and self.apply:
            with self.lock:
                refusal = self.v3_apply(self.apply)
            if refusal:  # FAKE_MPS_V3_CONFIG_ERROR=abort [I]: the start ends, nothing of the file stays running
                self.log(refusal)
                with self.lock:
                    for server in list(self.v3.values()):
                        self._remove_server(server)
                        if server.rec is not None:
                            server.rec.proc.kill()
                return 1, refusal
        return 0, warning

    def check_dirs(self) -> tuple[Optional[str], Optional[str]]:
        """(why the start ends, the warning to print) for the pipe and log dirs, per FAKE_MPS_MISSING_DIRS.

        ``fail``: r580 creates neither (gpu-evidence compare.json, 'start'): a missing log dir is a warning, a
        missing pipe dir the end, printed between two warnings when both are missing. ``create``: both created.
        """
        if self.cfg.missing_dirs == 'create':
            try:
                os.makedirs(self.cfg.pipe_dir, mode=0o755, exist_ok=True)
                os.makedirs(self.cfg.log_dir, mode=0o755, exist_ok=True)
            except OSError as exc:
                return f'Failed to create directory: {exc.strerror}', None
            return None, None
        warning = None if os.path.isdir(self.cfg.log_dir) else NO_LOGS.format(log=self.cfg.log_dir)
        pipe = self.cfg.pipe_dir
        if not (os.path.isdir(pipe) and os.access(pipe, os.W_OK | os.X_OK)):
            return '\n'.join(line for line in (warning, NO_PIPE_DIR.format(pipe=pipe), warning) if line), None
        return None, warning

    def take_lock(self) -> bool:
        """The single-instance check on the open control_lock, of the kind FAKE_MPS_LOCK_KIND names.

        False when another live daemon holds it.  Every kind is released by the kernel when the
        daemon dies, so a SIGKILLed daemon's leftovers never block the next one.
        """
        kind = self.cfg.lock_kind
        try:
            if kind == 'posix':  # /proc/locks: POSIX, the daemon's pid
                fcntl.lockf(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif kind == 'ofd':  # /proc/locks: OFDLCK, pid -1 (the lock belongs to the open file, not a process)
                fcntl.fcntl(self.lock_fd, fcntl.F_OFD_SETLK, struct.pack(FLOCK_STRUCT, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            elif kind == 'flock':  # /proc/locks: FLOCK
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:  # hidden: nothing in /proc/locks; an abstract socket named after the file is as exclusive
                st = os.fstat(self.lock_fd)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    sock.bind(f'\0{HIDDEN_LOCK_PREFIX}{st.st_dev}:{st.st_ino}'.encode())
                except OSError:
                    sock.close()
                    raise
                self.instance_sock = sock
        except OSError:
            return False
        return True

    def release_lock(self) -> None:
        """Close control_lock (which drops any kind of lock on it) and the hidden kind's socket."""
        if self.instance_sock is not None:
            self.instance_sock.close()
            self.instance_sock = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def fail_silently(self) -> None:
        """A pipe dir longer than FAKE_MPS_PIPE_DIR_MAX: what the forum report shows after such a start.

        The daemon got as far as the lock and the log FIFO, then failed to bind without a word:
        no log line, no sockets, no pid file, no process left; -d's parent still exits 0.
        """
        for name in (CONTROL, CONTROL_PRIVILEGED, LOG_FIFO, PID_FILE):
            try:
                os.unlink(self.path(name))
            except OSError:
                pass
        try:
            os.mkfifo(self.path(LOG_FIFO), 0o777)
            os.chmod(self.path(LOG_FIFO), 0o777)
        except OSError:
            pass
        self.release_lock()

    def fail_long_pipe(self) -> tuple[int, Optional[str]]:
        """A pipe dir longer than FAKE_MPS_PIPE_DIR_MAX under FAKE_MPS_LONG_PIPE=r580 (gpu-evidence probe.txt, len=88).

        r580 logged its two first start lines, left the log FIFO beside control_lock and exited 1 without a word.
        """
        try:
            os.mkfifo(self.path(LOG_FIFO), 0o777)
            os.chmod(self.path(LOG_FIFO), 0o777)
        except OSError:
            pass
        self.log(f'To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={self.cfg.pipe_dir}')
        self.close_logs()
        self.release_lock()
        return 1, None

    def fifo_reader(self) -> None:
        """Copy what servers write on <pipe>/log into server.log, line by line."""
        buf = b''
        while True:
            try:
                data = os.read(self.fifo_fd, 65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            if b'\n' in buf:
                head, _sep, buf = buf.rpartition(b'\n')
                self.server_log_write(head.decode(errors='replace') + '\n')

    # ---------------------------------------------------------------- main loop

    def serve(self) -> None:
        """Accept connections until quit; then clean up."""
        while True:
            ready = select.select([*self.listeners, self.wake_r], [], [])[0]
            if self.wake_r in ready:
                break
            for listener in ready:
                try:
                    conn = listener.accept()[0]
                except OSError:
                    continue
                threading.Thread(target=self.handle_conn, args=(conn,), daemon=True).start()
        self.finish()
        self.finished.set()
        with self.replied:  # let every quitting UI get its answer before the process ends
            self.replied.wait_for(lambda: self.quit_sessions == 0, 5.0)

    def finish(self) -> None:
        """Clean exit after quit: remove the files FAKE_MPS_QUIT_REMOVES names, release the lock."""
        for listener in self.listeners:
            listener.close()
        for name in self.cfg.quit_removes:
            try:
                os.unlink(self.path(name))
            except OSError:
                pass
        self.log('Exit with status 0')
        self.close_logs()
        self.release_lock()

    def close_logs(self) -> None:
        """Close control.log and server.log."""
        with self.log_lock:
            for handle in (self.control_log, self.server_log):
                if handle is not None:
                    try:
                        handle.close()
                    except OSError:
                        pass
            self.control_log = None
            self.server_log = None

    def request_stop(self) -> None:
        """Wake the accept loop so that it ends."""
        os.write(self.wake_w, b'x')

    def handle_conn(self, conn: socket.socket, route: Optional[tuple[str, str]] = None) -> None:
        """First message says who connects: a UI, a client or a server; ``route``: the v3 server and namespace whose
        socket it came by (None: the main socket)."""
        self.log('Accepting connection...')
        try:
            pid, uid, _gid = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        hello = recv_msg(conn)
        kind = hello.get('type') if hello else None
        try:
            if kind == 'ui':
                self.handle_ui(conn, uid)
            elif kind == 'client' and hello is not None:
                self.handle_client(conn, pid, uid, hello, route)
            elif kind == 'server':
                self.handle_server(conn, pid)
            else:
                self.log('User did not send valid credentials')
        finally:
            try:
                conn.close()
            except OSError:
                pass

    # ---------------------------------------------------------------- UI

    def handle_ui(self, conn: socket.socket, uid: int) -> None:
        """One UI session: commands in order, one reply each, on one connection."""
        self.log('NEW UI')
        if self.cfg.fault_hang:
            try:
                while conn.recv(MSG_MAX):  # accepts, never answers: the UI blocks until killed
                    pass
            except OSError:
                pass
            self.log('UI closed')
            return
        while True:
            msg = recv_msg(conn)
            if msg is None or msg.get('bye'):
                # the UI waits for this answer before it exits: control.log is complete once it is gone
                self.log('UI closed')
                send_msg(conn, {'bye': True})
                return
            if isinstance(msg.get('v3'), list) and self.protocol == 3:
                words = [str(w) for w in msg['v3']]
                self.log(f'Cmd:{" ".join(words)}')
                if words == ['quit']:  # -q/--quit: the daemon and all its servers
                    msg = {'cmd': 'quit'}
                else:
                    with self.lock:
                        code, text = self.v3_execute(words, uid)
                    send_msg(conn, {'out': text, 'rc': code})
                    continue
            elif isinstance(msg.get('v3'), list):  # a v3 verb sent to a v2 daemon is read as v2 input [ref 1.1, I]
                msg = {'cmd': ' '.join(str(w) for w in msg['v3'])}
            elif (isinstance(msg.get('cmd'), str) and self.protocol == 3 and self.cfg.v3_legacy_ui == 'refuse'
                  and not msg['cmd'].startswith('sim_')):  # the simulator's own commands answer on every protocol
                name = (msg['cmd'].split() or [''])[0]
                self.log(f'Cmd:{msg["cmd"]}')
                send_msg(conn, {'out': f'Unknown command "{name}"', 'rc': 0})  # [I]: as r580's unknown word
                continue
            if not isinstance(msg.get('cmd'), str):
                continue
            line = msg['cmd']
            is_quit = line.split()[:1] == ['quit']
            if is_quit:
                with self.replied:
                    self.quit_sessions += 1
            self.log(f'Cmd:{line}')
            if self.cfg.fault_kill_on and line.split()[:1] == [self.cfg.fault_kill_on]:
                self.fault_kill()
            out = self.execute(line, privileged=uid == 0)
            if out:
                for text in out.split('\n'):
                    self.log(text)
            if line.split()[:1] == ['quit'] and self.quit_done:
                # stop listening, remove the files and release the lock BEFORE answering:
                # once quit returns, a new -d on this pipe dir starts at once. control.log ends with
                # `Exit with status 0` (finish), no `UI closed`, as r580's did (gpu-evidence probe3.txt)
                self.request_stop()
                self.finished.wait(10.0)
                if self.cfg.quit_reply == 'answer':  # drop: the UI sees the session end unanswered
                    send_msg(conn, {'out': out or ''})
                try:
                    conn.close()
                except OSError:
                    pass
                with self.replied:
                    self.quit_sessions -= 1
                    self.replied.notify_all()
                return
            if is_quit:  # rejected (usage): answered like any command
                with self.replied:
                    self.quit_sessions -= 1
                    self.replied.notify_all()
            send_msg(conn, {'out': out or ''})

    @staticmethod
    def fault_kill() -> None:
        """FAKE_MPS_FAULT_KILL_ON: die by SIGKILL, as after an external ``kill -9`` (every pipe-dir file stays)."""
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, line: str, privileged: bool) -> Optional[str]:
        """Run one command line; its stdout (None = prints nothing)."""
        words = line.split()
        if not words:
            return None
        name, args = words[0], words[1:]
        try:
            handler = self.commands.get(name)
            if handler is None:
                raise CmdError('unknown', cmd=name)
            if name in self.privileged_commands and not privileged:
                raise CmdError('denied', cmd=name)
            with self.lock:
                return handler(args, privileged)
        except CmdError as err:
            return err.render(self.cfg.error_style)

    # helpers for commands (lock held)

    def _server(self, token: str) -> ServerRec:
        if not re.fullmatch(r'\d+', token):
            raise CmdError('server', pid=token)
        srv = self.servers.get(int(token))
        if srv is None or srv.exited:
            raise CmdError('server', pid=token)
        return srv

    @staticmethod
    def _dev_key(token: str) -> MemKey:
        """The table key of a DEV argument.

        NOT checked against the devices (reference section 3, [C]): any ordinal or UUID is stored
        and read back under itself; only a token that is neither is refused.
        """
        if re.fullmatch(r'\d+', token):
            return ('ord', int(token))
        if UUID_RE.fullmatch(token):
            return ('uuid', token[:4].upper() + token[4:].lower())
        raise CmdError('device', dev=token)

    def _applied_mem(self, table: dict[MemKey, int]) -> dict[int, int]:
        """The limits a server applies, per ordinal of the daemon's devices.

        Keys naming no device of the daemon are ignored.  A UUID key counts only with
        FAKE_MPS_UUID_LIMITS=applied; then the later set of a device's ordinal and UUID wins
        (a table is kept in the order its keys were last set).
        """
        ordinals = {gpu.uuid.lower(): ordinal for ordinal, gpu in enumerate(self.cfg.gpus)}
        out: dict[int, int] = {}
        for (kind, key), mib in table.items():
            if kind == 'ord' and isinstance(key, int) and key < len(self.cfg.gpus):
                out[key] = mib
            elif kind == 'uuid' and self.cfg.uuid_limits == 'applied' and str(key).lower() in ordinals:
                out[ordinals[str(key).lower()]] = mib
        return out

    @staticmethod
    def _set_mem(table: dict[MemKey, int], key: MemKey, mib: int) -> None:
        """Store a limit as the latest one set (see _applied_mem)."""
        table.pop(key, None)
        table[key] = mib

    def _mem_out(self, value: Optional[int]) -> Optional[str]:
        if self.cfg.mem_readback == 'unparseable':
            return 'N/A'
        if value is None:
            return None if self.cfg.unset_mem == 'empty' else self.cfg.unset_mem
        return format_mem(value, self.cfg.mem_readback)

    @staticmethod
    def _nargs(name: str, args: list[str], low: int, high: Optional[int] = None) -> None:
        if len(args) < low or len(args) > (low if high is None else high):
            raise CmdError('usage', cmd=name)

    @staticmethod
    def _pct_arg(token: str, in_force: float) -> float:
        value = parse_percentage(token)
        if value is None:
            raise CmdError('value', value=token, in_force=format_percentage(in_force))
        return value

    @staticmethod
    def _mem_arg(token: str) -> int:
        value = parse_mem(token)
        if value is None:
            raise CmdError('value', value=token)
        return value

    def _alive_servers(self) -> list[ServerRec]:
        return [s for s in self.servers.values() if not s.exited]

    # commands

    def cmd_get_server_list(self, args: list[str], _priv: bool) -> Optional[str]:
        """Server pids, one per line."""
        self._nargs('get_server_list', args, 0)
        return '\n'.join(str(s.pid) for s in self._alive_servers()) or None

    def cmd_get_server_status(self, args: list[str], _priv: bool) -> Optional[str]:
        """INITIALIZING, ACTIVE or FAULT."""
        self._nargs('get_server_status', args, 1)
        return self._server(args[0]).state

    def cmd_start_server(self, args: list[str], _priv: bool) -> Optional[str]:
        """start_server -uid UID."""
        if len(args) != 2 or args[0] != '-uid':
            raise CmdError('usage', cmd='start_server')
        if not re.fullmatch(r'\d+', args[1]) or int(args[1]) > 0x7fffffff:
            raise CmdError('uid', uid=args[1])
        target = 0 if self.multiuser else int(args[1])
        for srv in self._alive_servers():
            if srv.uid == target and not srv.draining:
                return str(srv.pid) if self.cfg.server_cmd_output == 'pid' else None
        others = [s for s in self._alive_servers() if not s.draining]
        if any(s.clients for s in others):
            raise CmdError('busy', uid=others[0].uid)
        for srv in others:
            srv.draining = True
            self._send_shutdown(srv)
        srv = self._spawn_server(target)
        return str(srv.pid) if self.cfg.server_cmd_output == 'pid' else None

    def cmd_shutdown_server(self, args: list[str], _priv: bool) -> Optional[str]:
        """shutdown_server PID [-f]: no new clients; exits once its clients are gone (at once with -f)."""
        self._nargs('shutdown_server', args, 1, 2)
        if len(args) == 2 and args[1] != '-f':
            raise CmdError('usage', cmd='shutdown_server')
        srv = self._server(args[0])
        srv.draining = True
        if len(args) == 2:
            for client in list(srv.clients):
                self._drop_client(client, 'CUDA_ERROR_MPS_SERVER_NOT_READY', 'the MPS server was shut down')
        if not srv.clients:
            self._send_shutdown(srv)
        self._schedule()
        return str(srv.pid) if self.cfg.server_cmd_output == 'pid' else None

    def cmd_get_client_list(self, args: list[str], _priv: bool) -> Optional[str]:
        """Client pids of a server."""
        self._nargs('get_client_list', args, 1)
        srv = self._server(args[0])
        sep = ' ' if self.cfg.client_list_sep == 'space' else '\n'
        return sep.join(str(c.pid) for c in srv.clients) or None

    def cmd_quit(self, args: list[str], _priv: bool) -> Optional[str]:
        """quit [-t SECONDS]: waits for clients (at most SECONDS), stops servers, then the daemon exits."""
        timeout: Optional[float] = None
        if args:
            if len(args) != 2 or args[0] != '-t':
                raise CmdError('usage', cmd='quit')
            if not re.fullmatch(r'\d+', args[1]):
                raise CmdError('value', value=args[1])
            timeout = float(args[1])
        if self.quitting:
            while not self.quit_done:
                self.cond.wait()
            return None
        self.quitting = True
        for client in list(self.pending):
            self._drop_client(client, 'CUDA_ERROR_MPS_CONNECTION_FAILED', 'the MPS control daemon is shutting down')
        if self.cfg.fault_quit_hang:
            while True:
                self.cond.wait()
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.clients for s in self._alive_servers()):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self.cond.wait(remaining)
        for srv in self._alive_servers():
            for client in list(srv.clients):
                self._drop_client(client, 'CUDA_ERROR_MPS_CLIENT_TERMINATED', 'the MPS control daemon was told to quit')
            srv.draining = True
            self.log(f'Try shutting down server {srv.pid}, backoff is disabled')  # r580's line (gpu-evidence probe3.txt)
            self._send_shutdown(srv)
        self._wait_servers_gone(3.0)
        for srv in self._alive_servers():
            try:
                os.kill(srv.pid, signal.SIGKILL)
            except OSError:
                pass
        self._wait_servers_gone(3.0)
        self.quit_done = True
        self.cond.notify_all()
        return None

    def _wait_servers_gone(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self._alive_servers() and time.monotonic() < end:
            self.cond.wait(0.05)

    def cmd_set_default_pct(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default active thread percentage for servers started later; prints the stored value."""
        self._nargs('set_default_active_thread_percentage', args, 1)
        self.default_pct = self._pct_arg(args[0], self.default_pct)
        return format_percentage(self.default_pct)

    def cmd_get_default_pct(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default active thread percentage."""
        self._nargs('get_default_active_thread_percentage', args, 0)
        return format_percentage(self.default_pct)

    def cmd_set_pct(self, args: list[str], _priv: bool) -> Optional[str]:
        """A server's active thread percentage, for clients that connect afterwards."""
        self._nargs('set_active_thread_percentage', args, 2)
        srv = self._server(args[0])
        srv.pct = self._pct_arg(args[1], srv.pct)
        return format_percentage(srv.pct)

    def cmd_get_pct(self, args: list[str], _priv: bool) -> Optional[str]:
        """A server's active thread percentage."""
        self._nargs('get_active_thread_percentage', args, 1)
        return format_percentage(self._server(args[0]).pct)

    def cmd_set_default_mem(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default pinned memory limit of a device (prints nothing)."""
        self._nargs('set_default_device_pinned_mem_limit', args, 2)
        key = self._dev_key(args[0])
        self._set_mem(self.default_mem, key, self._mem_arg(args[1]))
        return None

    def cmd_get_default_mem(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default pinned memory limit of a device (lossy readback)."""
        self._nargs('get_default_device_pinned_mem_limit', args, 1)
        out = self._mem_out(self.default_mem.get(self._dev_key(args[0])))
        if out is None:  # r580 printed nothing and logged this (gpu-evidence probe.txt)
            self.log('No default pinned memory limit set for the device!')
        return out

    def cmd_set_mem(self, args: list[str], _priv: bool) -> Optional[str]:
        """A server's pinned memory limit of a device, for clients that connect afterwards."""
        self._nargs('set_device_pinned_mem_limit', args, 3)
        srv = self._server(args[0])
        key = self._dev_key(args[1])
        self._set_mem(srv.mem, key, self._mem_arg(args[2]))
        return None

    def cmd_get_mem(self, args: list[str], _priv: bool) -> Optional[str]:
        """A server's pinned memory limit of a device."""
        self._nargs('get_device_pinned_mem_limit', args, 2)
        srv = self._server(args[0])
        return self._mem_out(srv.mem.get(self._dev_key(args[1])))

    def _priority_out(self, value: int) -> str:
        if self.cfg.priority_output == 'name':
            return 'BELOW_NORMAL' if value else 'NORMAL'
        return str(value)

    def cmd_set_default_priority(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default client priority, 0 (normal) or 1 (below normal)."""
        self._nargs('set_default_client_priority', args, 1)
        if args[0] not in ('0', '1'):
            raise CmdError('value', value=args[0])
        self.default_priority = int(args[0])
        return self._priority_out(self.default_priority) if self.cfg.priority_output == 'echo' else None

    def cmd_get_default_priority(self, args: list[str], _priv: bool) -> Optional[str]:
        """Default client priority."""
        self._nargs('get_default_client_priority', args, 0)
        return self._priority_out(self.default_priority)

    def cmd_terminate_client(self, args: list[str], _priv: bool) -> Optional[str]:
        """terminate_client SERVER_PID CLIENT_PID: prints 0 on success."""
        self._nargs('terminate_client', args, 2)
        srv = self._server(args[0])
        for client in srv.clients:
            if str(client.pid) == args[1]:
                self._drop_client(client, 'CUDA_ERROR_MPS_CLIENT_TERMINATED', 'the client was terminated by terminate_client',
                                  scope='client')
                self._schedule()
                return '0'
        raise CmdError('client', pid=args[1], server=args[0])

    def cmd_ps(self, args: list[str], _priv: bool) -> Optional[str]:
        """ps [-p SERVER_PID]: a header and a row per client (of that server only with -p)."""
        if args and (len(args) != 2 or args[0] != '-p' or not args[1].isdigit()):
            raise CmdError('usage', cmd='ps')
        r580 = self.cfg.ps_format == 'r580'
        header = ('PID', 'ID', 'SERVER', 'DEVICE', 'NAMESPACE', 'COMMAND')
        rows = [PS_ROW % header if r580 else ' '.join(header)]
        for srv in self._alive_servers():
            if args and str(srv.pid) != args[1]:
                continue
            for client in srv.clients:
                dev = short_uuid(self.cfg.gpus[client.devices[0]].uuid) if client.devices else '-'
                if r580:
                    rows.append(PS_ROW % (client.pid, client.context_id + 1, srv.pid, dev, client.namespace, client.argv0))
                else:
                    rows.append(f'{client.pid} {client.context_id} {srv.pid} {dev} {client.namespace} {client.cmdline}')
        return '\n'.join(rows)

    def cmd_get_device_client_list(self, args: list[str], _priv: bool) -> Optional[str]:
        """get_device_client_list [PID]: devices and the pids of the clients that enumerated them."""
        self._nargs('get_device_client_list', args, 0, 1)
        servers = [self._server(args[0])] if args else self._alive_servers()
        lines = []
        for ordinal, gpu in enumerate(self.cfg.gpus):
            if self.cfg.device_client_list_format == 'r580':
                # `[0] 00:00.0, NVIDIA H200` then `<pid>.<ID>` (gpu-evidence probe.txt); 00:00.0 as recorded (the GPU's
                # bus id was 00:06.0), ID as in ps
                lines.append(f'[{ordinal}] 00:00.0, {gpu.name}')
                lines.extend(f'{c.pid}.{c.context_id + 1}' for s in servers for c in s.clients if ordinal in c.devices)
                continue
            pids = [str(c.pid) for s in servers for c in s.clients if ordinal in c.devices]
            if self.cfg.device_client_list_format == 'pairs':
                lines.extend(f'{gpu.uuid} {pid}' for pid in pids)
            else:
                lines.append(f'{gpu.uuid}: {" ".join(pids)}'.rstrip())
        return '\n'.join(lines) or None

    def cmd_sim_devices(self, args: list[str], _priv: bool) -> Optional[str]:
        """Simulator only: the devices this daemon sees, in ordinal order."""
        self._nargs('sim_devices', args, 0)
        return '\n'.join(f'{i} {g.uuid} {g.compute_capability} {g.max_clients} {g.name}' for i, g in enumerate(self.cfg.gpus)) or None

    def cmd_sim_state(self, args: list[str], _priv: bool) -> Optional[str]:
        """Simulator only: the whole daemon state as one JSON line."""
        self._nargs('sim_state', args, 0)

        def mem_json(mem: dict) -> dict:
            return {str(k[1]) if isinstance(k, tuple) else str(k): v for k, v in mem.items()}

        state = {
            'pid': self.pid, 'multiuser': self.multiuser, 'quitting': self.quitting,
            'devices': [{'ordinal': i, 'index': g.index, 'uuid': g.uuid, 'name': g.name} for i, g in enumerate(self.cfg.gpus)],
            'defaults': {'active_thread_percentage': self.default_pct, 'pinned_mem_limit_mib': mem_json(self.default_mem),
                         'client_priority': self.default_priority},
            'servers': [{'pid': s.pid, 'uid': s.uid, 'state': s.state, 'draining': s.draining,
                         'active_thread_percentage': s.pct, 'pinned_mem_limit_mib': mem_json(s.mem), 'client_priority': s.priority,
                         'clients': [{'pid': c.pid, 'uid': c.uid, 'context_id': c.context_id, 'devices': c.devices,
                                      'active_thread_percentage': c.pct, 'pinned_mem_limit_mib': mem_json(c.mem)} for c in s.clients]}
                        for s in self._alive_servers()],
            'pending': [c.pid for c in self.pending],
            'static_partitioning': self.static,
            'protocol': self.protocol,
            'v3_servers': self.v3_state(),
            'partitions': [{'id': p.value, 'chunks': p.chunks, 'sms': p.sms, 'clients': sorted(p.clients)} for p in self.partitions],
        }
        return json.dumps(state, sort_keys=True)

    def cmd_sim_fault_server(self, args: list[str], _priv: bool) -> Optional[str]:
        """Simulator only: put a server into FAULT (no new clients; exits once its clients are gone and it is needed)."""
        self._nargs('sim_fault_server', args, 1)
        srv = self._server(args[0])
        srv.state = 'FAULT'
        srv.draining = True
        self.log(f'Server {srv.pid} encountered a fatal exception')
        self._schedule()
        return None

    # ---------------------------------------------------------------- servers

    def _spawn_server(self, uid: int) -> ServerRec:
        """Start a server process for a uid (lock held)."""
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        argv = ['nvidia-cuda-mps-server', SERVER_SCRIPT, '--pipe', self.cfg.pipe_dir, '--uid', str(uid), '--gid', str(gid),
                '--delay', str(self.cfg.server_init_delay)]
        # argv[0] is the real server's name, so Python cannot find its prefix from it: say where it is;
        # FAKE_MPS_SHM as validated at start (the server reads it from its environment)
        env = dict(os.environ, PYTHONHOME=f'{sys.base_prefix}:{sys.base_exec_prefix}', FAKE_MPS_SHM=self.cfg.shm)
        proc = subprocess.Popen(argv, executable=sys.executable or '/usr/bin/python3',  # pylint: disable=consider-using-with
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                close_fds=True, cwd='/')
        mem = dict(self.default_mem)
        if self.cfg.env_pinned_mem == 'servers':
            for ordinal, mib in self.cfg.env_mem.items():
                mem.setdefault(('ord', ordinal), mib)
        srv = ServerRec(proc=proc, uid=uid, pct=self.default_pct, mem=mem, priority=self.default_priority)
        self.servers[srv.pid] = srv
        self.log(f'Starting new server {srv.pid} for user {uid}', pid=srv.pid)
        threading.Thread(target=self._reap, args=(srv,), daemon=True).start()
        return srv

    def _reap(self, srv: ServerRec) -> None:
        code = srv.proc.wait()
        with self.lock:
            self._server_exited(srv, code)

    def _server_exited(self, srv: ServerRec, code: int) -> None:
        srv.exited = True
        self.servers.pop(srv.pid, None)
        if code < 0:
            self.log(f'Server {srv.pid} was terminated by signal {-code}')
        else:
            self.log(f'Server {srv.pid} exited with status {code}')
        if srv.conn is not None:
            try:
                srv.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for client in list(srv.clients):
            self._drop_client(client, 'CUDA_ERROR_MPS_RPC_FAILURE', 'the MPS server exited')
        if srv.v3 is not None:
            for client in [c for c in self.pending if c.server is srv]:
                self._drop_client(client, 'CUDA_ERROR_NO_DEVICE', 'the MPS server exited')
            self.v3_server_exited(srv)
            self.cond.notify_all()
            return
        if not srv.became_active:
            failures = self.start_failures.get(srv.uid, 0) + 1
            self.start_failures[srv.uid] = failures
            if failures >= MAX_SERVER_START_ATTEMPTS:
                self.start_failures[srv.uid] = 0
                for client in list(self.pending):
                    if self._target_uid(client) == srv.uid:
                        self._drop_client(client, 'CUDA_ERROR_MPS_CONNECTION_FAILED', 'the MPS server failed to start')
        else:
            self.start_failures[srv.uid] = 0
        self.cond.notify_all()
        if not self.quitting:
            self._schedule()

    def _send_shutdown(self, srv: ServerRec) -> None:
        """Tell a server to exit; one still starting is told when it connects (see handle_server)."""
        if srv.shutdown_sent or srv.exited:
            return
        srv.shutdown_sent = True
        if srv.conn is not None and not send_msg(srv.conn, {'cmd': 'shutdown'}):
            try:
                os.kill(srv.pid, signal.SIGTERM)
            except OSError:
                pass

    def _server_config(self, srv: ServerRec) -> dict:
        fail = None
        modes = {g.index: g.compute_mode for g in load_gpus(self.cfg.nvml_config)}
        gpus = srv.v3.gpus if srv.v3 is not None else self.cfg.gpus  # a named server: its allowed devices
        if not gpus:
            fail = 'no CUDA-capable device is detected'
        elif any(modes.get(g.index) == 'prohibited' for g in gpus):
            fail = 'all CUDA-capable devices are busy or unavailable'
        return {
            'cmd': 'config', 'fail': fail, 'version': self.cfg.cuda_version,
            'devices': [{'ordinal': i, 'name': g.name, 'uuid': g.uuid} for i, g in enumerate(gpus)],
            'pct': srv.pct, 'priority': srv.priority, 'legacy': self.legacy,
            'mem': {str(ordinal): mib for ordinal, mib in sorted(self._applied_mem(srv.mem).items())},
        }

    def handle_server(self, conn: socket.socket, peer_pid: int) -> None:
        """A server process connecting back: configure it, mark it ACTIVE once it says so."""
        with self.lock:
            srv = self.servers.get(peer_pid)
            if srv is None or srv.exited:
                self.log('User did not send valid credentials')
                return
            srv.conn = conn
            if srv.shutdown_sent:
                send_msg(conn, {'cmd': 'shutdown'})
            else:
                send_msg(conn, self._server_config(srv))
        while True:
            msg = recv_msg(conn)
            if msg is None:
                return
            if msg.get('type') == 'started':
                with self.lock:
                    if srv.exited:
                        return
                    if srv.state == 'INITIALIZING':
                        srv.state = 'ACTIVE'
                    srv.became_active = True
                    self.log(f'NEW SERVER {srv.pid}: Ready')
                    self.cond.notify_all()
                    self._schedule()

    # ---------------------------------------------------------------- clients

    def _target_uid(self, client: ClientRec) -> int:
        return 0 if self.multiuser else client.uid

    def _accepting(self, uid: int) -> Optional[ServerRec]:
        for srv in self._alive_servers():
            if srv.uid == uid and not srv.draining and srv.state != 'FAULT':
                return srv
        return None

    def handle_client(self, conn: socket.socket, pid: int, uid: int, hello: dict,  # pylint: disable=too-many-arguments
                      route: Optional[tuple[str, str]] = None) -> None:
        """A CUDA client: wait for a server of its uid (protocol 3: of the socket it came by), attach, then hold until
        it disconnects."""
        devices = hello.get('devices')
        v3_server = None
        if self.protocol == 3:
            with self.lock:
                v3_server, v3_namespace, refused = self.v3_route(route, uid)
            if v3_server is None:
                error = 'CUDA_ERROR_NOT_PERMITTED' if refused == 'operation not permitted' else 'CUDA_ERROR_MPS_CONNECTION_FAILED'
                self.log(f'NEW CLIENT {pid} from user {uid}: {refused}')
                send_msg(conn, {'ok': False, 'error': error, 'message': refused})
                return
        gpus = v3_server.gpus if v3_server is not None else self.cfg.gpus
        ndev = len(gpus)
        if devices is None:
            devices = list(range(ndev))
        env_mem_raw = hello.get('env_mem') or {}
        client = ClientRec(pid=pid, uid=uid, conn=conn, cmdline=str(hello.get('cmdline') or ''), namespace=_pid_namespace(pid))
        if isinstance(hello.get('argv0'), str) and hello['argv0']:
            client.argv0 = hello['argv0']
        if isinstance(hello.get('env_pct'), str):
            client.env_pct = parse_percentage(hello['env_pct'])
        if isinstance(env_mem_raw, str):
            client.env_mem = parse_env_mem(env_mem_raw, gpus)
        if v3_server is not None:
            client.v3_route = (v3_server.name, v3_namespace)
            client.server = v3_server.rec
            client.env_priority = hello.get('env_priority')
        # as real logs show it (reference section 7): a client in another pid namespace (a container)
        # as pid 0, and every client of a -multiuser-server daemon as user 0 (a namespace that cannot
        # be read, '-', is taken for the daemon's own)
        elsewhere = client.namespace not in ('-', self.pid_namespace)
        who = f'NEW CLIENT {0 if elsewhere else pid} from user {0 if self.multiuser else uid}'
        with self.lock:
            if not isinstance(devices, list) or not all(isinstance(d, int) and 0 <= d < ndev for d in devices) or not devices:
                reason = 'no CUDA-capable device is detected' if ndev == 0 else 'invalid device ordinal'
                self.log(f'{who}: {reason}')
                send_msg(conn, {'ok': False, 'error': 'CUDA_ERROR_NO_DEVICE' if ndev == 0 else 'CUDA_ERROR_INVALID_DEVICE', 'message': reason})
                return
            client.devices = sorted(set(devices))
            client.partition, why = self.client_partition(hello.get('sm_partition'), client.devices)
            if why:
                # "Failure to do so will result in context creation failing with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"
                self.log(f'{who}: {why}')
                send_msg(conn, {'ok': False, 'error': 'CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION', 'message': why})
                return
            if self.quitting:
                self.log(f'{who}: daemon is shutting down')
                send_msg(conn, {'ok': False, 'error': 'CUDA_ERROR_MPS_CONNECTION_FAILED', 'message': 'the MPS control daemon is shutting down'})
                return
            if self.multiuser and self.legacy and uid != 0:
                # pre-Volta MPS has no multi-user server: the daemon accepted -multiuser-server, its
                # non-root clients fail cuInit (reference section 4, [O])
                self.log(f'{who}: operation not permitted')
                send_msg(conn, {'ok': False, 'error': 'CUDA_ERROR_NOT_PERMITTED', 'message': 'operation not permitted'})
                return
            if v3_server is not None and (v3_server.gone or v3_namespace not in v3_server.namespaces):
                # deleted between its routing and now: refused as if it had come after
                self.log(f'{who}: its MPS server or namespace is gone')
                send_msg(conn, {'ok': False, 'error': 'CUDA_ERROR_MPS_CONNECTION_FAILED', 'message': 'its MPS server or namespace is gone'})
                return
            srv = client.server if v3_server is not None else self._accepting(self._target_uid(client))
            if srv is not None and srv.state == 'ACTIVE':
                self.log(f'{who}: Server already exists')
            else:
                self.log(f'{who}: Server is not ready, push client to pending list')
            self.pending.append(client)
            self._schedule()
        while recv_msg(conn) is not None:
            pass
        with self.lock:
            if client.state == 'pending':
                self.pending.remove(client)
                client.state = 'gone'
                self._schedule()
            elif client.state == 'attached':
                self._detach(client)
                self._schedule()
            self.cond.notify_all()

    def _attach(self, client: ClientRec, srv: ServerRec) -> None:
        gpus = srv.v3.gpus if srv.v3 is not None else self.cfg.gpus
        if srv.v3 is not None and client.v3_route[1] not in srv.v3.namespaces:
            self._drop_client(client, 'CUDA_ERROR_MPS_CONNECTION_FAILED', 'its MPS namespace was deleted')
            return
        for ordinal in client.devices:
            gpu = gpus[ordinal]
            used = sum(1 for s in self._alive_servers() for c in s.clients
                       if gpu in [(s.v3.gpus if s.v3 is not None else self.cfg.gpus)[d] for d in c.devices])
            if used >= gpu.max_clients:
                self.log(f'Client {client.pid} rejected: maximum number of clients reached on device {ordinal}')
                self._drop_client(client, 'CUDA_ERROR_MPS_MAX_CLIENTS_REACHED',
                                  'the hardware resources required to create MPS client have been exhausted')
                return
        self.pending.remove(client)
        client.state = 'attached'
        client.server = srv
        client.context_id = srv.next_context
        srv.next_context += 1
        client.priority = srv.priority
        if client.partition is not None:
            client.partition.clients.add(client.pid)
        client.mem = {ordinal: None for ordinal in client.devices}
        if srv.v3 is not None:  # its namespace's limits, lowered by its own variables (mps_v3.py)
            self.v3_limits(srv.v3, client.v3_route[1], client, client.env_priority)
        elif self.legacy:  # limits are Volta features: a legacy server applies none
            client.pct = 100.0
        else:
            client.pct = srv.pct if client.env_pct is None else min(srv.pct, client.env_pct)
            applied = self._applied_mem(srv.mem)
            for ordinal in client.devices:
                limits = [v for v in (applied.get(ordinal), client.env_mem.get(ordinal)) if v]
                client.mem[ordinal] = min(limits) if limits else None
        srv.clients.append(client)
        if srv.conn is not None:
            send_msg(srv.conn, {'cmd': 'client_connected', 'pid': client.pid, 'context': client.context_id})
        reply = {
            'ok': True, 'client_pid': client.pid, 'client_uid': client.uid, 'server_pid': srv.pid, 'uid': srv.uid,
            'context_id': client.context_id, 'active_thread_percentage': client.pct, 'client_priority': client.priority,
            'pinned_mem_limit_mib': {str(k): v for k, v in client.mem.items()},
            'devices': [{'ordinal': i, 'uuid': gpus[i].uuid, 'name': gpus[i].name} for i in client.devices],
        }
        if srv.v3 is not None:
            reply.update(server=srv.v3.name, namespace=client.v3_route[1])
        if client.partition is not None:  # a client of a -S daemon: its partition and the SMs it got
            reply.update(sm_partition=client.partition.value, sms=client.partition.sms)
        if not send_msg(client.conn, reply):
            self._detach(client)

    def _detach(self, client: ClientRec) -> None:
        srv = client.server
        client.state = 'gone'
        if client.partition is not None:
            client.partition.clients.discard(client.pid)
        if srv is not None and client in srv.clients:
            srv.clients.remove(client)
            if srv.conn is not None:
                send_msg(srv.conn, {'cmd': 'client_disconnected', 'pid': client.pid, 'context': client.context_id})
        self.cond.notify_all()

    def _drop_client(self, client: ClientRec, error: str, message: str, scope: str = 'server') -> None:
        """End a client's connection from the daemon side (error, terminate, forced quit).

        scope ``client``: the client itself was ended (terminate_client), its process exits whatever
        FAKE_MPS_CLIENT_ON_SERVER_LOSS says; ``server``: it lost its server (or never got one).
        """
        if client.state == 'pending':
            self.pending.remove(client)
            client.state = 'gone'
        elif client.state == 'attached':
            self._detach(client)
        send_msg(client.conn, {'ok': False, 'event': 'terminated', 'error': error, 'message': message, 'scope': scope})
        try:
            client.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.cond.notify_all()

    def _schedule(self) -> None:
        """Attach pending clients; start, retire or switch servers (lock held)."""
        if self.quitting:
            return
        if self.protocol == 3:  # named servers run side by side: a pending client waits only for its own
            for client in list(self.pending):
                if client.server is not None and client.server.state == 'ACTIVE':
                    self._attach(client, client.server)
            for srv in self._alive_servers():
                if srv.draining and not srv.clients:
                    self._send_shutdown(srv)
            return
        switching = False
        for client in list(self.pending):
            target = self._target_uid(client)
            srv = self._accepting(target)
            if srv is not None:
                if srv.state == 'ACTIVE':
                    self._attach(client, srv)
                else:
                    switching = True
                continue
            if switching:
                continue
            switching = True
            others = self._alive_servers()
            for other in others:
                if not other.draining:
                    other.draining = True
            if not others:
                self._spawn_server(target)
        for srv in self._alive_servers():
            if srv.draining and not srv.clients:
                if srv.state == 'FAULT' and not self.pending:
                    continue
                self._send_shutdown(srv)


# ps under FAKE_MPS_PS_FORMAT=r580: the widths of r580's header, `PID       ID        SERVER ...` (gpu-evidence probe.txt);
# the rows padded alike [I]: a COMMAND longer than its 15 columns as is (recorded), a shorter one padded (not recorded)
PS_ROW = '%-10s%-10s%-15s%-26s%-15s%-15s'


def short_uuid(uuid: str) -> str:
    """The UUID as ``ps`` prints it: its first four dash-separated fields (``GPU-cb1213a3-d6a4-be7f``)."""
    return '-'.join(uuid.split('-')[:4])


def _pid_namespace(pid: int) -> str:
    try:
        link = os.readlink(f'/proc/{pid}/ns/pid')
    except OSError:
        return '-'
    match = re.search(r'\[(\d+)\]', link)
    return match.group(1) if match else link


# --------------------------------------------------------------------------
# Daemon start: -d / -f
# --------------------------------------------------------------------------

def start_daemon(foreground: bool, multiuser: bool, static: bool = False, protocol: int = 2,  # pylint: disable=too-many-arguments
                 apply: Optional[str] = None) -> int:
    """``-d`` (parent exits 0 once the daemon listens) or ``-f``; ``static``: ``-S``; ``protocol`` 3 with ``-p 3``,
    ``apply``: the ``-a`` file (mps_v3.py)."""
    try:
        cfg = DaemonConfig.from_env()
    except SwitchError as exc:
        print(f'nvidia-cuda-mps-control (simulator): {exc}', file=sys.stderr)
        return 2
    if multiuser and os.geteuid() != 0:
        print('The -multiuser-server option requires root privileges', flush=True)
        return 1
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # What /proc shows of a real daemon: comm `nvidia-cuda-mps` (its name cut to 15 bytes), the
    # arguments -d / -f, and CUDA_MPS_PIPE_DIRECTORY / CUDA_VISIBLE_DEVICES in its environment. The
    # modules find foreign daemons by these (argv[0] stays the interpreter's: README.md).
    _set_process_name(b'nvidia-cuda-mps')
    if foreground:
        daemon = Daemon(cfg, multiuser, foreground=True, static=static, protocol=protocol, apply=apply)
        code, message = daemon.setup()
        if message:
            print(message, flush=True)
        if code != 0 or not daemon.listeners:
            return code
        daemon.serve()
        return 0
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)  # pylint: disable=protected-access
        _become_daemon(cfg, multiuser, write_fd, static, protocol, apply)
    os.close(write_fd)
    os.waitpid(child, 0)
    data = b''
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    try:
        result = json.loads(data.decode())
    except ValueError:
        return 1
    if result.get('message'):
        print(result['message'], flush=True)
    return int(result.get('rc', 1))


def _set_process_name(name: bytes) -> None:
    """Set comm (what ps -o comm and /proc/PID/comm show), as mps_server.py does for servers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _become_daemon(cfg: DaemonConfig, multiuser: bool, write_fd: int, static: bool = False,  # pylint: disable=too-many-arguments
                   protocol: int = 2, apply: Optional[str] = None) -> None:
    """The grandchild of ``-d``: stdio to /dev/null, set up, report to the parent, serve."""
    code = 1
    try:
        os.chdir('/')
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if null > 2:
            os.close(null)
        # nothing inherited stays open (a caller's pipe would never see EOF), but the report pipe
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, os.sysconf('SC_OPEN_MAX'))
        daemon = Daemon(cfg, multiuser, foreground=False, static=static, protocol=protocol, apply=apply)
        code, message = daemon.setup()
        os.write(write_fd, json.dumps({'rc': code, 'message': message}).encode())
        os.close(write_fd)
        if code == 0 and daemon.listeners:
            daemon.serve()
    except Exception as exc:  # pylint: disable=broad-exception-caught
        try:
            os.write(write_fd, json.dumps({'rc': 1, 'message': f'nvidia-cuda-mps-control (simulator): {exc}'}).encode())
        except OSError:
            pass
        os._exit(1)  # pylint: disable=protected-access
    os._exit(code)  # pylint: disable=protected-access

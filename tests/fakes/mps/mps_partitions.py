# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Static SM partitions of the simulated control daemon (``-S``, ``sm_partition add|rm``, ``lspart``).

INFERRED, not recorded: no real run of a CUDA 13.1+ (r590+) control binary is on record here. What this follows is
NVIDIA's MPS documentation (mpsv2-interface, common-tasks: "Static SM partitioning must be enabled at MPS controller
start time: nvidia-cuda-mps-control -d -S"; Ampere and newer; clients set ``CUDA_MPS_SM_PARTITION``, without it
context creation fails with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) and the output that independent client code
parses (``Partition <uuid>/<id> created``; the failure text ``Failed to fulfill the requested SM partition of N
chunks, error ...``; ``Partition ... in use. Terminate all clients before removing.``). Gated by the simulated driver:
a binary version (NVML's CUDA driver version) below 13010 knows none of it, so r580's recorded answers stay as they
are. What is unknown is a ``FAKE_MPS_*`` switch: the lspart layout (``FAKE_MPS_LSPART``).
"""
from __future__ import annotations

import base64
import hashlib
from typing import Optional

# The first binary version with static partitioning (NVIDIA Isaac ROS checks `nvidia-cuda-mps-control -v` >= 13010;
# "Static partitioning is a new feature from CUDA 13.1")
STATIC_BINARY_VERSION = 13010
# SMs in one chunk: 8 on Hopper and newer discrete GPUs, 4 before (Ampere, Ada) [S: NVIDIA's CUDA 13.1 blog, runs on
# A10 and L40S]; SM counts by model where the INI has no multiprocessor_count
SMS_BY_MODEL = (('H200', 132), ('H100', 132), ('H20', 78), ('GH200', 132), ('B200', 148), ('A100', 108), ('A30', 56),
                ('A10', 72), ('A16', 10), ('L40S', 142), ('L40', 142), ('L4', 58), ('T4', 40), ('V100', 80), ('P100', 56))
INVALID_CONFIG = 'CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION'

# The help text's lines for it (inferred from the documented options and commands; r580's layout)
HELP_OPTIONS = (
    '  -v,--version             Print version of control daemon executable\n'
    '  -S,--static-partitioning Start daemon with static partitioning mode enabled\n'
)
HELP_COMMANDS = (
    '  sm_partition add <device UUID> <number of chunks>\n'
    '                       Create an SM partition with the specified number of chunks on the given device\n'
    '  sm_partition rm <device UUID> <partition>\n'
    '                       Remove the specified SM partition from the given device\n'
    '  lspart\n'
    '                       Display the current SM partitioning configuration\n'
)


def supported(cuda_version: str) -> bool:
    """Whether the simulated binary (its version is NVML's CUDA driver version) has static partitioning."""
    return cuda_version.isdigit() and int(cuda_version) >= STATIC_BINARY_VERSION


def with_help(text: str) -> str:
    """r580's help text with the options and commands of static partitioning added (binary 13010 and later)."""
    text = text.replace('  -q,--ready-devices', HELP_OPTIONS + '  -q,--ready-devices', 1)
    return text.replace('  device_query [<PID>]', HELP_COMMANDS + '  device_query [<PID>]', 1)


def version_text(cuda_version: str) -> str:
    """What ``-v`` prints (the wording NVIDIA's Isaac ROS parses: ``Binary version: <n>``)."""
    return f'NVIDIA CUDA MPS Control Binary version: {cuda_version}\n'


def sm_count(gpu) -> int:  # type: ignore[no-untyped-def]
    if getattr(gpu, 'sm_count', 0):
        return gpu.sm_count
    return next((count for model, count in SMS_BY_MODEL if model in gpu.name), 108)


def chunk_sms(gpu) -> int:  # type: ignore[no-untyped-def]
    return 8 if (gpu.cc_major, gpu.cc_minor) >= (9, 0) else 4


def short(uuid: str) -> str:
    """lspart names a device by a unique partial UUID (``GPU-74d43ed3``)."""
    return uuid[:12]


class Partition:  # pylint: disable=too-few-public-methods
    def __init__(self, uuid: str, ident: str, chunks: int, sms: int) -> None:
        self.uuid = uuid
        self.ident = ident
        self.chunks = chunks
        self.sms = sms
        self.clients: set[int] = set()

    @property
    def value(self) -> str:
        """What a client sets as CUDA_MPS_SM_PARTITION."""
        return f'{self.uuid}/{self.ident}'


class StaticPartitions:
    """Of mps_daemon.Daemon: the partitions of a daemon started with ``-S``. Needs ``cfg``, ``static``, ``pid``."""

    cfg: object
    static: bool
    pid: int
    partitions: list[Partition]

    def _device(self, token: str):  # type: ignore[no-untyped-def]
        """A device of the daemon by UUID or unique partial UUID ("This command accepts unique partial UUIDs")."""
        from mps_daemon import CmdError  # pylint: disable=import-outside-toplevel
        matches = [gpu for gpu in self.cfg.gpus if gpu.uuid == token or (len(token) >= 8 and gpu.uuid.startswith(token))]  # type: ignore[attr-defined]
        if len(matches) != 1:
            raise CmdError('device', dev=token)
        return matches[0]

    def _new_ident(self, uuid: str, chunks: int) -> str:
        """An opaque id as real ones look (base64, 36 characters, slashes possible)."""
        seed = f'{self.pid}:{uuid}:{chunks}:{len(self.partitions)}:{sum(p.chunks for p in self.partitions)}'.encode()
        return base64.b64encode(hashlib.sha256(seed).digest()[:27]).decode()

    def cmd_sm_partition(self, args: list[str], _priv: bool) -> Optional[str]:
        from mps_daemon import CmdError  # pylint: disable=import-outside-toplevel
        if not args or args[0] not in ('add', 'rm'):
            raise CmdError('usage', cmd='sm_partition')
        if not self.static:
            # [I] the wording is not documented: partitions exist only under -S
            return 'Static partitioning is not enabled. Start the control daemon with -S'
        if args[0] == 'add':
            if len(args) != 3 or not args[2].isdigit() or int(args[2]) < 1:
                raise CmdError('usage', cmd='sm_partition')
            gpu = self._device(args[1])
            chunks = int(args[2])
            if (gpu.cc_major, gpu.cc_minor) < (8, 0):
                return f'Failed to fulfill the requested SM partition of {chunks} chunks, error CUDA_ERROR_NOT_SUPPORTED'
            per = chunk_sms(gpu)
            used = sum(p.chunks for p in self.partitions if p.uuid == gpu.uuid)
            if used + chunks > sm_count(gpu) // per:
                return f'Failed to fulfill the requested SM partition of {chunks} chunks, error {INVALID_CONFIG}'
            part = Partition(gpu.uuid, self._new_ident(gpu.uuid, chunks), chunks, chunks * per)
            self.partitions.append(part)
            return f'Partition {part.value} created'
        # rm <uuid> <id>, or (one third-party note) rm <uuid>/<id>
        if len(args) == 2 and '/' in args[1]:
            device, ident = args[1].split('/', 1)
        elif len(args) == 3:
            device, ident = args[1], args[2]
        else:
            raise CmdError('usage', cmd='sm_partition')
        gpu = self._device(device)
        part = next((p for p in self.partitions if p.uuid == gpu.uuid and p.ident == ident), None)
        if part is None:
            return f'Partition {gpu.uuid}/{ident} not found'
        if part.clients:
            return f'Partition {part.value} in use. Terminate all clients before removing.'
        self.partitions.remove(part)
        return None

    def cmd_lspart(self, args: list[str], _priv: bool) -> Optional[str]:
        """The documented table: a row per device (free and used chunks and SMs), then one per partition."""
        from mps_daemon import CmdError  # pylint: disable=import-outside-toplevel
        if args:
            raise CmdError('usage', cmd='lspart')
        if not self.static:
            return 'Static partitioning is not enabled. Start the control daemon with -S'
        docs = self.cfg.lspart == 'docs'  # type: ignore[attr-defined]
        lines = ['GPU Partition free used free used clients', 'chunks chunks SM SM']
        for gpu in self.cfg.gpus:  # type: ignore[attr-defined]
            per = chunk_sms(gpu)
            total = sm_count(gpu) // per
            used = sum(p.chunks for p in self.partitions if p.uuid == gpu.uuid)
            summary = f'{total - used} {used} {(total - used) * per} {used * per}'
            lines.append(f'{short(gpu.uuid)} - {summary} -' if docs else f'{short(gpu.uuid)} {summary}')
            for part in self.partitions:
                if part.uuid == gpu.uuid:
                    in_use = 'Yes' if part.clients else ('-' if docs else 'No')
                    lines.append(f'{short(gpu.uuid)} {part.ident} - {part.chunks} - {part.sms} {in_use}' if docs
                                 else f'{short(gpu.uuid)} {part.ident} {part.chunks} {part.sms} {in_use}')
        return '\n'.join(lines)

    def client_partition(self, value: Optional[str], devices: list[int]) -> tuple[Optional[Partition], Optional[str]]:
        """(the partition a client of a static daemon takes, None) or (None, why its context creation fails)."""
        if not self.static:
            return None, None
        if not value:
            return None, 'CUDA_MPS_SM_PARTITION is not set: every client of a static partitioning daemon must set it'
        device, _sep, ident = value.partition('/')
        for part in self.partitions:
            if part.ident == ident and (part.uuid == device or (len(device) >= 8 and part.uuid.startswith(device))):
                if any(self.cfg.gpus[o].uuid != part.uuid for o in devices):  # type: ignore[attr-defined]
                    return None, f'SM partition {value} is not on the device the client uses'
                return part, None
        return None, f'no SM partition {value}'

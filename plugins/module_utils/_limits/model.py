# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MPS limits as values: sizes, percentages, replicas, and comparison with the daemon's lossy read-back.

MPS forgets ``set_default_*`` on every restart and changes only servers started afterwards, so the wanted
limits of a resource are persisted (``_limits/store.py``) and replayed right after every start.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import typing as t
from dataclasses import dataclass, field

from .._errors import InvalidParameterError
from .._protocol.commands import PRIORITIES, set_default_mem, set_default_percentage, set_default_priority, sm_partition_add
# The read-back parsers are the protocol's; callers still import them from here too.
from .._selectors import resolve_devices

FORMAT_VERSION = 1
EVERY_GPU = '*'
SIZE_FORM = ('a size: a number and the unit M, MiB, G or GiB, such as 20G, 20GiB, 20480M, 20480MiB or 1.5G '
             '(M and MiB are 2^20 bytes, G and GiB 2^30, as MPS reads them)')
# MPS takes M and G, both binary. "GB" and "MB" are refused rather than guessed: to some they are 10^9 and
# 10^6 bytes, and reading "20GB" as 20 GiB (what this collection did before) gives 7% more than meant.
_SIZE = re.compile(r'(?P<number>\d+(?:\.\d+)?)(?P<unit>[MG])(?P<suffix>iB|B)?', re.IGNORECASE)
_PERCENT_TOLERANCE = 0.05
_MIB = 2 ** 20


def parse_size(value: t.Any, param: str) -> int:
    """A size in whole MiB. Plain numbers are refused: the unit must be explicit."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidParameterError(param, '%r is not %s' % (value, SIZE_FORM))
    match = _SIZE.fullmatch(str(value))
    if not match:
        raise InvalidParameterError(param, '%r is not %s' % (value, SIZE_FORM))
    number = float(match.group('number'))
    unit = match.group('unit').upper()
    mib = number * (1024 if unit == 'G' else 1)
    if (match.group('suffix') or '').lower() == 'b':
        raise InvalidParameterError(param, _ambiguous(str(value), match.group('number'), unit, mib))
    if not mib.is_integer():
        raise InvalidParameterError(param, '%r is not a whole number of MiB (%.2f MiB)' % (value, mib))
    if mib <= 0:
        raise InvalidParameterError(param, '%r must be greater than zero' % (value,))
    return int(mib)


def _ambiguous(value: str, number: str, unit: str, binary_mib: float) -> str:
    """Why ``20GB`` is refused, with the forms that say what was meant."""
    power, decimal_power = (30, 9) if unit == 'G' else (20, 6)
    if binary_mib < 1:
        return ('%r is ambiguous (%sB is 10^%d bytes to some and 2^%d to others), and less than the smallest limit, 1M (2^20 '
                'bytes); MPS only takes binary sizes (M = MiB, G = GiB)' % (value, unit, decimal_power, power))
    if binary_mib.is_integer():
        forms = ['%s%s' % (number, unit), '%s%siB' % (number, unit)]
        if unit == 'G':
            forms += ['%dM' % binary_mib, '%dMiB' % binary_mib]
        binary = '%s or %s for %s x 2^%d bytes' % (', '.join(forms[:-1]), forms[-1], number, power)
    else:
        binary = '%dM for %s x 2^%d bytes (rounded down to whole MiB)' % (binary_mib, number, power)
    # Rounded down: the limit written is never more than the one meant.
    decimal_mib = int(round(float(number) * 10 ** decimal_power)) // _MIB
    decimal = ', or %dM for %s x 10^%d bytes (rounded down to whole MiB)' % (
        decimal_mib, number, decimal_power) if decimal_mib > 0 else ''
    return ('%r is ambiguous: %sB is 10^%d bytes to some and 2^%d to others, and MPS only takes binary sizes '
            '(M = MiB, G = GiB); write %s%s' % (value, unit, decimal_power, power, binary, decimal))


def check_fits(mib_by_uuid: t.Mapping[str, int], gpus: t.Sequence[t.Any], param: str) -> None:
    """Refuse a pinned memory limit larger than the memory of its GPU (all of it is allowed), naming the GPU.

    ``mib_by_uuid`` maps a GPU UUID, or :data:`EVERY_GPU`, to MiB; ``gpus`` are the GPUs it is checked on.
    The one check of sizes against GPUs, for mps_limits and the role's preflight alike.
    """
    for gpu in gpus:
        mib = mib_by_uuid.get(gpu.uuid, mib_by_uuid.get(EVERY_GPU))
        if mib is not None and mib > gpu.memory_total_mib:
            raise InvalidParameterError(param, '%d MiB (%s) is more than %s has: %d MiB (%s); give at most %dM' % (
                mib, _gib(mib), _described(gpu),
                gpu.memory_total_mib, _gib(gpu.memory_total_mib), gpu.memory_total_mib))


def check_shares_fit(mib_by_uuid: t.Mapping[str, int], replicas: int, gpus: t.Sequence[t.Any], param: str) -> None:
    """Refuse a pinned memory limit that, once per replica, adds up to more than its GPU has (``oversubscribe`` allows it).

    With ``replicas`` and an explicit limit both given, every one of the replicas may pin that much: a limit above
    ``total // replicas`` lets the clients of one GPU together pin more memory than it holds, and the last ones fail
    to allocate. mps_limits and the role's preflight refuse it alike, naming the GPU, the sum and the largest limit that fits.
    """
    for gpu in gpus:
        mib = mib_by_uuid.get(gpu.uuid, mib_by_uuid.get(EVERY_GPU))
        if mib is not None and mib * replicas > gpu.memory_total_mib:
            raise InvalidParameterError(param, '%d MiB for each of %d replicas is %d MiB (%s), more than %s has: %d MiB; give at most '
                                        '%dM, or set oversubscribe=true to let the clients of one GPU together pin more than it holds' % (
                                            mib, replicas, mib * replicas, _gib(mib * replicas),
                                            _described(gpu),
                                            gpu.memory_total_mib, gpu.memory_total_mib // replicas))


def parse_mem_limit(mem: t.Any, gpus: t.Sequence[t.Any], scope: t.Sequence[t.Any], param: str) -> t.Dict[str, int]:
    """``pinned_device_mem_limit`` as MiB by GPU UUID (:data:`EVERY_GPU` for one size for every GPU).

    A mapping's keys are host GPU indices, UUIDs or unique UUID prefixes, resolved against ``gpus`` (the host's)
    and each one of ``scope`` (the daemon's), given once. Sizes are not checked against the GPUs here.
    """
    if not isinstance(mem, dict):
        return {EVERY_GPU: parse_size(mem, param)}
    if not mem:
        raise InvalidParameterError(param, 'must be a size or a non-empty mapping of GPU index or UUID to size')
    result: t.Dict[str, int] = {}
    scope_uuids = {gpu.uuid for gpu in scope}
    for key, value in mem.items():
        gpu = resolve_devices([key], gpus, param=param)[0]
        if gpu.uuid not in scope_uuids:
            raise InvalidParameterError(param, '%r (%s) is not one of the daemon\'s devices (%s)' % (
                key, gpu.label, ', '.join(g.address for g in scope)))
        if gpu.uuid in result:
            raise InvalidParameterError(param, '%s is given twice' % gpu.label)
        result[gpu.uuid] = parse_size(value, '%s[%s]' % (param, key))
    return result


def _described(gpu: t.Any) -> str:
    """A GPU as the size refusals name it: index, UUID and model (a MIG device by its label)."""
    return gpu.label if gpu.is_mig else 'GPU %d (%s, %s)' % (gpu.index, gpu.uuid, gpu.name)


def _gib(mib: int) -> str:
    return '%g GiB' % round(mib / 1024.0, 2)


def parse_percentage(value: t.Any, param: str = 'active_thread_percentage') -> float:
    """A thread percentage: a number, 0 < x <= 100."""
    if isinstance(value, bool):
        raise InvalidParameterError(param, 'must be a number greater than 0 and at most 100')
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(param, '%r is not a number greater than 0 and at most 100' % (value,)) from None
    if not (0 < number <= 100) or math.isnan(number):
        raise InvalidParameterError(param, '%s is not greater than 0 and at most 100' % value)
    if round(number, 1) == 0:
        # The daemon keeps one decimal (it answers 25.0 to 25): a smaller value would be kept as 0.0.
        raise InvalidParameterError(param, '%s would be kept as 0.0 by the MPS control daemon, which keeps one decimal: the '
                                    'smallest percentage it keeps is 0.1' % value)
    return round(number, 1) if round(number, 1) == number else number


def less_than_one_sm(percentage: t.Optional[float], gpus: t.Sequence[t.Any], param: str) -> t.List[str]:
    """A warning for each device whose SM count NVML gives (MIG devices) where ``percentage`` of its SMs is less than one
    SM, naming the smallest percentage that gives one. That a client gets percentage x SMs / 100 SMs, at least one, is
    inferred from NVIDIA's MPS documentation [I]; whole GPUs, whose SM count NVML does not give, are not warned about."""
    if percentage is None:
        return []
    warnings = []
    for gpu in gpus:
        sms = getattr(gpu, 'multiprocessor_count', None)
        if sms and percentage * sms / 100 < 1:
            warnings.append('%s: %s%% of the %d SMs of %s is less than one SM; the smallest percentage that gives one is %s'
                            % (param, percentage, sms, gpu.label, math.ceil(1000.0 / sms) / 10))
    return warnings


def parse_priority(value: t.Any, param: str = 'client_priority') -> int:
    """A default client priority: V(normal) or V(below_normal) (0 or 1, as C(CUDA_MPS_CLIENT_PRIORITY) takes it)."""
    if isinstance(value, bool):
        raise InvalidParameterError(param, 'must be normal or below_normal (or 0 or 1), got %r' % (value,))
    if isinstance(value, int) and value in (0, 1):
        return value
    if isinstance(value, str) and value.strip().lower() in PRIORITIES:
        return PRIORITIES[value.strip().lower()]
    if isinstance(value, str) and value.strip() in ('0', '1'):
        return int(value.strip())
    raise InvalidParameterError(param, 'must be normal or below_normal (or 0 or 1, as CUDA_MPS_CLIENT_PRIORITY takes it), got %r' % (value,))


def slice_env(slices: t.Any, memory_mib: t.Sequence[int], percentage: t.Optional[float] = None,
              mem_limits: t.Sequence[t.Optional[int]] = (), priority: t.Optional[int] = None,
              param: str = 'slices') -> t.Dict[str, str]:
    """What one of ``slices`` clients of a daemon sets to take its slice: the environment MPS reads at the client's start.

    A slice is ``1 / slices`` of each GPU: ``floor(1000 / slices) / 10`` percent of the threads and, per device ordinal
    (``memory_mib``, the daemon's GPUs in its order), ``total // slices`` MiB - never more than the daemon hands out
    (``percentage``, ``mem_limits``: a client's variables can only lower its server's limits). ``priority`` 1 (below
    normal) is passed on as ``CUDA_MPS_CLIENT_PRIORITY``; a client of a normal-priority daemon needs no variable for it.
    """
    if isinstance(slices, bool) or not isinstance(slices, int) or not 1 <= slices <= 100:
        raise InvalidParameterError(param, 'must be a number of clients from 1 to 100, got %r' % (slices,))
    share = math.floor(1000 / slices) / 10.0
    if percentage is not None:
        share = min(share, percentage)
    env = {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': format_percentage(share)}
    limits = []
    for ordinal, total in enumerate(memory_mib):
        mib = total // slices
        cap = mem_limits[ordinal] if ordinal < len(mem_limits) else None
        if cap is not None:
            mib = min(mib, cap)
        limits.append('%d=%dM' % (ordinal, mib))
    if limits:
        env['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'] = ','.join(limits)
    if priority:
        env['CUDA_MPS_CLIENT_PRIORITY'] = str(priority)
    return env


def format_percentage(value: float) -> str:
    return ('%.1f' % value) if round(value, 1) == value else repr(value)


def readback_matches(readback: t.Optional[t.Tuple[int, int]], mib: int) -> bool:
    """Whether the daemon's (possibly lossy) read-back is consistent with ``mib``."""
    return readback is not None and readback[0] <= mib < readback[1]


def percentage_matches(reported: t.Optional[float], wanted: float) -> bool:
    return reported is not None and abs(reported - wanted) < _PERCENT_TOLERANCE


@dataclass
class Limits:
    """Wanted defaults of one resource. None means "not managed"."""

    active_thread_percentage: t.Optional[float] = None
    # GPU UUID (or EVERY_GPU) -> MiB
    pinned_device_mem_limit: t.Dict[str, int] = field(default_factory=dict)
    replicas: t.Optional[int] = None
    # The default client priority of the daemon's new servers: 0 normal, 1 below normal (None: not managed).
    client_priority: t.Optional[int] = None
    # Static SM partitions each GPU of the daemon gets, in chunks (largest first); empty: none, the daemon without -S.
    sm_partitions: t.Tuple[int, ...] = ()

    def to_json(self) -> str:
        data = {
            'format': FORMAT_VERSION,
            'active_thread_percentage': self.active_thread_percentage,
            'pinned_device_mem_limit_mib': dict(sorted(self.pinned_device_mem_limit.items())),
            'replicas': self.replicas,
        }
        if self.client_priority is not None:
            # only when managed: a record written before client priority existed reads back the same text
            data['client_priority'] = self.client_priority
        if self.sm_partitions:
            data['sm_partitions'] = list(self.sm_partitions)
        return json.dumps(data, indent=2, sort_keys=True) + '\n'

    @classmethod
    def from_data(cls, data: t.Any) -> t.Optional['Limits']:
        if not isinstance(data, dict) or data.get('format') != FORMAT_VERSION:
            return None
        pct = data.get('active_thread_percentage')
        mem = data.get('pinned_device_mem_limit_mib') or {}
        try:
            return cls(
                active_thread_percentage=None if pct is None else float(pct),
                pinned_device_mem_limit={str(key): int(value) for key, value in mem.items()},
                replicas=data.get('replicas'),
                client_priority=None if data.get('client_priority') not in (0, 1) else data['client_priority'],
                sm_partitions=tuple(sorted((int(chunks) for chunks in data.get('sm_partitions') or ()), reverse=True)),
            )
        except (TypeError, ValueError, AttributeError):
            return None

    @property
    def empty(self) -> bool:
        """No limit at all: the MPS defaults (100 %, no pinned memory limit)."""
        return (self.active_thread_percentage is None and not self.pinned_device_mem_limit and self.client_priority is None
                and not self.sm_partitions)

    def add_replica_shares(self, devices: t.Sequence[t.Any], known: t.Sequence[t.Any]) -> t.List[t.Any]:
        """Give each of ``devices`` without a pinned memory limit its share of ``replicas``; the devices given one.

        Limits from replicas are persisted per device UUID, so a device that came after them (a MIG instance re-created
        with a new UUID) has none. Only when every persisted size of a device still ``known`` is that device's share
        (sizes given explicitly are never extended); a record whose every device is gone (the resource's one MIG instance
        re-created) has only shares to go by.
        """
        if not self.replicas or not self.pinned_device_mem_limit or EVERY_GPU in self.pinned_device_mem_limit:
            return []
        by_uuid = {gpu.uuid: gpu for gpu in known}
        shares = [(by_uuid[uuid], mib) for uuid, mib in self.pinned_device_mem_limit.items() if uuid in by_uuid]
        if any(mib != gpu.memory_total_mib // self.replicas for gpu, mib in shares):
            return []
        added = [gpu for gpu in devices if self.mem_for(gpu.uuid) is None]
        for gpu in added:
            self.pinned_device_mem_limit[gpu.uuid] = gpu.memory_total_mib // self.replicas
        return added

    def own_shares(self, devices: t.Sequence[t.Any], known: t.Sequence[t.Any]) -> t.List[str]:
        """Keep the shares of ``replicas`` of ``devices`` only (a replica count persisted before its daemon's GPUs were known
        holds every GPU of the host; a re-created MIG instance leaves its old UUID behind); the UUIDs dropped. Sizes given
        explicitly are never touched."""
        if not self.replicas or not self.pinned_device_mem_limit or EVERY_GPU in self.pinned_device_mem_limit:
            return []
        by_uuid = {gpu.uuid: gpu for gpu in known}
        if any(uuid in by_uuid and mib != by_uuid[uuid].memory_total_mib // self.replicas
               for uuid, mib in self.pinned_device_mem_limit.items()):
            return []
        own = {gpu.uuid for gpu in devices}
        dropped = sorted(uuid for uuid in self.pinned_device_mem_limit if uuid not in own)
        for uuid in dropped:
            del self.pinned_device_mem_limit[uuid]
        return dropped

    def mem_for(self, uuid: str) -> t.Optional[int]:
        return self.pinned_device_mem_limit.get(uuid, self.pinned_device_mem_limit.get(EVERY_GPU))

    def commands(self, device_uuids: t.Sequence[str]) -> t.List[str]:
        """The control commands that give a daemon with these devices (in ordinal order) these defaults.

        Devices are addressed by ordinal: limits set by UUID are accepted but not applied by real drivers.
        """
        cmds = []
        for ordinal, uuid in enumerate(device_uuids):
            mib = self.mem_for(uuid)
            if mib is not None:
                cmds.append(set_default_mem(ordinal, mib))
        if self.active_thread_percentage is not None:
            cmds.append(set_default_percentage(format_percentage(self.active_thread_percentage)))
        if self.client_priority is not None:
            cmds.append(set_default_priority(self.client_priority))
        for uuid in device_uuids:
            cmds.extend(sm_partition_add(uuid, chunks) for chunks in self.sm_partitions)
        return cmds


# GPU models on which users reported replica counts failing far below the MPS client limit, with the most that worked
# (NVIDIA/k8s-device-plugin#1118: "all CUDA-capable devices are busy or unavailable" at the first allocation).
REPORTED_REPLICAS = (('NVIDIA A16*', 5), ('Tesla T4*', 21), ('NVIDIA T4*', 21), ('NVIDIA A30*', 30))
REPLICAS_SOURCE = ('each client holds CUDA_DEVICE_MAX_CONNECTIONS connections (2 by default) of the GPU\'s MPS budget, and '
                   '"increasing CUDA_DEVICE_MAX_CONNECTIONS will decrease the total number of MPS clients possible per server" '
                   '(NVIDIA MPS documentation, client limits)')


def replica_warnings(replicas: t.Optional[int], gpus: t.Sequence[t.Any]) -> t.List[str]:
    """Warnings (not refusals) for a replica count near what a GPU sustains when clients open more connections.

    Above half the GPU's MPS client limit, clients with 4 connections (or two contexts) each no longer all fit; on the
    models of :data:`REPORTED_REPLICAS`, above the count users reported working.
    """
    if not replicas:
        return []
    found = []
    for gpu in gpus:
        reported = next((count for pattern, count in REPORTED_REPLICAS if fnmatch.fnmatchcase(gpu.name, pattern)), None)
        if reported is not None and replicas > reported:
            found.append('replicas %d on %s: users report clients failing above %d replicas on %s ("all CUDA-capable devices '
                         'are busy or unavailable" at the first allocation, NVIDIA/k8s-device-plugin#1118); %s' % (
                             replicas, _described(gpu), reported, gpu.name, REPLICAS_SOURCE))
        elif replicas > gpu.max_mps_clients // 2:
            found.append('replicas %d on %s is more than half of its %d MPS clients: clients that open more than the default '
                         'connections (CUDA_DEVICE_MAX_CONNECTIONS=4, or a second context) would not all fit; %s' % (
                             replicas, _described(gpu), gpu.max_mps_clients, REPLICAS_SOURCE))
    return found


def replica_limits(replicas: int, gpus: t.Iterable[t.Any]) -> t.Tuple[float, t.Dict[str, int]]:
    """What one of ``replicas`` clients of each of ``gpus`` gets, as NVIDIA's device plugin computes it: the thread
    percentage ``100 // replicas`` and, per GPU, ``total_MiB // replicas`` of pinned memory."""
    return float(100 // replicas), {gpu.uuid: gpu.memory_total_mib // replicas for gpu in gpus}


def as_count(value: t.Any, param: str) -> t.Any:
    """A whole number given as text (``"4"``, as ``-e`` and templates give it) as the number, as a percentage's is;
    anything else as it is, for the check that follows to refuse."""
    # ASCII digits only: str.isdigit() is true for '²', which int() refuses with a ValueError
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return value


def check_replicas(replicas: t.Any, gpus: t.Sequence[t.Any], param: str = 'replicas',
                   caps: t.Optional[t.Mapping[str, int]] = None) -> int:
    """A replica count every one of ``gpus`` can serve (one MPS client per replica), or a refusal naming ``param``.

    ``caps`` (GPU UUID -> clients) overrides a GPU's own ``max_mps_clients`` (the role takes mps_info's).
    The one check of replicas, for mps_limits and the role's preflight alike.
    """
    replicas = as_count(replicas, param)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidParameterError(param, 'must be an integer of at least 1, got %r' % (replicas,))
    for gpu in gpus:
        cap = (caps or {}).get(gpu.uuid, gpu.max_mps_clients)
        if replicas > cap:
            raise InvalidParameterError(param, '%d exceeds the %d MPS clients of %s (%s, compute capability %d.%d)%s' % (
                replicas, cap, gpu.label, gpu.name, gpu.compute_capability[0], gpu.compute_capability[1],
                ': on MIG the clients of the GPU are lowered in proportion to the compute instance (%s of %s slices)' % (
                    gpu.compute_instance_slices, gpu.max_slices) if gpu.is_mig else ''))
    return replicas

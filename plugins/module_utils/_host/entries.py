# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's resource list resolved against its GPUs, every entry checked, before anything is touched.

One check for every entry point: the ``mps_host`` module resolves its entries with it, the fleet role's ``mps_plan``
filter (which only has ``mps_info``'s GPU facts) wraps it. All or nothing: the first bad entry raises,
naming the entry and the key.
"""

from __future__ import annotations

import fnmatch
import typing as t
from dataclasses import dataclass, field

from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE

from .._errors import DeviceSelectionError, InvalidParameterError
from .._gpus import Gpu, check_multiuser
from .._limits.partitions import check_partition_gpus, parse_partitions
from .._options import RESOURCE_KEYS
from .._limits.model import (
    Limits, as_count, check_fits, check_replicas, check_shares_fit, less_than_one_sm, parse_mem_limit, parse_percentage,
    parse_priority, parse_size, replica_limits)
from .._resource.layout import validate_name
from .._selectors import resolve_devices


@dataclass
class ResourceEntry:
    """One listed resource: its GPUs (in the given order), its replicas for this host's GPU model, its limits as given."""

    name: str
    devices: t.List[Gpu]
    multiuser: bool = False
    replicas: t.Optional[int] = None
    active_thread_percentage: t.Any = None
    pinned_device_mem_limit: t.Any = None
    limits: t.Dict[str, t.Any] = field(default_factory=dict)
    # replicas times an explicit pinned limit may exceed a GPU's memory
    oversubscribe: bool = False
    # the daemon's default client priority as given (normal, below_normal, 0 or 1); None: normal, MPS's own default
    client_priority: t.Any = None
    # static SM partitions of each GPU, in chunks, as given; None: none (the daemon without -S)
    sm_partitions: t.Any = None
    # protocol: 3 - the resource's server and namespaces (_v3.spec.V3Spec); None: the legacy protocol
    v3: t.Optional[t.Any] = None

    @property
    def has_limits(self) -> bool:
        return (self.replicas is not None or self.active_thread_percentage is not None or self.pinned_device_mem_limit is not None
                or self.client_priority is not None or bool(self.sm_partitions))

    def wanted_limits(self) -> Limits:
        """The limits mps_host wants for this entry, as :func:`resolve_entries` checked and parsed them against the entry's
        own GPUs (the checks run once, here). Exact: what the entry does not give is not wanted."""
        parsed = self.limits
        limits = Limits()
        if self.replicas is not None:
            limits.replicas = self.replicas
            limits.active_thread_percentage, limits.pinned_device_mem_limit = replica_limits(self.replicas, self.devices)
        if 'active_thread_percentage' in parsed:
            limits.active_thread_percentage = parsed['active_thread_percentage']
        if 'client_priority' in parsed:
            limits.client_priority = parsed['client_priority']
        if self.sm_partitions is not None:
            limits.sm_partitions = tuple(parsed.get('sm_partitions', ()))
        if 'pinned_device_mem_limit' in parsed:
            limits.pinned_device_mem_limit = dict(parsed['pinned_device_mem_limit'])
        return limits

    def as_dict(self) -> t.Dict[str, t.Any]:
        """The form the role's ``mps_plan`` filter has always returned."""
        return {'name': self.name, 'devices': [gpu.uuid for gpu in self.devices], 'indices': [gpu.index for gpu in self.devices],
                'replicas': self.replicas, 'multiuser': self.multiuser,
                'active_thread_percentage': self.active_thread_percentage,
                'pinned_device_mem_limit': self.pinned_device_mem_limit, 'client_priority': self.client_priority,
                'sm_partitions': self.sm_partitions, 'has_limits': self.has_limits,
                'protocol': '3' if self.v3 is not None else 'legacy'}


def replicas_for(replicas: t.Any, gpu_name: str, param: str, profile: str = '') -> t.Optional[int]:
    """A number, or a mapping from GPU model or MIG profile (glob patterns allowed, matched in order) to a number with a default.

    A MIG device (``profile`` given) matches a key by its profile (``1g.10gb``), every key tried so first, then by its
    full name (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``); a whole GPU by its model name.
    """
    replicas = as_count(replicas, param)
    if replicas is None or isinstance(replicas, int) and not isinstance(replicas, bool):
        return replicas
    if not isinstance(replicas, dict):
        raise InvalidParameterError(param, 'must be a number or a mapping from GPU model or MIG profile to a number, got %r' % (replicas,))
    # A MIG device: every key by its profile first, then by its full name - so that a GPU model glob listed before a
    # profile ("NVIDIA H100*" before "1g.10gb") does not catch the MIG devices of that model.
    for name in ([profile] if profile else []) + [gpu_name]:
        for pattern, value in replicas.items():
            if pattern != 'default' and fnmatch.fnmatchcase(name, str(pattern)):
                return as_count(value, param)
    if 'default' in replicas:
        return as_count(replicas['default'], param)
    raise InvalidParameterError(param, 'no entry matches %s and there is no "default"' % (
        'MIG profile %r (%s)' % (profile, gpu_name) if profile else 'GPU model %r' % gpu_name))


def _entries(resources: t.Any, param: str, *, strict_keys: bool) -> t.Iterator[t.Tuple[t.Dict[str, t.Any], str]]:
    """Each entry with its checked name, in order: a list of mappings with valid, unique names (and known keys)."""
    if not isinstance(resources, list):
        raise InvalidParameterError(param, 'must be a list of resources (mappings with a name)')
    names: t.List[str] = []
    for number, resource in enumerate(resources):
        if not isinstance(resource, dict) or 'name' not in resource:
            raise InvalidParameterError('%s[%d]' % (param, number), 'must be a mapping with a name')
        unknown = sorted(str(key) for key in resource if key not in RESOURCE_KEYS)
        if strict_keys and unknown:
            # named as the module's own argument check names it: by its name where it has one, else by its index
            label = resource['name'] if isinstance(resource['name'], str) and resource['name'] else number
            raise InvalidParameterError('%s[%s]' % (param, label), 'unknown key(s) %s; the keys are %s' % (
                ', '.join(unknown), ', '.join(RESOURCE_KEYS)))
        name = validate_name(resource['name'], '%s[%d].name' % (param, number))
        if name in names:
            raise InvalidParameterError(param, 'resource names must be unique; %r is listed twice' % name)
        names.append(name)
        yield resource, name


def resolve_entries(resources: t.Any, gpus: t.Sequence[Gpu], param: str = 'resources',
                    caps: t.Optional[t.Mapping[str, int]] = None, *, strict_keys: bool = True,
                    warnings: t.Optional[t.List[str]] = None, root: str = '', protocol: t.Optional[str] = None) -> t.List[ResourceEntry]:
    """Every resource with its devices resolved and its limits checked against its own GPUs, or a refusal.

    ``warnings`` receives what is not wrong but worth saying (``devices: all`` leaving out GPUs in MIG mode). ``root``:
    where the v3 pipe directories are checked to fit a socket address (not checked without it). ``protocol``: that of
    the entries that give none (mps_host's ``protocol``).
    """
    owner: t.Dict[str, str] = {}
    servers: t.Dict[str, str] = {}
    entries = []
    for resource, name in _entries(resources, param, strict_keys=strict_keys):
        resource = _with_protocol(resource, protocol)
        where = '%s[%s]' % (param, name)
        devices = resource.get('devices')
        chosen = resolve_devices('all' if devices is None else devices, gpus, param=where + '.devices', warnings=warnings)
        for gpu in chosen:
            if gpu.uuid in owner:
                raise DeviceSelectionError('%s: %s is in both %r and %r' % (param, gpu.label, owner[gpu.uuid], name))
            owner[gpu.uuid] = name
        per_gpu = {replicas_for(resource.get('replicas'), gpu.name, where + '.replicas', getattr(gpu, 'profile', ''))
                   for gpu in chosen}
        if len(per_gpu) > 1:
            raise InvalidParameterError(where + '.replicas', 'its GPUs are of models with different replicas (%s); one daemon has '
                                        'one thread percentage - split the resource by model' % sorted(per_gpu, key=str))
        replicas = per_gpu.pop() if per_gpu else None
        if replicas is not None:
            check_replicas(replicas, chosen, where + '.replicas', caps)
        entry = ResourceEntry(name, chosen, multiuser(resource, where), replicas,
                              resource.get('active_thread_percentage'), resource.get('pinned_device_mem_limit'),
                              oversubscribe=boolean(resource, 'oversubscribe', where), client_priority=resource.get('client_priority'),
                              sm_partitions=resource.get('sm_partitions'))
        _check_limits(entry, where, gpus)
        if _asks_v3(resource):
            # Imported here: a legacy fleet never compiles the v3 code (AnsiballZ compiles what is imported).
            from .._v3.entry import check_protocol, is_v3, v3_spec  # pylint: disable=import-outside-toplevel
            check_protocol(resource, where, multiuser=entry.multiuser)
            if is_v3(resource):
                entry.v3 = v3_spec(resource, entry, where, '%s/%s/pipe' % (root.rstrip('/'), name) if root else '', servers)
        if warnings is not None:
            share = entry.limits.get('active_thread_percentage')
            if share is None and replicas:
                share = replica_limits(replicas, ())[0]
            key = '.active_thread_percentage' if 'active_thread_percentage' in entry.limits else '.replicas'
            warnings.extend(less_than_one_sm(share, chosen, where + key))
        entries.append(entry)
    return entries


# The keys of an MPS v3 entry (protocol: 3), beside the protocol itself.
V3_KEYS = ('server', 'uid', 'namespaces')


def _with_protocol(resource: t.Dict[str, t.Any], protocol: t.Optional[str]) -> t.Dict[str, t.Any]:
    """The entry with the host's protocol where it gives none of its own."""
    return dict(resource, protocol=protocol) if protocol is not None and resource.get('protocol') is None else resource


def _asks_v3(resource: t.Mapping[str, t.Any]) -> bool:
    """The entry says something of MPS v3: a protocol other than legacy, or a v3 key given (an empty list is not)."""
    return str(resource.get('protocol') or 'legacy') != 'legacy' or any(resource.get(key) not in (None, []) for key in V3_KEYS)


# The most MPS clients any GPU takes (48 from Volta on, 60 with drivers 590 and later): a replica count above it is
# wrong on every host, GPU facts or not.
MAX_CLIENTS = 60


def multiuser(resource: t.Mapping[str, t.Any], where: str) -> bool:
    """The entry's ``multiuser`` as a bool (Ansible's boolean words accepted), or a refusal naming the entry."""
    return boolean(resource, 'multiuser', where)


def boolean(resource: t.Mapping[str, t.Any], key: str, where: str) -> bool:
    """The entry's ``key`` as a bool (Ansible's boolean words accepted; absent: false), or a refusal naming the entry."""
    value = resource.get(key)
    if value is None:
        return False
    if isinstance(value, str):
        value = value.strip().lower()
    if isinstance(value, (str, bool, int)) and value in BOOLEANS_TRUE:
        return True
    if isinstance(value, (str, bool, int)) and value in BOOLEANS_FALSE:
        return False
    raise InvalidParameterError('%s.%s' % (where, key), 'must be true or false; got %r' % (resource.get(key),))


def check_resources(resources: t.Any, param: str = 'resources', protocol: t.Optional[str] = None) -> None:
    """What can be refused in a resource list without the host's GPUs - on the controller, before the module is sent to the host.

    Keys, names, percentages, the form of sizes and replica counts. The rest (devices, sizes against memory,
    replicas against each GPU) is :func:`resolve_entries`' on the host, with the same messages.
    """
    for resource, name in _entries(resources, param, strict_keys=True):
        resource = _with_protocol(resource, protocol)
        where = '%s[%s]' % (param, name)
        multiuser(resource, where)
        boolean(resource, 'oversubscribe', where)
        if _asks_v3(resource):
            from .._v3.entry import check_protocol  # pylint: disable=import-outside-toplevel
            check_protocol(resource, where, multiuser=multiuser(resource, where))
        if resource.get('client_priority') is not None:
            parse_priority(resource['client_priority'], where + '.client_priority')
        parse_partitions(resource.get('sm_partitions'), where + '.sm_partitions')
        if resource.get('active_thread_percentage') is not None:
            parse_percentage(resource['active_thread_percentage'], where + '.active_thread_percentage')
        mem = resource.get('pinned_device_mem_limit')
        if isinstance(mem, dict):
            for key, value in mem.items():
                parse_size(value, '%s.pinned_device_mem_limit[%s]' % (where, key))
        elif mem is not None:
            parse_size(mem, where + '.pinned_device_mem_limit')
        replicas = resource.get('replicas')
        for value in (replicas.values() if isinstance(replicas, dict) else [replicas]):
            if value is None and not isinstance(replicas, dict):
                continue
            value = as_count(value, where + '.replicas')
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CLIENTS:
                raise InvalidParameterError(where + '.replicas', 'must be a number of clients from 1 to %d (no GPU takes more), '
                                            'or a mapping from GPU model to one; got %r' % (MAX_CLIENTS, value))


def _check_limits(entry: ResourceEntry, where: str, gpus: t.Sequence[Gpu]) -> None:
    """What mps_limits and mps_daemon would refuse, refused before anything is touched.

    Sizes go through the modules' own parsing and check: the decimal units (20GB) are refused as ambiguous, and
    a size over the memory of one of the resource's GPUs is refused naming that GPU and its size.
    """
    if entry.active_thread_percentage is not None:
        entry.limits['active_thread_percentage'] = parse_percentage(entry.active_thread_percentage, where + '.active_thread_percentage')
    if entry.client_priority is not None:
        entry.limits['client_priority'] = parse_priority(entry.client_priority, where + '.client_priority')
    if entry.sm_partitions is not None:
        chunks = parse_partitions(entry.sm_partitions, where + '.sm_partitions')
        check_partition_gpus(chunks, entry.devices, where + '.sm_partitions')
        if chunks:
            entry.limits['sm_partitions'] = list(chunks)
    if entry.pinned_device_mem_limit is not None:
        param = where + '.pinned_device_mem_limit'
        mib = parse_mem_limit(entry.pinned_device_mem_limit, gpus, entry.devices, param)
        check_fits(mib, entry.devices, param)
        if entry.replicas is not None and not entry.oversubscribe:
            check_shares_fit(mib, entry.replicas, entry.devices, param)
        entry.limits['pinned_device_mem_limit'] = mib
    if entry.multiuser:
        check_multiuser(entry.devices, where + '.multiuser')

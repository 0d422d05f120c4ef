# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A ``protocol: 3`` entry of ``resources`` checked and turned into its one record (:class:`.spec.V3Spec`), before anything
is touched. What v3 cannot do, or what is unknown of it, is refused here, naming the key the user wrote."""

from __future__ import annotations

import typing as t

from .._errors import InvalidParameterError
from .._limits.model import EVERY_GPU, check_fits, parse_percentage, parse_priority, parse_size
from .._resource.layout import MAX_PIPE_DIR_BYTES, PIPE_DIR_WHY
from .spec import NamespaceLimits, V3Spec, check_name, check_server_name, namespace_entries, server_name_for

# An entry's keys that v3 has no place for (yet), and why.
_NOT_WITH_V3 = {
    'sm_partitions': 'MPS v3 partitions are made per server with sm-partition and their ids differ from the legacy ones; '
                     'this collection does not manage them yet',
    'oversubscribe': 'it only applies to replicas with the legacy protocol',
}


def is_v3(resource: t.Mapping[str, t.Any]) -> bool:
    return str(resource.get('protocol') or 'legacy') == '3'


def check_protocol(resource: t.Mapping[str, t.Any], where: str, *, multiuser: bool) -> None:
    """``protocol`` is legacy or 3; the v3 keys only with protocol 3."""
    value = resource.get('protocol')
    if value is not None and str(value) not in ('legacy', '3'):
        raise InvalidParameterError(where + '.protocol', 'must be legacy (the default) or 3 (MPS v3, driver r615 and later); '
                                    'got %r' % (value,))
    if not is_v3(resource):
        given = [key for key in ('server', 'uid', 'namespaces') if resource.get(key) not in (None, [])]
        if given:
            raise InvalidParameterError('%s.%s' % (where, given[0]), 'is an MPS v3 key: it needs protocol: 3 in the same entry')
        return
    for key, why in _NOT_WITH_V3.items():
        if resource.get(key) not in (None, [], False):
            raise InvalidParameterError('%s.%s' % (where, key), 'cannot be used with protocol: 3 - %s' % why)
    uid = resource.get('uid')
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid < 0):
        raise InvalidParameterError(where + '.uid', 'must be a user id (a whole number, 0 or more); got %r' % (uid,))
    if uid is None and not multiuser:
        raise InvalidParameterError(where + '.uid', 'a v3 server without multiuser serves only its owner: give the uid its '
                                    'clients run as, or multiuser: true (then any uid may attach, and the server is root\'s)')
    if uid not in (None, 0) and multiuser:
        raise InvalidParameterError(where + '.uid', 'must be 0 or left out with multiuser: true (in multiuser mode only root '
                                    'may own a v3 server); got %r' % (uid,))
    if resource.get('server') is not None:
        check_name(resource['server'], where + '.server', 'the server name')
    namespace_entries(resource.get('namespaces'), where + '.namespaces', lambda item, param: _limits(item, param, None),
                      NamespaceLimits())


def _limits(item: t.Mapping[str, t.Any], param: str, devices: t.Optional[t.Sequence[t.Any]]) -> NamespaceLimits:
    pct = item.get('active_thread_percentage')
    mem = item.get('pinned_device_mem_limit')
    priority = item.get('client_priority')
    if isinstance(mem, dict):
        raise InvalidParameterError(param + '.pinned_device_mem_limit', 'must be one size: a v3 namespace takes one pinned '
                                    'memory limit for all its GPUs')
    mib = parse_size(mem, param + '.pinned_device_mem_limit') if mem is not None else None
    if mib is not None and devices is not None:
        check_fits({EVERY_GPU: mib}, devices, param + '.pinned_device_mem_limit')
    return NamespaceLimits(parse_percentage(pct, param + '.active_thread_percentage') if pct is not None else None, mib,
                           parse_priority(priority, param + '.client_priority') if priority is not None else None)


def _one_size(limits: t.Any, devices: t.Sequence[t.Any], param: str) -> t.Optional[int]:
    """The resource's pinned limit as the one size a v3 server takes, or a refusal where it differs by GPU."""
    mem = limits.pinned_device_mem_limit
    if not mem:
        return None
    if EVERY_GPU in mem:
        return int(mem[EVERY_GPU])
    sizes = {mem.get(gpu.uuid) for gpu in devices}
    if len(sizes) != 1 or None in sizes:
        raise InvalidParameterError(param, 'differs by GPU (%s): a v3 server takes one pinned memory limit for all its GPUs - '
                                    'split the resource by GPU model, or give one size' % ', '.join(
                                        '%s: %s' % (gpu.label, '%dM' % mem[gpu.uuid] if gpu.uuid in mem else 'none')
                                        for gpu in devices))
    return int(sizes.pop())


def v3_spec(resource: t.Mapping[str, t.Any], entry: t.Any, where: str, pipe_dir: str, taken: t.Dict[str, str]) -> V3Spec:
    """The record of a checked ``protocol: 3`` entry (``entry``: its resolved ResourceEntry; ``taken``: server names so far)."""
    mig = [gpu for gpu in entry.devices if gpu.is_mig]
    if mig:
        raise InvalidParameterError(where + '.devices', '%s is a MIG device: how MPS v3 servers map onto MIG instances is not '
                                    'known (mps-v3-reference 1.11), so protocol: 3 takes whole GPUs only' % mig[0].label)
    server = resource.get('server') or server_name_for(entry.name)
    param = where + ('.server' if resource.get('server') else '.name')
    check_name(server, param, 'the server name' if resource.get('server') else 'the server name derived from the resource name')
    check_server_name(server, entry.name, param, taken)
    taken[server] = entry.name
    wanted = entry.wanted_limits()
    default = NamespaceLimits(wanted.active_thread_percentage, _one_size(wanted, entry.devices, where + '.pinned_device_mem_limit'),
                              wanted.client_priority)
    namespaces = namespace_entries(resource.get('namespaces'), where + '.namespaces',
                                   lambda item, param: _limits(item, param, entry.devices), default)
    for name, limits in (('', default),) + namespaces:
        pct = limits.active_thread_percentage
        if pct is not None and pct < 1:
            # "ATP 1-100" [ref 1.3]: the daemon refuses less in its file and on the command line
            raise InvalidParameterError(where + ('.namespaces[%s].active_thread_percentage' % name if name else
                                                 '.active_thread_percentage'), 'is %g: MPS v3 takes a thread percentage from 1 '
                                        'to 100' % pct)
    spec = V3Spec(server, tuple(gpu.uuid for gpu in entry.devices), resource.get('uid'), entry.multiuser, default, namespaces)
    for name in ([''] + [name for name, _limits_ in namespaces]) if pipe_dir else []:
        longest = spec.pipe_dir(pipe_dir, name)
        if len(longest.encode('utf-8')) > MAX_PIPE_DIR_BYTES:
            raise InvalidParameterError(where + ('.namespaces' if name else '.server'), '%s is %d bytes, longer than %d: %s (the v3 '
                                        'sockets are nested one or two directories deeper; inferred) - choose shorter names '
                                        'or a shorter root' % (longest, len(longest.encode('utf-8')), MAX_PIPE_DIR_BYTES,
                                                               PIPE_DIR_WHY))
    return spec

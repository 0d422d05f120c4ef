# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's preflight: resolve a host's resource list against its GPUs, or say what is wrong."""

from __future__ import annotations

import fnmatch
import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import VOLTA_CC, Gpu, resolve_devices
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import check_fits, check_replicas, parse_mem_limit, parse_percentage
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import validate_name

LIMIT_KEYS = ('active_thread_percentage', 'pinned_device_mem_limit')


def _gpu(fact: t.Mapping[str, t.Any]) -> Gpu:
    major, minor = (int(part) for part in str(fact['compute_capability']).split('.'))
    return Gpu(int(fact['index']), str(fact['uuid']), str(fact['name']), int(fact['memory_total_mib']), (major, minor),
               str(fact.get('compute_mode', 'default')), None, None, None)


def replicas_for(replicas: t.Any, gpu_name: str, resource: str) -> t.Optional[int]:
    """A number, or a mapping from GPU model (glob patterns allowed, matched in order) to a number with a default."""
    if replicas is None or isinstance(replicas, int) and not isinstance(replicas, bool):
        return replicas
    if not isinstance(replicas, dict):
        raise AnsibleFilterError('mps_resources[%s].replicas: must be a number or a mapping from GPU model to a number' % resource)
    for pattern, value in replicas.items():
        if pattern != 'default' and fnmatch.fnmatchcase(gpu_name, str(pattern)):
            return value
    if 'default' in replicas:
        return replicas['default']
    raise AnsibleFilterError('mps_resources[%s].replicas: no entry matches GPU model %r and there is no "default"' % (resource, gpu_name))


def mps_plan(resources: t.Any, gpu_facts: t.Any) -> t.List[t.Dict[str, t.Any]]:
    """Every resource with its devices resolved to UUIDs and its replicas resolved for this host's GPU models."""
    if not isinstance(resources, list):
        raise AnsibleFilterError('mps_resources: must be a list of resources')
    gpus = [_gpu(fact) for fact in gpu_facts or []]
    # mps_info's max_mps_clients knows the driver (60 on r590+); derive it only for older facts without it.
    caps = {gpu.uuid: int(fact.get('max_mps_clients') or gpu.max_mps_clients) for gpu, fact in zip(gpus, gpu_facts or [])}
    owner: t.Dict[str, str] = {}
    plan = []
    for number, resource in enumerate(resources):
        if not isinstance(resource, dict) or 'name' not in resource:
            raise AnsibleFilterError('mps_resources[%d]: must be a mapping with a name' % number)
        name = resource['name']
        try:
            validate_name(name, 'mps_resources[%d].name' % number)
            chosen = resolve_devices(resource.get('devices', 'all'), gpus, param='mps_resources[%s].devices' % name)
        except MpsError as exc:
            raise AnsibleFilterError(exc.msg) from exc
        for gpu in chosen:
            if gpu.uuid in owner:
                raise AnsibleFilterError('mps_resources: GPU %d (%s) is in both %r and %r' % (gpu.index, gpu.uuid, owner[gpu.uuid], name))
            owner[gpu.uuid] = name
        per_gpu = {replicas_for(resource.get('replicas'), gpu.name, name) for gpu in chosen}
        if len(per_gpu) > 1:
            raise AnsibleFilterError('mps_resources[%s].replicas: its GPUs are of models with different replicas (%s); one daemon has '
                                     'one thread percentage - split the resource by model' % (name, sorted(per_gpu, key=str)))
        replicas = per_gpu.pop() if per_gpu else None
        if replicas is not None:
            try:
                check_replicas(replicas, chosen, 'mps_resources[%s].replicas' % name, caps)
            except MpsError as exc:
                raise AnsibleFilterError(exc.msg) from exc
        _check_limits(resource, name, gpus, chosen)
        entry = {'name': name, 'devices': [gpu.uuid for gpu in chosen], 'indices': [gpu.index for gpu in chosen],
                 'replicas': replicas, 'multiuser': bool(resource.get('multiuser', False))}
        entry.update({key: resource.get(key) for key in LIMIT_KEYS})
        entry['has_limits'] = replicas is not None or any(resource.get(key) is not None for key in LIMIT_KEYS)
        plan.append(entry)
    names = [entry['name'] for entry in plan]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise AnsibleFilterError('mps_resources: resource names must be unique; repeated: %s' % ', '.join(duplicates))
    return plan


def _check_limits(resource: t.Mapping[str, t.Any], name: str, gpus: t.Sequence[Gpu], chosen: t.Sequence[Gpu]) -> None:
    """What mps_limits and mps_daemon would refuse, refused in the pre-flight, before any host is touched.

    Sizes go through the module's own parsing and check: the decimal units (20GB) are refused as ambiguous, and
    a size over the memory of one of the resource's GPUs is refused naming that GPU and its size.
    """
    try:
        if resource.get('active_thread_percentage') is not None:
            parse_percentage(resource['active_thread_percentage'], 'mps_resources[%s].active_thread_percentage' % name)
        mem = resource.get('pinned_device_mem_limit')
        if mem is not None:
            param = 'mps_resources[%s].pinned_device_mem_limit' % name
            check_fits(parse_mem_limit(mem, gpus, chosen, param), chosen, param)
        old = [gpu for gpu in chosen if gpu.compute_capability < VOLTA_CC]
        if resource.get('multiuser') and old:
            raise AnsibleFilterError('mps_resources[%s].multiuser: needs GPUs of compute capability 7.0 or newer; %s' % (
                name, ', '.join('GPU %d (%s) is %d.%d' % ((gpu.index, gpu.name) + gpu.compute_capability) for gpu in old)))
    except MpsError as exc:
        raise AnsibleFilterError(exc.msg) from exc


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_plan': mps_plan}

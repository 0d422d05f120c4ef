# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The local facts of a host's MPS (``ansible_local.gpufleet_mps``) for schedulers and later plays.

Written by ``mps_host``: nothing in them changes between two runs of an unchanged host (no pid, no time), so an
unchanged host keeps its file.
"""

from __future__ import annotations

import json
import typing as t

FORMAT = 1
GPU_KEYS = ('index', 'uuid', 'name', 'memory_total_mib')
FACT_FILE = 'gpufleet_mps.fact'


def local_facts(plan: t.Sequence[t.Mapping[str, t.Any]], daemons: t.Sequence[t.Any], gpus: t.Sequence[t.Any],
                root: str) -> t.Dict[str, t.Any]:
    """One entry per planned resource (``mps_plan`` form), with its GPUs, limits as persisted and client environment."""
    by_name = {daemon.get('name'): daemon for daemon in daemons if isinstance(daemon, dict)}
    by_uuid: t.Dict[t.Any, t.Dict[str, t.Any]] = {}
    for gpu in gpus:
        if not isinstance(gpu, dict):
            continue
        by_uuid[gpu.get('uuid')] = {key: gpu.get(key) for key in GPU_KEYS}
        for mig in gpu.get('mig_devices') or []:
            # A MIG device: its GPU's index, its own UUID, name and memory, and its address and profile.
            by_uuid[mig.get('uuid')] = {'index': gpu.get('index'), 'uuid': mig.get('uuid'), 'name': mig.get('name'),
                                        'memory_total_mib': mig.get('memory_total_mib'), 'mig': mig.get('address'),
                                        'profile': mig.get('profile')}
    resources = []
    for entry in plan:
        daemon = by_name.get(entry['name'], {})
        persisted = (daemon.get('limits') or {}).get('persisted') or {}
        item = {
            'name': entry['name'],
            'devices': [dict(by_uuid[uuid]) for uuid in entry['devices'] if uuid in by_uuid],
            'multiuser': bool(entry.get('multiuser')),
            'replicas': entry.get('replicas'),
            'active_thread_percentage': persisted.get('active_thread_percentage'),
            'client_priority': persisted.get('client_priority'),
            'pinned_device_mem_limit_mib': own_limits(persisted.get('pinned_device_mem_limit_mib') or {}, entry['devices']),
            'healthy': bool(daemon.get('healthy')),
            'env': daemon.get('env') or {},
        }
        if persisted.get('sm_partitions'):
            # only where there are some: the facts of hosts without them stay byte for byte
            item['sm_partitions'] = list(persisted['sm_partitions'])
        resources.append(item)
    return {'format': FORMAT, 'root': str(root), 'ready': bool(resources) and all(item['healthy'] for item in resources),
            'resources': resources}


def own_limits(limits: t.Mapping[str, t.Any], devices: t.Sequence[str]) -> t.Dict[str, t.Any]:
    """The pinned limits of the resource's own GPUs (and a size for every GPU, ``*``).

    The persisted record of a replica count holds a limit for every GPU of the host (it need not change when the
    resource's devices do); a scheduler reading the facts must see only what the resource's daemon applies.
    """
    own = set(devices)
    return {key: value for key, value in limits.items() if key in own or not key.startswith(('GPU-', 'MIG-'))}


def facts_text(facts: t.Mapping[str, t.Any]) -> str:
    """The file's text: what ``to_nice_json(sort_keys=true)`` gives, and a newline (the role wrote it so before)."""
    return json.dumps(facts, indent=4, sort_keys=True, separators=(',', ': ')) + '\n'

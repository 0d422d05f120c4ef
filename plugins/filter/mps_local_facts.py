# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The local facts the fleet role writes for schedulers: ``ansible_local.gpufleet_mps``."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

FORMAT = 1
GPU_KEYS = ('index', 'uuid', 'name', 'memory_total_mib')


def mps_local_facts(plan: t.Any, daemons: t.Any, gpus: t.Any, root: t.Any) -> t.Dict[str, t.Any]:
    """One entry per planned resource, with its GPUs, limits (as persisted) and the environment clients need.

    Nothing that changes between two runs of an unchanged host (pids, start times) is in it.
    """
    if not isinstance(plan, list) or not isinstance(daemons, list) or not isinstance(gpus, list):
        raise AnsibleFilterError('mps_local_facts: expects the mps_plan list, mps_info daemons and mps_info gpus')
    by_name = {daemon.get('name'): daemon for daemon in daemons if isinstance(daemon, dict)}
    by_uuid = {gpu.get('uuid'): gpu for gpu in gpus if isinstance(gpu, dict)}
    resources = []
    for entry in plan:
        daemon = by_name.get(entry['name'], {})
        persisted = (daemon.get('limits') or {}).get('persisted') or {}
        resources.append({
            'name': entry['name'],
            'devices': [{key: by_uuid[uuid].get(key) for key in GPU_KEYS} for uuid in entry['devices'] if uuid in by_uuid],
            'multiuser': bool(entry.get('multiuser')),
            'replicas': entry.get('replicas'),
            'active_thread_percentage': persisted.get('active_thread_percentage'),
            'pinned_device_mem_limit_mib': persisted.get('pinned_device_mem_limit_mib') or {},
            'healthy': bool(daemon.get('healthy')),
            'env': daemon.get('env') or {},
        })
    return {'format': FORMAT, 'root': str(root), 'ready': bool(resources) and all(item['healthy'] for item in resources),
            'resources': resources}


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_local_facts': mps_local_facts}

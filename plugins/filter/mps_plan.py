# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's preflight: resolve a host's resource list against its GPUs, or say what is wrong."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu
from ansible_collections.gpufleet.mps.plugins.module_utils._host.plan import plan_resources


def _gpu(fact: t.Mapping[str, t.Any]) -> Gpu:
    major, minor = (int(part) for part in str(fact['compute_capability']).split('.'))
    mig = fact.get('mig_mode')
    mig_current = None if not isinstance(mig, dict) else mig.get('current') == 'enabled'
    return Gpu(int(fact['index']), str(fact['uuid']), str(fact['name']), int(fact['memory_total_mib']), (major, minor),
               str(fact.get('compute_mode', 'default')), mig_current, None, None)


def mps_plan(resources: t.Any, gpu_facts: t.Any) -> t.List[t.Dict[str, t.Any]]:
    """Every resource with its devices resolved to UUIDs and its replicas resolved for this host's GPU models.

    The same planner as the mps_host module (module_utils/_host/plan.py): an unknown key, a bad limit, a GPU in two
    resources or in MIG mode is refused naming the resource and the key.
    """
    gpus = [_gpu(fact) for fact in gpu_facts or []]
    # mps_info's max_mps_clients knows the driver (60 on r590+); derive it only for older facts without it.
    caps = {gpu.uuid: int(fact.get('max_mps_clients') or gpu.max_mps_clients) for gpu, fact in zip(gpus, gpu_facts or [])}
    try:
        return [plan.as_dict() for plan in plan_resources(resources, gpus, 'mps_resources', caps)]
    except MpsError as exc:
        raise AnsibleFilterError(exc.msg) from exc


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_plan': mps_plan}

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role's preflight: resolve a host's resource list against its GPUs, or say what is wrong."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu, MigDevice, all_devices
from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import resolve_entries


def _gpu(fact: t.Mapping[str, t.Any]) -> Gpu:
    major, minor = (int(part) for part in str(fact['compute_capability']).split('.'))
    mig = fact.get('mig_mode')
    mig_current = None if not isinstance(mig, dict) else mig.get('current') == 'enabled'
    index = int(fact['index'])
    migs = tuple(MigDevice(
        index, str(m['uuid']), str(m.get('name', '')), int(m['memory_total_mib']), (major, minor), 'unsupported', None, None, None,
        mig_index=int(m['index']), parent_uuid=str(fact['uuid']), profile=str(m.get('profile', '')),
        gpu_instance_id=m.get('gpu_instance_id'), compute_instance_id=m.get('compute_instance_id'),
        multiprocessor_count=m.get('multiprocessor_count'), gpu_instance_slices=m.get('gpu_instance_slices'),
        compute_instance_slices=m.get('compute_instance_slices'))
        for m in fact.get('mig_devices') or [])
    return Gpu(index, str(fact['uuid']), str(fact['name']), int(fact['memory_total_mib']), (major, minor),
               str(fact.get('compute_mode', 'default')), mig_current, None, None, mig_devices=migs)


def mps_plan(resources: t.Any, gpu_facts: t.Any, protocol: t.Optional[str] = None) -> t.List[t.Dict[str, t.Any]]:
    """Every resource with its devices resolved to UUIDs and its replicas resolved for this host's GPU models.

    The same planner as the mps_host module (module_utils/_host/entries.py): an unknown key, a bad limit, a GPU in two
    resources or in MIG mode is refused naming the resource and the key. MIG devices come from mps_info's
    ``mig_devices`` of each GPU. ``protocol``: that of the entries that give none (mps_host's ``protocol``).
    """
    gpus = [_gpu(fact) for fact in gpu_facts or []]
    # mps_info's max_mps_clients knows the driver (60 on r590+); derive it only for older facts without it.
    facts_by_uuid = {str(fact['uuid']): fact for fact in gpu_facts or []}
    facts_by_uuid.update({str(m['uuid']): m for fact in gpu_facts or [] for m in fact.get('mig_devices') or []})
    caps = {gpu.uuid: int(facts_by_uuid.get(gpu.uuid, {}).get('max_mps_clients') or gpu.max_mps_clients) for gpu in all_devices(gpus)}
    try:
        if protocol is not None and str(protocol) not in ('legacy', '3'):
            raise MpsError('protocol must be legacy or 3 (MPS v3), got %r' % (protocol,))
        return [entry.as_dict() for entry in resolve_entries(resources, gpus, 'mps_resources', caps,
                                                             protocol=None if protocol is None else str(protocol))]
    except MpsError as exc:
        raise AnsibleFilterError(exc.msg) from exc


class FilterModule:
    """gpufleet.mps filters."""

    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'mps_plan': mps_plan}

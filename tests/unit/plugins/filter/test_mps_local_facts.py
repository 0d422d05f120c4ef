# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.filter.mps_local_facts import mps_local_facts

GPUS = [{'index': 0, 'uuid': 'GPU-a', 'name': 'NVIDIA H100 80GB HBM3', 'memory_total_mib': 81559, 'compute_mode': 'exclusive_process'},
        {'index': 1, 'uuid': 'GPU-b', 'name': 'NVIDIA H100 80GB HBM3', 'memory_total_mib': 81559, 'compute_mode': 'default'}]
PLAN = [{'name': 'example.com/infer', 'devices': ['GPU-b'], 'replicas': 4, 'multiuser': False},
        {'name': 'train', 'devices': ['GPU-a'], 'replicas': None, 'multiuser': True}]
DAEMONS = [{'name': 'example.com/infer', 'healthy': True, 'pid': 4242, 'started_at': '2026-12-03T10:00:00Z',
            'env': {'CUDA_MPS_PIPE_DIRECTORY': '/run/mps/example.com/infer/pipe'},
            'limits': {'persisted': {'active_thread_percentage': 25.0, 'pinned_device_mem_limit_mib': {'GPU-b': 20389}}}}]


def test_resources_with_their_gpus_limits_and_client_environment_and_nothing_that_changes_by_itself():
    facts = mps_local_facts(PLAN, DAEMONS, GPUS, '/run/mps')
    infer, train = facts['resources']
    assert infer == {'name': 'example.com/infer', 'multiuser': False, 'replicas': 4, 'healthy': True,
                     'devices': [{'index': 1, 'uuid': 'GPU-b', 'name': 'NVIDIA H100 80GB HBM3', 'memory_total_mib': 81559}],
                     'active_thread_percentage': 25.0, 'pinned_device_mem_limit_mib': {'GPU-b': 20389},
                     'env': {'CUDA_MPS_PIPE_DIRECTORY': '/run/mps/example.com/infer/pipe'}}
    assert not train['healthy'] and train['env'] == {} and train['active_thread_percentage'] is None
    assert facts['format'] == 1 and facts['root'] == '/run/mps' and not facts['ready']
    assert 'pid' not in str(facts) and '2026' not in str(facts)
    assert mps_local_facts(PLAN[:1], DAEMONS, GPUS, '/run/mps')['ready']
    assert not mps_local_facts([], [], GPUS, '/run/mps')['ready']


def test_wrong_inputs_are_refused_naming_the_filter():
    with pytest.raises(AnsibleFilterError, match='^mps_local_facts: '):
        mps_local_facts({'name': 'x'}, DAEMONS, GPUS, '/run/mps')

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.mps.plugins.filter.mps_plan import mps_plan


def facts(*models):
    return [{'index': i, 'uuid': 'GPU-%08x-0000' % (i + 1), 'name': name, 'memory_total_mib': mib, 'compute_capability': cc}
            for i, (name, mib, cc) in enumerate(models)]


H100 = ('NVIDIA H100 80GB HBM3', 81559, '9.0')
T4 = ('Tesla T4', 15360, '7.5')
P100 = ('Tesla P100-PCIE-16GB', 16280, '6.0')


def test_replicas_by_model_with_glob_and_default():
    gpus = facts(H100, H100, T4)
    plan = mps_plan([{'name': 'a', 'devices': [0, 1], 'replicas': {'NVIDIA H100*': 8, 'default': 2}},
                     {'name': 'b', 'devices': [2], 'replicas': {'NVIDIA H100*': 8, 'default': 2}}], gpus)
    assert [(p['name'], p['replicas'], p['indices']) for p in plan] == [('a', 8, [0, 1]), ('b', 2, [2])]
    assert plan[0]['devices'] == ['GPU-00000001-0000', 'GPU-00000002-0000']
    assert plan[0]['has_limits']


def test_default_resource_takes_every_gpu_and_has_no_limits():
    plan = mps_plan([{'name': 'nvidia.com/gpu'}], facts(H100, H100))
    assert plan[0]['indices'] == [0, 1] and not plan[0]['has_limits'] and plan[0]['multiuser'] is False


@pytest.mark.parametrize('resources, message', [
    ([{'name': 'a'}, {'name': 'b', 'devices': [0]}], 'in both'),
    ([{'name': 'a', 'devices': [5]}], 'no GPU with index 5'),
    ([{'name': '../x'}], 'name'),
    ([{'name': 'a', 'devices': [0]}, {'name': 'a', 'devices': [1]}], 'unique'),
    ([{'name': 'a', 'replicas': 49}], 'exceeds the 48'),
    ([{'name': 'a', 'devices': [2], 'replicas': 17}], 'exceeds the 16'),
    ([{'name': 'a', 'replicas': {'Tesla*': 2}}], 'no entry matches'),
    ([{'name': 'a', 'devices': [0, 2], 'replicas': {'NVIDIA*': 4, 'default': 2}}], 'different replicas'),
    ([{'name': 'a', 'replicas': 0}], 'at least 1'),
    ({'name': 'a'}, 'must be a list'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '20 GB'}], r'mps_resources\[a\]\.pinned_device_mem_limit: .*20 GB'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '20GB'}], 'ambiguous'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '200G'}],
     r'^mps_resources\[a\]\.pinned_device_mem_limit: 204800 MiB \(200 GiB\) is more than GPU 0 \(GPU-00000001-0000, '
     r'NVIDIA H100 80GB HBM3\) has: 81559 MiB \(79\.65 GiB\); give at most 81559M$'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '80G'}], r'81920 MiB \(80 GiB\) is more than GPU 0'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '20MB'}], r'write 20M or 20MiB for 20 x 2\^20 bytes, or 19M for 20 x 10\^6'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': {0: '20GB'}}], r'pinned_device_mem_limit\[0\]: \'20GB\' is ambiguous'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '20Gi'}], r"'20Gi' is not a size: a number and the unit M, MiB, G or GiB"),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': 20480}], r'20480 is not a size'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': {1: '1G'}}], r"1 \(GPU 1 \(GPU-00000002-0000\)\) is not one of the daemon's devices \(0\)"),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': {0: '1G', 'GPU-00000001': '2G'}}], r'GPU 0 \(GPU-00000001-0000\) is given twice'),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': {}}], r'must be a size or a non-empty mapping'),
    ([{'name': 'a', 'devices': [0, 1], 'pinned_device_mem_limit': {1: '90G'}}], 'more than GPU 1'),
    ([{'name': 'a', 'devices': [0], 'active_thread_percentage': 150}], r'mps_resources\[a\]\.active_thread_percentage'),
    ([{'name': 'a', 'devices': [2], 'multiuser': True}], r'multiuser: needs GPUs of compute capability 7\.0 \(Volta\) or newer: GPU 2'),
    ([{'devices': [0]}], 'with a name'),
])
def test_preflight_refuses_bad_resource_lists_naming_the_resource(resources, message):
    with pytest.raises(AnsibleFilterError, match=message):
        mps_plan(resources, facts(H100, H100, P100))


def test_preflight_checks_sizes_against_each_resources_own_gpus_and_allows_all_of_a_gpu():
    gpus = facts(H100, T4)
    plan = mps_plan([{'name': 'big', 'devices': [0], 'pinned_device_mem_limit': '40G'},
                     {'name': 'small', 'devices': [1], 'pinned_device_mem_limit': '15G'}], gpus)  # all of the T4
    assert [p['pinned_device_mem_limit'] for p in plan] == ['40G', '15G']
    assert mps_plan([{'name': 'a', 'pinned_device_mem_limit': {0: '81559M', 'GPU-00000002': '15360MiB'}}], gpus)[0]['has_limits']
    with pytest.raises(AnsibleFilterError, match=r'^mps_resources\[small\]\.pinned_device_mem_limit: 16384 MiB \(16 GiB\) is more '
                                                 r'than GPU 1 \(GPU-00000002-0000, Tesla T4\) has: 15360 MiB \(15 GiB\)'):
        mps_plan([{'name': 'big', 'devices': [0], 'pinned_device_mem_limit': '40G'},
                  {'name': 'small', 'devices': [1], 'pinned_device_mem_limit': '16G'}], gpus)
    with pytest.raises(AnsibleFilterError, match=r'40960 MiB \(40 GiB\) is more than GPU 1 \(GPU-00000002-0000, Tesla T4\)'):
        mps_plan([{'name': 'both', 'pinned_device_mem_limit': '40G'}], gpus)  # one size for every GPU of the resource


def test_preflight_takes_the_client_cap_from_mps_info_which_knows_the_driver():
    gpus = facts(H100)
    gpus[0]['max_mps_clients'] = 60  # mps_info on an r590 driver
    assert mps_plan([{'name': 'a', 'replicas': 60}], gpus)[0]['replicas'] == 60
    with pytest.raises(AnsibleFilterError, match='exceeds the 60'):
        mps_plan([{'name': 'a', 'replicas': 61}], gpus)

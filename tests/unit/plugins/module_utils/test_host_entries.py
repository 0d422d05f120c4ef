# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu
from ansible_collections.gpufleet.mps.plugins.module_utils._host.facts import facts_text, local_facts
from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import check_resources, resolve_entries, replicas_for


def gpu(index, name='NVIDIA H100 80GB HBM3', mib=81559, cc=(9, 0), mig=False):
    return Gpu(index, 'GPU-%08d-0000' % (index + 1), name, mib, cc, 'default', mig, mig, True)


GPUS = [gpu(0), gpu(1), gpu(2, 'Tesla T4', 15360, (7, 5)), gpu(3, 'Tesla P100-PCIE-16GB', 16280, (6, 0))]


def test_a_plan_resolves_devices_replicas_by_model_and_limits():
    plans = resolve_entries([{'name': 'train', 'devices': [0, 1]},
                            {'name': 'infer', 'devices': ['GPU-00000003'], 'replicas': {'NVIDIA H100*': 8, 'default': 2},
                             'pinned_device_mem_limit': '4G'}], GPUS)
    assert [p.name for p in plans] == ['train', 'infer']
    assert [g.index for g in plans[0].devices] == [0, 1]
    assert not plans[0].has_limits
    assert plans[1].replicas == 2 and plans[1].limits == {'pinned_device_mem_limit': {'*': 4096}}
    assert plans[1].as_dict()['devices'] == ['GPU-00000003-0000'] and plans[1].as_dict()['has_limits']


def test_devices_default_to_every_gpu():
    assert len(resolve_entries([{'name': 'all'}], GPUS[:2])[0].devices) == 2


@pytest.mark.parametrize('resources, message', [
    ([{'name': 'a', 'device': [0]}], r"^resources\[a\]: unknown key\(s\) device; the keys are name, devices"),
    ([{'name': 'a', 'devices': [0], 'replica': 4}], r'unknown key\(s\) replica'),
    ([{'name': 'a', 'devices': [0]}, {'name': 'a', 'devices': [1]}], "'a' is listed twice"),
    ([{'name': 'a', 'devices': [0]}, {'name': 'b', 'devices': [0]}], r"GPU 0 \(GPU-00000001-0000\) is in both 'a' and 'b'"),
    ([{'name': 'a', 'devices': [0], 'pinned_device_mem_limit': '20 GB'}], r"^resources\[a\]\.pinned_device_mem_limit: '20 GB' is not a size"),
    ([{'name': 'a', 'devices': [0], 'active_thread_percentage': 150}], r'^resources\[a\]\.active_thread_percentage: 150'),
    ([{'name': 'a', 'devices': [2], 'pinned_device_mem_limit': '16G'}], 'more than GPU 2'),
    ([{'name': 'a', 'devices': [0, 2], 'replicas': {'NVIDIA*': 4, 'default': 2}}], 'different replicas'),
    ([{'name': 'a', 'devices': [3], 'multiuser': True}], r'^resources\[a\]\.multiuser: needs GPUs of compute capability 7\.0'),
    ([{'name': 'a', 'devices': [3], 'replicas': 17}], 'exceeds the 16'),
    ([{'name': 'a/b/c'}], r'^resources\[0\]\.name'),
    ([{'devices': [0]}], r'^resources\[0\]: must be a mapping with a name'),
    ({'name': 'a'}, r'^resources: must be a list'),
])
def test_one_bad_entry_refuses_the_whole_list_naming_entry_and_key(resources, message):
    with pytest.raises(MpsError, match=message):
        resolve_entries(resources, GPUS)


def test_a_gpu_in_mig_mode_is_refused_naming_it():
    with pytest.raises(MpsError, match=r'resources\[a\]\.devices: MIG is enabled on GPU 1'):
        resolve_entries([{'name': 'a', 'devices': [1]}], [gpu(0), gpu(1, mig=True)])


def test_replicas_by_model_match_in_order_with_a_default():
    assert replicas_for({'Tesla*': 2, 'default': 4}, 'Tesla T4', 'r') == 2
    assert replicas_for({'Tesla*': 2, 'default': 4}, 'NVIDIA A100', 'r') == 4
    assert replicas_for(3, 'x', 'r') == 3 and replicas_for(None, 'x', 'r') is None
    with pytest.raises(MpsError, match='no entry matches'):
        replicas_for({'Tesla*': 2}, 'NVIDIA A100', 'r')


def test_local_facts_hold_nothing_that_changes_between_runs_and_render_as_to_nice_json():
    plan = [p.as_dict() for p in resolve_entries([{'name': 'train', 'devices': [0], 'replicas': 4}], GPUS)]
    daemons = [{'name': 'train', 'healthy': True, 'pid': 4242, 'env': {'CUDA_MPS_PIPE_DIRECTORY': '/r/train/pipe'},
                'limits': {'persisted': {'active_thread_percentage': 25.0, 'pinned_device_mem_limit_mib': {'*': 20389}}}}]
    facts = local_facts(plan, daemons, [g.facts() for g in GPUS], '/r')
    assert facts['ready'] and facts['resources'][0]['replicas'] == 4
    device = {'index': 0, 'uuid': 'GPU-00000001-0000', 'name': 'NVIDIA H100 80GB HBM3', 'memory_total_mib': 81559}
    assert facts['resources'][0]['devices'] == [device]
    text = facts_text(facts)
    assert '4242' not in text and text.endswith('}\n') and text.startswith('{\n    "format": 1,')
    assert not local_facts([], [], [], '/r')['ready']


@pytest.mark.parametrize('resources, message', [
    ([{'name': 'a', 'device': [0]}], r'unknown key\(s\) device'),
    ([{'name': 'a', 'replicas': 64}], r'^resources\[a\]\.replicas: must be a number of clients from 1 to 60'),
    ([{'name': 'a', 'replicas': {'NVIDIA*': 0, 'default': 2}}], r'resources\[a\]\.replicas'),
    ([{'name': 'a', 'pinned_device_mem_limit': '20 GB'}], r"'20 GB' is not a size"),
    ([{'name': 'a', 'pinned_device_mem_limit': {0: '20GB'}}], r'pinned_device_mem_limit\[0\]: .20GB. is ambiguous'),
    ([{'name': 'a', 'active_thread_percentage': 150}], r'active_thread_percentage'),
    ([{'name': 'a'}, {'name': 'a'}], 'listed twice'),
    ([{'name': 'a'}, {'name': 'b', 'multiuser': 'maybe'}], r"^resources\[b\]\.multiuser: must be true or false; got 'maybe'$"),
    ([{'name': 'a', 'multiuser': [True]}], r'^resources\[a\]\.multiuser: must be true or false; got \[True\]$'),
])
def test_what_needs_no_gpu_is_refused_without_gpus(resources, message):
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import check_resources
    with pytest.raises(MpsError, match=message):
        check_resources(resources)


@pytest.mark.parametrize('value, expected', [(None, False), (True, True), ('yes', True), ('False', False), (0, False), ('on', True)])
def test_multiuser_takes_ansible_booleans(value, expected):
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import multiuser
    assert multiuser({'name': 'a', 'multiuser': value}, 'resources[a]') is expected


def test_a_good_list_passes_without_gpus():
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import check_resources
    check_resources([{'name': 'a', 'devices': [0, 'GPU-1'], 'replicas': {'NVIDIA*': 8, 'default': 60}, 'multiuser': True,
                      'pinned_device_mem_limit': {0: '20G'}, 'active_thread_percentage': 25}])


def test_local_facts_name_the_pinned_limits_of_the_resources_own_gpus_only():
    """A replica count persists a limit for every GPU of the host; a scheduler reading the facts sees the daemon's."""
    plan = [p.as_dict() for p in resolve_entries([{'name': 'gpu1', 'devices': [1], 'replicas': 4}], GPUS)]
    every = {gpu.uuid: gpu.memory_total_mib // 4 for gpu in GPUS}
    daemons = [{'name': 'gpu1', 'healthy': True,
                'limits': {'persisted': {'active_thread_percentage': 25.0, 'pinned_device_mem_limit_mib': every}}}]
    own = local_facts(plan, daemons, [g.facts() for g in GPUS], '/r')['resources'][0]
    assert own['pinned_device_mem_limit_mib'] == {GPUS[1].uuid: GPUS[1].memory_total_mib // 4}
    assert [device['uuid'] for device in own['devices']] == [GPUS[1].uuid]


def test_a_plan_refuses_replicas_that_together_pin_more_than_the_gpu_unless_oversubscribe():
    entry = {'name': 'infer', 'devices': [2], 'replicas': 4, 'pinned_device_mem_limit': '4G'}  # a T4: 15360 MiB
    with pytest.raises(MpsError, match=r'^resources\[infer\]\.pinned_device_mem_limit: 4096 MiB for each of 4 replicas is 16384 MiB'):
        resolve_entries([entry], GPUS)
    plans = resolve_entries([dict(entry, oversubscribe='yes')], GPUS)
    assert plans[0].oversubscribe and plans[0].limits['pinned_device_mem_limit'] == {'*': 4096}
    with pytest.raises(MpsError, match=r"^resources\[infer\]\.oversubscribe: must be true or false; got 'maybe'"):
        check_resources([dict(entry, oversubscribe='maybe')])

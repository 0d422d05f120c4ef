# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG devices: inventory through the real nvidia-ml-py, addressing, the scaled client cap, planning."""
from __future__ import annotations

import configparser
import math

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import DeviceSelectionError, InvalidParameterError, MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import (
    Gpu, MigDevice, Nvml, all_devices, profile_slices,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import resolve_entries, replicas_for
from ansible_collections.gpufleet.mps.plugins.module_utils._selectors import resolve_devices, visible_gpus


@pytest.fixture(name='mixed')
def fixture_mixed(gpu_host):
    """mig-mixed.ini read through NVML: GPU 0 whole, GPU 1 split 3g.40gb + 2g.20gb + 1g.10gb, GPU 2 in MIG mode, empty."""
    path = gpu_host('mig-mixed.ini')
    with Nvml() as nvml:
        gpus = nvml.gpus()
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return gpus, parser


def test_inventory_lists_mig_devices_under_their_gpu(mixed):
    gpus, parser = mixed
    assert [len(gpu.mig_devices) for gpu in gpus] == [0, 3, 0]
    assert [gpu.mig_enabled for gpu in gpus] == [False, True, True]
    migs = gpus[1].mig_devices
    assert [(m.address, m.profile, m.memory_total_mib, m.multiprocessor_count, m.gpu_instance_id, m.compute_instance_id)
            for m in migs] == [('1:0', '3g.40gb', 40192, 60, 2, 0), ('1:1', '2g.20gb', 20096, 32, 3, 0), ('1:2', '1g.10gb', 9984, 16, 9, 0)]
    assert [m.uuid for m in migs] == [parser['gpu1.mig%d' % i]['uuid'] for i in range(3)]
    assert all(m.parent_uuid == gpus[1].uuid and m.compute_capability == (9, 0) and m.is_mig for m in migs)
    assert [m.compute_instance_slices for m in migs] == [3, 2, 1]
    assert [m.max_mps_clients for m in migs] == [20, 13, 6]  # 48 x slices / 7, rounded down
    facts = gpus[1].facts()['mig_devices']
    assert [(f['address'], f['profile'], f['max_mps_clients']) for f in facts] == [('1:0', '3g.40gb', 20), ('1:1', '2g.20gb', 13), ('1:2', '1g.10gb', 6)]
    assert gpus[0].facts()['mig_devices'] == []


def test_a_host_without_mig_makes_no_mig_call(gpu_host, tmp_path, monkeypatch):
    gpu_host('h100x4.ini')
    log = tmp_path / 'calls'
    monkeypatch.setenv('FAKE_NVML_CALL_LOG', str(log))
    with Nvml() as nvml:
        assert all(not gpu.mig_devices for gpu in nvml.gpus())
    assert 'Mig' not in log.read_text().replace('nvmlDeviceGetMigMode', '')


@pytest.mark.parametrize('selector, address', [
    ('1:0', '1:0'), ('1:2', '1:2'), (' 1:1 ', '1:1'),
])
def test_mig_devices_by_address(mixed, selector, address):
    gpus, _parser = mixed
    assert [gpu.address for gpu in resolve_devices([selector], gpus)] == [address]


def test_mig_devices_by_uuid_and_legacy_form(mixed):
    gpus, parser = mixed
    uuid = parser['gpu1.mig1']['uuid']
    assert resolve_devices([uuid], gpus)[0].address == '1:1'
    assert resolve_devices([uuid.upper().replace('MIG-', 'MIG-')], gpus)[0].address == '1:1'
    legacy = 'MIG-%s/3/0' % parser['gpu1']['uuid']
    assert resolve_devices([legacy], gpus)[0].address == '1:1'


@pytest.mark.parametrize('selectors, message', [
    ([1], r'MIG is enabled on GPU 1 .*its MIG devices are 1:0 \(3g\.40gb, MIG-.*\), 1:1 \(2g\.20gb, .*1:2 \(1g\.10gb'),
    ([2], r'MIG is enabled on GPU 2 .*no MIG devices yet'),
    (['0:0'], r'0:0 names a MIG device, and MIG is not enabled on GPU 0'),
    (['1:5'], r'GPU 1 .* has no MIG device 5; its MIG devices are 1:0'),
    (['7:0'], r'there is no GPU with index 7'),
    (['MIG-00000000-1111-2222-3333-444444444444'], r'no MIG device is .*new UUID.*1:0 \(3g\.40gb'),
    (['1:0', '1:1'], r'MIG device 1:0 .* and MIG device 1:1 .* cannot share a resource: .*one control daemon per MIG device.*R570'),
    ([0, '1:2'], r'MIG device 1:2 .* must be the only device of its resource \(it is listed with GPU 0'),
    (['1:0', '1:0'], r'listed more than once'),
])
def test_mig_refusals_say_why_and_what_to_give(mixed, selectors, message):
    gpus, _parser = mixed
    with pytest.raises(DeviceSelectionError, match=message):
        resolve_devices(selectors, gpus)


def test_all_is_every_gpu_not_in_mig_mode_and_warns_of_the_rest(mixed):
    gpus, _parser = mixed
    warnings = []
    assert [gpu.index for gpu in resolve_devices('all', gpus, warnings=warnings)] == [0]
    assert len(warnings) == 1
    assert 'leaves out GPU 1 (' in warnings[0] and 'GPU 2 (' in warnings[0] and '1:0 (3g.40gb' in warnings[0]
    only_mig = [gpu for gpu in gpus if gpu.mig_enabled]
    with pytest.raises(DeviceSelectionError, match=r'every GPU of this host is in MIG mode: list MIG devices instead'):
        resolve_devices('all', only_mig)


def test_visible_devices_of_another_daemon_resolve_mig_uuids(mixed):
    gpus, parser = mixed
    uuid = parser['gpu1.mig2']['uuid']
    assert [gpu.address for gpu in visible_gpus(uuid, gpus)] == ['1:2']
    assert len(visible_gpus(None, gpus)) == len(all_devices(gpus)) == 6


@pytest.mark.parametrize('profile, slices', [
    ('1g.10gb', (1, 1)), ('3g.40gb', (3, 3)), ('1c.3g.40gb', (3, 1)), ('7g.80gb', (7, 7)), ('1g.10gb+me', (None, None)), ('', (None, None)),
])
def test_profile_slices(profile, slices):
    assert profile_slices(profile) == slices


def mig(slices, driver='560.35.03', cc=(9, 0), max_slices=7, profile=''):
    return MigDevice(1, 'MIG-x', 'H100 MIG', 10000, cc, 'unsupported', None, None, None, driver, mig_index=0,
                     profile=profile or '%dg.10gb' % slices, compute_instance_slices=slices, max_slices=max_slices)


@pytest.mark.parametrize('device, cap', [
    (mig(1), 6), (mig(2), 13), (mig(3), 20), (mig(4), 27), (mig(7), 48),
    (mig(1, driver='590.44.01'), 8), (mig(7, driver='590.44.01'), 60),
    (mig(1, max_slices=4), 12),                       # an A30: 4 slices
    (mig(None, profile='1c.3g.40gb'), 6),             # no attributes: the profile's CI slices
])
def test_the_client_cap_is_scaled_by_the_compute_instance(device, cap):
    assert device.max_mps_clients == cap


def test_replicas_by_profile_and_by_model(mixed):
    gpus, _parser = mixed
    table = {'1g.10gb': 2, '3g.40gb': 6, 'NVIDIA H100*': 4}
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3 MIG 1g.10gb', 'r', '1g.10gb') == 2
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3 MIG 3g.40gb', 'r', '3g.40gb') == 6
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3', 'r') == 4
    with pytest.raises(InvalidParameterError, match=r"no entry matches MIG profile '2g.20gb'"):
        replicas_for({'1g.10gb': 2}, 'NVIDIA H100 80GB HBM3 MIG 2g.20gb', 'r', '2g.20gb')


def test_planning_mig_resources_with_replicas_by_profile(mixed):
    gpus, _parser = mixed
    warnings = []
    plans = resolve_entries([
        {'name': 'big', 'devices': ['1:0'], 'replicas': {'3g.40gb': 6, '1g.10gb': 2}},
        {'name': 'small', 'devices': ['1:2'], 'replicas': {'3g.40gb': 6, '1g.10gb': 2}},
        {'name': 'whole'},
    ], gpus, warnings=warnings)
    assert [(p.name, [d.address for d in p.devices], p.replicas) for p in plans] == [
        ('big', ['1:0'], 6), ('small', ['1:2'], 2), ('whole', ['0'], None)]
    assert len(warnings) == 1 and 'leaves out GPU 1' in warnings[0]
    assert plans[0].as_dict()['devices'] == [gpus[1].mig_devices[0].uuid]


@pytest.mark.parametrize('resources, message', [
    ([{'name': 'a', 'devices': ['1:2'], 'replicas': 7}], r'7 exceeds the 6 MPS clients of MIG device 1:2 .*1 of 7 slices'),
    ([{'name': 'a', 'devices': ['1:1'], 'pinned_device_mem_limit': '20G'}], r'more than MIG device 1:1 \(2g\.20gb, MIG-.*\) has: 20096 MiB'),
    ([{'name': 'a', 'devices': ['1:0']}, {'name': 'b', 'devices': ['1:0']}], r"MIG device 1:0 .* is in both 'a' and 'b'"),
])
def test_mig_plans_are_refused_naming_the_mig_device(mixed, resources, message):
    gpus, _parser = mixed
    with pytest.raises(MpsError, match=message):
        resolve_entries(resources, gpus)


def test_two_mig_devices_of_one_gpu_in_two_resources_are_fine(mixed):
    gpus, _parser = mixed
    plans = resolve_entries([{'name': 'a', 'devices': ['1:0']}, {'name': 'b', 'devices': ['1:1']}], gpus)
    assert [p.devices[0].address for p in plans] == ['1:0', '1:1']


def test_a_whole_gpu_is_never_given_a_compute_mode_through_a_mig_device(mixed):
    gpus, _parser = mixed
    from ansible_collections.gpufleet.mps.plugins.module_utils._errors import NvmlError  # pylint: disable=import-outside-toplevel
    with Nvml() as nvml, pytest.raises(NvmlError, match='compute modes do not apply to a MIG device'):
        nvml.set_compute_mode(gpus[1].mig_devices[0], 'exclusive_process')


def test_a_gpu_is_not_a_mig_device():
    gpu = Gpu(0, 'GPU-x', 'H100', 81559, (9, 0), 'default', False, False, True)
    assert not gpu.is_mig and gpu.address == '0' and gpu.label == 'GPU 0 (GPU-x)'


def test_a_mig_resource_under_systemd_sets_no_compute_mode_and_pins_the_mig_uuid(mixed, tmp_path, see):
    """The unit's ExecStartPre sets a compute mode only when MPS_COMPUTE_MODE is set: empty for a MIG device."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonSetup, DaemonManager  # pylint: disable=import-outside-toplevel
    gpus, parser = mixed
    params = dict(root=str(tmp_path / 'root'), config_dir=str(tmp_path / 'etc'), control_binary='/bin/true', name='infer',
                  state='started', devices=['1:0'], multiuser=False, compute_mode='exclusive_process', supervisor='none',
                  start_timeout=5, stop_timeout=5, busy='refuse', busy_timeout=5, log_mode='0755', shm=False,
                  container_root='/mps', selinux_type='')
    setup = DaemonSetup.from_params(params, lambda given: given)
    with Nvml() as nvml:
        manager = DaemonManager(setup.paths, setup.config, setup.daemon, nvml, 'systemd', check_mode=True, unit_dir=str(tmp_path / 'units'))
        see(manager, gpus=nvml.gpus())
        wanted = manager.devices.wanted(['1:0'], multiuser=False, compute_mode='exclusive_process', enabled=True)
        env = manager.unit_files.env_values(wanted)
    assert wanted.compute_mode == 'unchanged'
    assert 'EXCLUSIVE_PROCESS not applied: MIG device 1:0 (3g.40gb' in manager.run.planned.compute_mode_note
    assert env['CUDA_VISIBLE_DEVICES'] == parser['gpu1.mig0']['uuid'] == gpus[1].mig_devices[0].uuid
    assert env['MPS_COMPUTE_MODE'] == ''
    whole = DaemonManager(setup.paths, setup.config, setup.daemon, Nvml(), 'systemd', check_mode=True, unit_dir=str(tmp_path / 'units'))
    with whole.run.nvml:
        see(whole, gpus=whole.run.nvml.gpus())
        values = whole.unit_files.env_values(whole.devices.wanted([0], multiuser=False, compute_mode='exclusive_process', enabled=True))
    assert values['MPS_COMPUTE_MODE'] == 'EXCLUSIVE_PROCESS'


def test_a_profile_key_wins_over_a_model_glob_listed_before_it(mixed):
    table = {'NVIDIA H100*': 8, '1g.10gb': 2}
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3 MIG 1g.10gb', 'r', '1g.10gb') == 2
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3 MIG 3g.40gb', 'r', '3g.40gb') == 8  # no profile key: the model's
    assert replicas_for(table, 'NVIDIA H100 80GB HBM3', 'r') == 8


def test_an_unquoted_mig_address_read_by_yaml_as_a_number_gets_a_hint(mixed):
    gpus, _parser = mixed
    with pytest.raises(DeviceSelectionError, match=r'no GPU with index 60 .*an unquoted 1:0 is read by YAML as the number 60 - quote'):
        resolve_devices([60], gpus)


@pytest.mark.parametrize('index, hint', [(99, True), (130, True), (30, False), (200, False), (61 * 60, False)])
def test_the_yaml_hint_comes_only_where_a_mig_address_could_be_meant(mixed, index, hint):
    """Only an index whose GPU part names a GPU in MIG mode gets the hint: 99 (1:39) and 130 (2:10) do; 30 (GPU 0, not in
    MIG mode), 200 (3:20, no GPU 3) and 3660 (61:0) only hear that there is no such GPU."""
    gpus, _parser = mixed
    with pytest.raises(DeviceSelectionError) as caught:
        resolve_devices([index], gpus)
    assert ('read by YAML' in caught.value.msg) == hint, caught.value.msg
    assert 'there is no GPU with index %d' % index in caught.value.msg


def test_another_daemon_on_a_gpu_in_mig_mode_claims_its_mig_devices(mixed):
    gpus, _parser = mixed
    assert [gpu.address for gpu in visible_gpus('1', gpus)] == ['1', '1:0', '1:1', '1:2']


def test_a_re_created_instance_gets_its_replicas_share_only_when_the_sizes_were_shares():
    from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import Limits  # pylint: disable=import-outside-toplevel
    new = MigDevice(1, 'MIG-new', 'H100 MIG', 20096, (9, 0), 'unsupported', None, None, None)
    other = MigDevice(1, 'MIG-other', 'H100 MIG', 9984, (9, 0), 'unsupported', None, None, None)
    # 'MIG-gone' is the destroyed instance's share: no longer known, so not compared
    shares = Limits(50.0, {'MIG-gone': 5000, 'MIG-other': 4992}, 2)
    assert [gpu.uuid for gpu in shares.add_replica_shares([new], [new, other])] == ['MIG-new']
    assert shares.pinned_device_mem_limit['MIG-new'] == 10048
    explicit = Limits(50.0, {'MIG-other': 3000}, 2)  # a size given explicitly: not a share, never extended
    assert explicit.add_replica_shares([new], [new, other]) == [] and 'MIG-new' not in explicit.pinned_device_mem_limit
    assert Limits(50.0, {}, 2).add_replica_shares([new], [new]) == []


def test_a_percentage_under_one_sm_of_a_mig_device_is_warned_naming_the_smallest_that_gives_one(mixed):
    gpus, _parser = mixed
    small = gpus[1].mig_devices[2]
    assert small.multiprocessor_count  # NVML gives a MIG device's SM count
    smallest = math.ceil(1000.0 / small.multiprocessor_count) / 10
    warnings = []
    resolve_entries([{'name': 'a', 'devices': ['1:2'], 'active_thread_percentage': smallest - 0.2},
                    {'name': 'b', 'devices': ['1:1'], 'active_thread_percentage': 50}], gpus, warnings=warnings)
    expected = ('resources[a].active_thread_percentage: %s%% of the %d SMs of %s is less than one SM; the smallest percentage '
                'that gives one is %s' % (round(smallest - 0.2, 1), small.multiprocessor_count, small.label, smallest))
    assert warnings == [expected]
    warnings = []
    resolve_entries([{'name': 'a', 'devices': ['1:2'], 'active_thread_percentage': smallest}], gpus, warnings=warnings)
    assert warnings == []

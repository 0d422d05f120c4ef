# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Devices: FAKE_NVML_CONFIG, CUDA_VISIBLE_DEVICES remapping, DEV arguments, by-UUID limits."""
from __future__ import annotations

import os
from typing import Callable

import pytest

from conftest import GPUS, SimHost, write_ini
import mps_daemon

UUIDS = [g[1] for g in GPUS]


def gpus() -> list[mps_daemon.Gpu]:
    return [mps_daemon.Gpu(index=i, uuid=u, name=n, memory_total_mib=m, cc_major=int(cc[0]), cc_minor=int(cc[2]))
            for i, (n, u, m, cc) in enumerate(GPUS)]


@pytest.mark.parametrize('cvd,expected', [
    (None, [0, 1, 2, 3]),
    ('', []),
    ('0', [0]),
    ('2,0', [2, 0]),
    ('3,2,1,0', [3, 2, 1, 0]),
    (' 1 , 2 ', [1, 2]),
    ('1,7,2', [1]),          # out of range: the list stops there
    ('1,x,2', [1]),          # garbage stops it too
    ('1,1,2', [1]),          # a duplicate is invalid
    ('-1,0', []),
    ('01', [1]),
    (UUIDS[2], [2]),
    (f'{UUIDS[3]},{UUIDS[0]}', [3, 0]),
    ('GPU-9f00', [2]),       # unique prefix
    ('gpu-9F00AA01', [2]),   # case does not matter
    ('GPU-6a2b5c1e', []),    # ambiguous prefix (gpu0 and gpu1)
    ('GPU-6a2b5c1e-1111,0', [1, 0]),
    ('2,GPU-1234', [2, 3]),
    ('GPU-ffff', []),
    ('MIG-6a2b5c1e-0000-4000-8000-000000000000', []),
    ('6a2b5c1e-0000-4000-8000-000000000000', []),  # a UUID needs its GPU- prefix
])
def test_cuda_visible_devices_is_applied_as_cuda_does(cvd: str, expected: list[int]) -> None:
    assert [g.index for g in mps_daemon.visible_gpus(gpus(), cvd)] == expected


def test_load_gpus_reads_the_gpu_sections_in_order(tmp_path: os.PathLike) -> None:
    path = os.path.join(tmp_path, 'x.ini')
    write_ini(path)
    loaded = mps_daemon.load_gpus(path)
    assert [(g.index, g.uuid, g.name, g.memory_total_mib, g.compute_capability, g.max_clients) for g in loaded] == [
        (i, u, n, m, cc, 16 if cc == '6.0' else 48) for i, (n, u, m, cc) in enumerate(GPUS)]


def test_unset_or_unreadable_config_means_no_gpus(tmp_path: os.PathLike) -> None:
    assert not mps_daemon.load_gpus(None)
    assert not mps_daemon.load_gpus(os.path.join(tmp_path, 'missing.ini'))


def test_shipped_nvml_configs_parse_when_present() -> None:
    configs = os.path.join(os.path.dirname(__file__), '..', 'nvml', 'configs')
    if not os.path.isdir(configs):
        pytest.skip('no tests/fakes/nvml/configs yet')
    for name in sorted(os.listdir(configs)):
        if name.endswith('.ini'):
            loaded = mps_daemon.load_gpus(os.path.join(configs, name))
            assert loaded, name
            assert all(g.uuid.startswith('GPU-') for g in loaded), name
            assert all(m.uuid.startswith('MIG-') for g in loaded for m in g.mig_devices), name


def test_daemon_sees_its_visible_devices_in_cuda_order(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': f'2,{UUIDS[0][:17]}'})
    assert host.out(['sim_devices']).splitlines() == [
        f'0 {UUIDS[2]} 7.0 48 Tesla V100-SXM2-16GB',
        f'1 {UUIDS[0]} 9.0 48 NVIDIA H100 80GB HBM3',
    ]


def test_ordinals_are_relative_to_cuda_visible_devices(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '3,1'})
    host.out(['set_default_device_pinned_mem_limit 0 512M', 'set_default_device_pinned_mem_limit 1 2G'])
    assert host.out(['set_default_device_pinned_mem_limit 2 1G']) == ''  # no device 2 here: stored, never applied
    info = host.client().info()
    assert [(d['ordinal'], d['uuid']) for d in info['devices']] == [(0, UUIDS[3]), (1, UUIDS[1])]
    assert info['pinned_mem_limit_mib'] == {'0': 512, '1': 2048}
    host.wait_log('Server has started', 'server')
    messages = host.log_messages('server')
    assert 'Creating server context on device 0 (Tesla P100-PCIE-16GB)' in messages
    assert 'Creating server context on device 1 (NVIDIA H100 80GB HBM3)' in messages
    assert [m for m in messages if m.startswith('Device pinned memory limit')] == [
        'Device pinned memory limit for device 0 set to 0x20000000 bytes', 'Device pinned memory limit for device 1 set to 0x80000000 bytes']


def test_two_daemons_side_by_side_each_see_only_their_gpus(make_host: Callable[..., SimHost]) -> None:
    first, second = make_host(), make_host()
    write_ini(second.ini)
    second.ini = first.ini  # one host, one config: two daemons on disjoint GPU sets
    first.start(env={'CUDA_VISIBLE_DEVICES': UUIDS[0]})
    second.start(env={'CUDA_VISIBLE_DEVICES': f'{UUIDS[1]},{UUIDS[2]}', 'FAKE_NVML_CONFIG': first.ini})
    assert [line.split()[1] for line in first.out(['sim_devices']).splitlines()] == [UUIDS[0]]
    assert [line.split()[1] for line in second.out(['sim_devices']).splitlines()] == [UUIDS[1], UUIDS[2]]
    one, two = first.client().info(), second.client().info()
    assert one['server_pid'] != two['server_pid']
    assert [d['uuid'] for d in two['devices']] == [UUIDS[1], UUIDS[2]]


def test_dev_argument_is_not_checked_against_the_devices(host: SimHost) -> None:
    # NVIDIA's command reference [C]: an ordinal or UUID that does not exist is stored silently, read back
    # under itself and ignored when a server starts
    host.start(env={'CUDA_VISIBLE_DEVICES': '1'})
    assert host.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 1G', f'set_default_device_pinned_mem_limit {UUIDS[0]} 2G',
                     f'set_default_device_pinned_mem_limit {UUIDS[1][:12]} 3G', 'set_default_device_pinned_mem_limit 5 4G']) == ''
    assert host.out([f'get_default_device_pinned_mem_limit {UUIDS[1]}', f'get_default_device_pinned_mem_limit {UUIDS[0]}',
                     f'get_default_device_pinned_mem_limit {UUIDS[1][:12]}', 'get_default_device_pinned_mem_limit 5']) == '1G\n2G\n3G\n4G\n'
    assert host.out(['get_default_device_pinned_mem_limit 0']) == ''  # unset: nothing (r580)
    info = host.client().info()
    assert info['pinned_mem_limit_mib'] == {'0': None}
    host.wait_log('Server has started', 'server')
    assert not [m for m in host.log_messages('server') if m.startswith('Device pinned memory limit')]
    # only a token that is neither an ordinal nor a UUID is refused
    assert host.out(['set_default_device_pinned_mem_limit first 1G']) == 'Invalid device: first\n'


def test_getter_does_not_translate_between_uuid_and_ordinal(running: SimHost) -> None:
    assert running.out(['set_default_device_pinned_mem_limit 1 1G', f'get_default_device_pinned_mem_limit {UUIDS[1]}']) == ''
    assert running.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 2G', 'get_default_device_pinned_mem_limit 1',
                        f'get_default_device_pinned_mem_limit {UUIDS[1].upper().replace("GPU-", "gpu-")}']) == '1G\n2G\n'


def test_per_server_limit_for_a_missing_device_is_stored_and_ignored(running: SimHost) -> None:
    spid = running.client('--device', '0').info()['server_pid']
    assert running.out([f'set_device_pinned_mem_limit {spid} 9 1G', f'get_device_pinned_mem_limit {spid} 9']) == '1G\n'
    assert running.client('--device', '0').info()['pinned_mem_limit_mib'] == {'0': None}


def test_limit_set_by_uuid_is_accepted_but_not_applied(running: SimHost) -> None:
    assert running.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 2G']) == ''
    assert running.out([f'get_default_device_pinned_mem_limit {UUIDS[1]}']) == '2G\n'
    assert running.out(['get_default_device_pinned_mem_limit 1']) == ''
    info = running.client('--device', '1').info()
    assert info['pinned_mem_limit_mib'] == {'1': None}
    spid = info['server_pid']
    assert running.out([f'set_device_pinned_mem_limit {spid} {UUIDS[1]} 1G', f'get_device_pinned_mem_limit {spid} 1']) == ''
    assert running.client('--device', '1').info()['pinned_mem_limit_mib'] == {'1': None}


def test_limit_set_by_uuid_is_applied_with_the_switch(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_UUID_LIMITS': 'applied'})
    host.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 2G'])
    # still no translation in the getter: the ordinal has no value of its own
    assert host.out([f'get_default_device_pinned_mem_limit {UUIDS[1]}']) == '2G\n'
    assert host.out(['get_default_device_pinned_mem_limit 1']) == ''
    info = host.client('--device', '1').info()
    assert info['pinned_mem_limit_mib'] == {'1': 2048}
    spid = info['server_pid']
    # of the ordinal and the UUID of one device, the one set last wins
    host.out([f'set_device_pinned_mem_limit {spid} {UUIDS[1]} 3G', f'set_device_pinned_mem_limit {spid} 1 1G'])
    assert host.client('--device', '1').info()['pinned_mem_limit_mib'] == {'1': 1024}
    host.out([f'set_device_pinned_mem_limit {spid} {UUIDS[1]} 3G'])
    assert host.client('--device', '1').info()['pinned_mem_limit_mib'] == {'1': 3072}


def test_daemon_without_gpus_starts_but_clients_fail(host: SimHost) -> None:
    host.start(env={'FAKE_NVML_CONFIG': None})
    # device commands do not look at the devices: stored, as for any missing ordinal
    assert host.out(['sim_devices', 'set_default_device_pinned_mem_limit 0 1G', 'get_default_device_pinned_mem_limit 0']) == '1G\n'
    rc, out, _err = host.client().rest()
    assert rc == 1 and '"CUDA_ERROR_NO_DEVICE"' in out


def test_empty_cuda_visible_devices_hides_every_gpu(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': ''})
    assert host.out(['sim_devices']) == ''


def test_env_pinned_limit_keys_follow_the_remapping(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '2,0', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': f'1=3G,{UUIDS[2]}=1G'})
    assert host.out(['get_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit 1']) == '1G\n3G\n'


@pytest.mark.parametrize('cc,driver,limit', [
    ('3.5', 0, 16), ('6.1', 560, 16), ('7.0', 560, 48), ('7.5', 535, 48), ('9.0', 580, 48), ('10.0', 589, 48),
    ('7.0', 590, 60), ('9.0', 590, 60), ('10.0', 615, 60), ('6.1', 590, 16),
])
def test_clients_per_gpu_limit_is_16_before_volta_48_from_volta_60_from_r590(cc: str, driver: int, limit: int) -> None:
    major, minor = cc.split('.')
    gpu = mps_daemon.Gpu(index=0, uuid='GPU-x', name='x', memory_total_mib=1, cc_major=int(major), cc_minor=int(minor), driver_major=driver)
    assert gpu.max_clients == limit


@pytest.mark.parametrize('system,expected', [
    ('driver_version = 590.44.01\ncuda_driver_version = 13010', (590, '13010')),
    ('driver_version = 535.183.01\ncuda_driver_version = 12020', (535, '12020')),
    ('driver_version = bogus', (0, '0')),
    ('', (0, '0')),
])
def test_driver_versions_come_from_the_system_section(tmp_path: os.PathLike, system: str, expected: tuple[int, str]) -> None:
    path = os.path.join(tmp_path, 'x.ini')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(f'[system]\n{system}\n')
    assert mps_daemon.driver_versions(mps_daemon.read_config(path)) == expected


def test_the_r590_config_gives_sixty_clients_per_gpu() -> None:
    path = os.path.join(os.path.dirname(__file__), '..', 'nvml', 'configs', 'h200x1-r590.ini')
    assert [(g.name, g.max_clients) for g in mps_daemon.load_gpus(path)] == [('NVIDIA H200', 60)]
    assert mps_daemon.driver_versions(mps_daemon.read_config(path)) == (590, '13010')


# --------------------------------------------------------------------------
# MIG devices ([gpuN.migM] sections of the fake NVML's config)
# --------------------------------------------------------------------------

MIG_GPU = 'GPU-7e1a0000-4444-4000-8000-000000000004'
MIGS = ['MIG-7e1a0000-5555-4000-8000-00000000000a', 'MIG-7e1a0000-5555-4000-8000-00000000000b',
        'MIG-7e1a0000-5555-4000-8000-00000000000c']


def write_mig_ini(path: str, driver: str = '560.35.03') -> None:
    """GPUS plus an H100 in MIG mode split into 3g.40gb (GI 2), 2g.20gb (GI 3) and 1g.10gb (GI 9)."""
    write_ini(path, GPUS + [('NVIDIA H100 80GB HBM3', MIG_GPU, 81559, '9.0')], driver=driver)
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    head = f'uuid = {MIG_GPU}\nmemory_total_mib = 81559\ncompute_capability = 9.0\n'
    text = text.replace(head + 'mig_mode = disabled', head + 'mig_mode = enabled')
    for index, (profile, gi, mib) in enumerate([('3g.40gb', 2, 40192), ('2g.20gb', 3, 20096), ('1g.10gb', 9, 9984)]):
        text += (f'\n[gpu4.mig{index}]\nprofile = {profile}\nuuid = {MIGS[index]}\ngpu_instance_id = {gi}\n'
                 f'compute_instance_id = 0\nmemory_total_mib = {mib}\nmultiprocessor_count = 16\n')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(text)


@pytest.fixture(name='mig_gpus')
def fixture_mig_gpus(tmp_path: os.PathLike) -> Callable[[str], list[mps_daemon.Gpu]]:
    def load(driver: str = '560.35.03') -> list[mps_daemon.Gpu]:
        path = os.path.join(tmp_path, f'mig-{driver}.ini')
        write_mig_ini(path, driver)
        return mps_daemon.load_gpus(path)
    return load


@pytest.mark.parametrize('cvd,driver,expected', [
    (MIGS[1], '560.35.03', [MIGS[1]]),
    (f'MIG-{MIG_GPU}/3/0', '560.35.03', [MIGS[1]]),            # the legacy form names GPU, GI and CI
    (MIGS[1].upper(), '560.35.03', [MIGS[1]]),
    (f'{MIGS[0]},{MIGS[2]}', '560.35.03', [MIGS[0]]),         # before R570: one MIG device per process
    (f'{MIGS[0]},{MIGS[2]}', '570.86.15', [MIGS[0], MIGS[2]]),  # R570: one per GPU instance
    (f'{UUIDS[0]},{MIGS[2]}', '560.35.03', [MIGS[2]]),        # before R570: no whole GPU beside a MIG device
    (f'{UUIDS[0]},{MIGS[2]}', '570.86.15', [UUIDS[0], MIGS[2]]),
    (MIG_GPU, '560.35.03', []),                               # the GPU in MIG mode is not a device itself [U]
    ('4', '560.35.03', []),
    ('MIG-7e1a0000', '560.35.03', []),                        # no prefixes for MIG UUIDs
    (None, '560.35.03', [MIGS[0]]),
    (None, '570.86.15', UUIDS + MIGS),
])
def test_mig_devices_in_cuda_visible_devices_follow_the_mig_user_guide(
        cvd: str, driver: str, expected: list[str], mig_gpus: Callable[[str], list[mps_daemon.Gpu]]) -> None:
    assert [g.uuid for g in mps_daemon.visible_gpus(mig_gpus(driver), cvd)] == expected


def test_a_mig_device_has_its_own_memory_and_a_client_cap_scaled_by_its_slices(mig_gpus: Callable[[str], list[mps_daemon.Gpu]]) -> None:
    migs = mig_gpus('560.35.03')[4].mig_devices
    assert [(g.name, g.memory_total_mib, g.max_clients) for g in migs] == [
        ('NVIDIA H100 80GB HBM3 MIG 3g.40gb', 40192, 20), ('NVIDIA H100 80GB HBM3 MIG 2g.20gb', 20096, 13),
        ('NVIDIA H100 80GB HBM3 MIG 1g.10gb', 9984, 6)]
    assert [g.max_clients for g in mig_gpus('590.44.01')[4].mig_devices] == [25, 17, 8]


def test_a_daemon_on_a_mig_device_shows_it_as_device_0_and_caps_its_clients(host: SimHost) -> None:
    write_mig_ini(host.ini)
    host.start(env={'CUDA_VISIBLE_DEVICES': MIGS[2]})
    assert host.out(['sim_devices']).splitlines() == [f'0 {MIGS[2]} 9.0 6 NVIDIA H100 80GB HBM3 MIG 1g.10gb']
    clients = [host.client() for _attempt in range(6)]
    info = clients[0].info()
    assert [(d['ordinal'], d['uuid']) for d in info['devices']] == [(0, MIGS[2])]
    for client in clients[1:]:
        assert client.info()['ok'] is True
    rc, out, _err = host.client().rest()
    assert rc == 1 and '"CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"' in out

# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Static SM partitions (mps_partitions.py): absent before binary 13010 exactly as r580 recorded, inferred from 13010 on."""
from __future__ import annotations

import pytest

from conftest import SimHost, write_ini

H200 = [('NVIDIA H200', 'GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b', 143771, '9.0'),
        ('NVIDIA A10', 'GPU-0b1c2d3e-0000-1111-2222-333344445555', 22731, '8.6'),
        ('Tesla V100-SXM2-16GB', 'GPU-7e0f9a1b-0000-1111-2222-333344445555', 16160, '7.0')]
R590 = {'driver': '590.44.01', 'cuda': '13010'}


def r590(host: SimHost) -> SimHost:
    write_ini(host.ini, H200, **R590)
    return host


# ---------------------------------------------------------------- r580: none of it (gpu-evidence probe2.txt)

def test_r580_refuses_dash_s_as_recorded(host: SimHost) -> None:
    write_ini(host.ini, H200, driver='580.159.04', cuda='13000')
    proc = host.start('-d', '-S', check=False)
    assert proc.returncode == 0 and proc.stdout.startswith('Unrecognized option')
    assert 'sm_partition' not in proc.stdout and '--static-partitioning' not in proc.stdout
    proc = host.ui(['get_server_list'])
    assert proc.returncode == 1  # nothing was started
    host.start()
    assert host.out(['lspart']).strip() == 'Unknown command "lspart"'


def test_r580_help_lists_no_static_partitioning(host: SimHost) -> None:
    write_ini(host.ini, H200, driver='580.159.04', cuda='13000')
    proc = host.start('-h', check=False)
    assert proc.returncode == 0 and 'sm_partition' not in proc.stdout and '-S,' not in proc.stdout


# ---------------------------------------------------------------- 13010 and later (inferred)

def test_help_and_version_from_13010(host: SimHost) -> None:
    r590(host)
    helped = host.start('-h', check=False).stdout
    assert '-S,--static-partitioning' in helped and 'sm_partition add <device UUID> <number of chunks>' in helped
    assert 'lspart' in helped
    assert host.start('-v', check=False).stdout.strip().endswith('Binary version: 13010')


def test_add_lspart_client_and_rm(host: SimHost) -> None:
    r590(host)
    host.start('-d', '-S')
    assert host.state()['static_partitioning'] is True
    out = host.out(['sm_partition add GPU-a8aa752d 7']).strip()
    assert out.startswith('Partition GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b/') and out.endswith(' created')
    value = out.split()[1]
    lines = host.out(['lspart']).splitlines()
    # H200: 132 SMs, chunks of 8 (Hopper) -> 16 chunks; 7 used
    assert lines[2].split() == ['GPU-a8aa752d', '9', '7', '72', '56']
    assert lines[3].split() == ['GPU-a8aa752d', value.split('/', 1)[1], '7', '56', 'No']
    # a client without CUDA_MPS_SM_PARTITION cannot create its context
    info = host.client('--once', '--device', '0').info()
    assert info['ok'] is False and info['error'] == 'CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION'
    client = host.client('--device', '0', env={'CUDA_MPS_SM_PARTITION': value})
    got = client.info()
    assert got['ok'] is True and got['sm_partition'] == value and got['sms'] == 56
    assert host.out(['lspart']).splitlines()[3].split()[-1] == 'Yes'
    ident = value.split('/', 1)[1]
    busy = host.out([f'sm_partition rm GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b {ident}']).strip()
    assert busy == f'Partition {value} in use. Terminate all clients before removing.'
    client.stop()
    assert host.out([f'sm_partition rm GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b {ident}']) == ''
    assert len(host.out(['lspart']).splitlines()) == 2 + 3  # headers and one row per device


def test_add_beyond_the_free_chunks_fails_with_the_driver_error(host: SimHost) -> None:
    r590(host)
    host.start('-d', '-S')
    assert host.out(['sm_partition add GPU-0b1c2d3e 10']).strip().endswith('created')  # A10: 72 SMs, 18 chunks of 4
    assert host.out(['sm_partition add GPU-0b1c2d3e 9']).strip() == (
        'Failed to fulfill the requested SM partition of 9 chunks, error CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION')
    # Volta: static partitioning is Ampere and newer
    assert 'CUDA_ERROR_NOT_SUPPORTED' in host.out(['sm_partition add GPU-7e0f9a1b 1'])


def test_partitions_need_dash_s_and_die_with_the_daemon(host: SimHost) -> None:
    r590(host)
    host.start()
    assert 'not enabled' in host.out(['sm_partition add GPU-a8aa752d 1'])
    host.quit()
    host.start('-d', '-S')
    host.out(['sm_partition add GPU-a8aa752d 1'])
    host.quit()
    host.start('-d', '-S')
    assert [line for line in host.out(['lspart']).splitlines()[2:] if len(line.split()) == 5 and not line.split()[1].isdigit()] == []


@pytest.mark.parametrize('layout', ['docs', 'code'])
def test_lspart_layouts(host: SimHost, layout: str) -> None:
    r590(host)
    env = {'FAKE_MPS_LSPART': layout}
    host.start('-d', '-S', env=env)
    host.out(['sm_partition add GPU-a8aa752d 2'], env=env)
    rows = [line.split() for line in host.out(['lspart'], env=env).splitlines()[2:4]]
    if layout == 'docs':
        assert rows[0] == ['GPU-a8aa752d', '-', '14', '2', '112', '16', '-'] and rows[1][2:] == ['-', '2', '-', '16', '-']
    else:
        assert rows[0] == ['GPU-a8aa752d', '14', '2', '112', '16'] and rows[1][2:] == ['2', '16', 'No']

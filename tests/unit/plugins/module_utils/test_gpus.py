# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import DeviceSelectionError, InvalidParameterError, NvmlError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu, Nvml, mps_client_cap
from ansible_collections.gpufleet.mps.plugins.module_utils._selectors import resolve_devices


def test_inventory_reads_every_field_through_real_pynvml(gpu_host):
    gpu_host('h100x4.ini')
    with Nvml() as nvml:
        gpus = nvml.gpus()
        assert nvml.driver_version()
        assert nvml.cuda_driver_version().count('.') == 1
    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    first = gpus[0]
    assert first.name == 'NVIDIA H100 80GB HBM3'
    assert first.uuid.startswith('GPU-') and len(first.uuid) == 40
    assert first.memory_total_mib == 81559
    assert first.compute_capability == (9, 0)
    assert first.compute_mode == 'default'
    assert first.max_mps_clients == 48
    assert first.facts()['compute_capability'] == '9.0'


def test_mig_and_old_gpus_are_reported_as_they_are(gpu_host):
    gpu_host('mixed.ini')
    with Nvml() as nvml:
        t4, a100 = nvml.gpus()
    assert t4.mig_current is None and t4.facts()['mig_mode'] == 'unsupported'
    assert a100.mig_enabled and a100.facts()['mig_mode'] == {'current': 'enabled', 'pending': 'enabled'}
    assert t4.max_mps_clients == 48  # compute capability 7.5 is Volta or later


def test_an_r590_driver_allows_60_clients_read_through_real_pynvml(gpu_host):
    gpu_host('h200x1-r590.ini')
    with Nvml() as nvml:
        (h200,) = nvml.gpus()
    assert h200.driver_version == '590.44.01'
    assert h200.max_mps_clients == 60 and h200.facts()['max_mps_clients'] == 60


@pytest.mark.parametrize('cc, driver, cap', [((9, 0), '590.44.01', 60), ((9, 0), '600.1', 60), ((9, 0), '580.95.05', 48),
                                             ((7, 0), None, 48), ((7, 0), 'garbage', 48), ((6, 1), '590.44.01', 16)])
def test_the_client_cap_by_compute_capability_and_driver(cc, driver, cap):
    assert mps_client_cap(cc, driver) == cap


def test_pre_volta_gpus_allow_16_clients():
    gpu = Gpu(0, 'GPU-x', 'Tesla P100', 16280, (6, 0), 'default', None, None, True)
    assert gpu.max_mps_clients == 16


def test_compute_mode_set_in_one_session_is_seen_by_the_next(gpu_host):
    gpu_host('h100x4.ini')
    with Nvml() as nvml:
        nvml.set_compute_mode(nvml.gpus()[2], 'exclusive_process')
    with Nvml() as nvml:
        assert [gpu.compute_mode for gpu in nvml.gpus()] == ['default', 'default', 'exclusive_process', 'default']


def test_setting_compute_mode_on_a_mig_gpu_names_the_gpu(gpu_host):
    gpu_host('mixed.ini')
    # refused before NVML is asked (NVML would answer Not Supported)
    with Nvml() as nvml, pytest.raises(NvmlError, match=r'GPU 1 \(GPU-.*\): compute modes do not apply to a GPU in MIG mode'):
        nvml.set_compute_mode(nvml.gpus()[1], 'exclusive_process')


def test_no_driver_loaded_is_a_clear_error(gpu_host, monkeypatch):
    monkeypatch.setenv('FAKE_NVML_CONFIG', '/nonexistent.ini')
    with pytest.raises(NvmlError, match='driver is not loaded'):
        with Nvml():
            pass


def test_missing_nvidia_ml_py_names_the_package():
    with pytest.raises(NvmlError, match='nvidia-ml-py'):
        with _NoLib():
            pass


class _NoLib(Nvml):
    def __init__(self):
        super().__init__()
        self._lib = None


def test_nvml_mps_device_enumeration_is_removed_before_init(gpu_host, monkeypatch):
    gpu_host('h100x4.ini')
    monkeypatch.setenv('NVML_MPS_DEVICE_ENUMERATION', '1')
    with Nvml() as nvml:
        assert nvml.enumeration_var_was_set
        assert 'NVML_MPS_DEVICE_ENUMERATION' not in os.environ
        assert nvml.gpus()[0].compute_mode == 'default'


@pytest.fixture
def four():
    uuids = ['GPU-0aac1e75-0000', 'GPU-a55c2176-0000', 'GPU-cd508de7-0000', 'GPU-cd509999-0000']
    return [Gpu(i, u, 'H100', 81559, (9, 0), 'default', False, False, True) for i, u in enumerate(uuids)]


def test_all_selects_every_gpu_in_index_order(four):
    assert resolve_devices('all', four) == four


def test_indices_uuids_and_unique_prefixes_resolve_in_the_given_order(four):
    chosen = resolve_devices([3, 'GPU-a55c2176-0000', 'gpu-0AAC'.replace('gpu', 'GPU')], four)
    assert [gpu.index for gpu in chosen] == [3, 1, 0]
    assert [gpu.index for gpu in resolve_devices(['2'], four)] == [2]


@pytest.mark.parametrize('selectors, message', [
    ([7], 'no GPU with index 7'),
    ([0, 'GPU-0aac'], 'listed more than once'),
    (['GPU-cd50'], 'ambiguous'),
    (['GPU-ffff'], 'no GPU has a UUID starting with'),
    (['MIG-1234'], 'MIG device'),
])
def test_bad_selections_are_refused(four, selectors, message):
    with pytest.raises(DeviceSelectionError, match=message):
        resolve_devices(selectors, four)


# '\u00b2' is a digit to str.isdigit() and no index to int(): refused, never a ValueError
@pytest.mark.parametrize('selectors', [[], 'some', ['x y'], [True], [''], ['\u00b2']])
def test_malformed_selectors_name_the_parameter(four, selectors):
    with pytest.raises(InvalidParameterError) as excinfo:
        resolve_devices(selectors, four)
    assert excinfo.value.param == 'devices'


def test_a_host_without_gpus_is_an_error(four):
    with pytest.raises(DeviceSelectionError, match='no GPUs'):
        resolve_devices('all', [])

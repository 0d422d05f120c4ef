# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_smi.py's ``--query-gpu ... --format=csv[,noheader][,nounits]``: the header line of plain csv (as the real
r580 nvidia-smi printed it), noheader, nounits, the options in any order, and any other format refused."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent
SCRIPT = FAKES / 'nvidia_smi.py'
CONFIGS = FAKES / 'nvml' / 'configs'
LIBDIR = Path(os.environ.get('GPUFLEET_SIMHOST', '')) / 'lib'

# What the real nvidia-smi printed on the H200 of gpu-evidence 2026-12-04 (log.txt, lines 5-6) for
# --query-gpu=index,name,uuid,compute_mode,mig.mode.current,persistence_mode,driver_version,memory.total --format=csv
RECORDED = ['index, name, uuid, compute_mode, mig.mode.current, persistence_mode, driver_version, memory.total [MiB]',
            '0, NVIDIA H200, GPU-4108be35-6284-c748-5c4f-6c08a451383a, Default, Disabled, Enabled, 580.159.04, 143771 MiB']
SIMULATED = ['index', 'name', 'uuid', 'compute_mode', 'memory.total']  # the recorded fields the stand-in answers


@pytest.fixture
def smi(tmp_path):
    """Runs nvidia_smi.py over the fake NVML with a copy of a GPU set of nvml/configs (h100x4 unless named)."""
    if not (LIBDIR / 'libnvidia-ml.so.1').exists():
        pytest.skip('needs the simulated host of make simhost (GPUFLEET_SIMHOST)')
    pytest.importorskip('pynvml', reason='needs nvidia-ml-py (the repository venv)')

    def run(*args: str, config: str = 'h100x4.ini') -> subprocess.CompletedProcess:
        ini = tmp_path / 'nvml.ini'
        if not ini.exists():
            shutil.copy(CONFIGS / config, ini)
        env = {k: v for k, v in os.environ.items() if not k.startswith(('FAKE_', 'CUDA_'))}
        env.update(FAKE_NVML_CONFIG=str(ini), LD_LIBRARY_PATH=str(LIBDIR))
        return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
    return run


def lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_csv_prints_the_header_the_real_nvidia_smi_printed(smi):
    recorded = [dict(zip(RECORDED[0].split(', '), line.split(', '))) for line in RECORDED]  # header -> its own name
    header, row = ([cells[name] for name in recorded[0] if name.split(' [')[0] in SIMULATED] for cells in recorded)
    printed = lines(smi('--query-gpu=' + ','.join(SIMULATED), '--format=csv', config='h200x1.ini'))
    got = [line.split(', ') for line in printed]
    assert got[0] == header == ['index', 'name', 'uuid', 'compute_mode', 'memory.total [MiB]']
    assert len(got) == 2 and got[1][2].startswith('GPU-')
    assert got[1][:2] + got[1][3:] == row[:2] + row[3:] == ['0', 'NVIDIA H200', 'Default', '143771 MiB']  # UUIDs differ


def test_csv_prints_the_header_then_a_row_per_gpu(smi):
    # the command guide_troubleshooting.rst shows; modes set as the systemd unit sets them
    assert smi('-i', '1', '-c', 'EXCLUSIVE_PROCESS').returncode == 0
    assert smi('-i', '2', '-c', 'PROHIBITED').returncode == 0
    assert lines(smi('--query-gpu=index,compute_mode', '--format=csv')) == [
        'index, compute_mode', '0, Default', '1, Exclusive_Process', '2, Prohibited', '3, Default']


def test_csv_noheader_prints_the_rows_alone(smi):
    assert lines(smi('--query-gpu=index,compute_mode,memory.total', '--format=csv,noheader')) == [
        '%d, Default, 81559 MiB' % index for index in range(4)]


def test_the_header_comes_once_for_the_gpus_selected(smi):
    assert lines(smi('-i', '1,3', '--query-gpu=memory.total,index', '--format=csv')) == [
        'memory.total [MiB], index', '81559 MiB, 1', '81559 MiB, 3']


@pytest.mark.parametrize('fmt, header', [
    ('csv,nounits', True), ('nounits,csv', True), ('csv,noheader,nounits', False), ('csv,nounits,noheader', False)])
def test_nounits_drops_the_values_units_and_keeps_the_headers(smi, fmt, header):
    expected = ['index, memory.total [MiB]'] if header else []
    assert lines(smi('-i', '0', '--query-gpu=index,memory.total', '--format=' + fmt)) == expected + ['0, 81559']


@pytest.mark.parametrize('fmt', [None, 'tsv', 'csv,json', 'csv,noheader,noheader', 'noheader', ''])
def test_another_format_is_refused_naming_what_is_simulated(smi, fmt):
    proc = smi('--query-gpu=index,compute_mode', *([] if fmt is None else ['--format=' + fmt]))
    assert proc.returncode == 2
    assert proc.stdout == ('Only --format=csv, csv,noheader, csv,nounits and csv,noheader,nounits '
                           '(options in any order) are simulated\n')

# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/gpu/compare_mps.py without a GPU: it skips, and its comparison works (simulator vs simulator)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess

from conftest import CLIENT, PYTHON, REPO, SIM, SimHost, write_ini
import compare_mps
import transcript

COMPARE = os.path.join(REPO, 'tests', 'gpu', 'compare_mps.py')
RUN_SH = os.path.join(REPO, 'tests', 'gpu', 'run.sh')
RECORD = os.path.join(REPO, 'tests', 'gpu', 'record.py')


def test_without_the_real_binary_it_skips_with_exit_0() -> None:
    env = dict(os.environ, PATH='/usr/bin:/bin')
    proc = subprocess.run([PYTHON, COMPARE], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert proc.stdout.startswith('SKIP: no real nvidia-cuda-mps-control')


def test_the_simulator_wrapper_on_path_is_not_taken_for_the_real_binary(host: SimHost) -> None:
    bindir = os.path.join(host.base, 'bin')
    os.mkdir(bindir)
    wrapper = os.path.join(bindir, 'nvidia-cuda-mps-control')
    with open(wrapper, 'w', encoding='utf-8') as handle:
        handle.write(f'#!/bin/sh\nexec {PYTHON} {SIM} "$@"\n')
    os.chmod(wrapper, 0o755)
    proc = subprocess.run(['bash', RUN_SH], env=dict(os.environ, PATH=f'{bindir}:/usr/bin:/bin', PYTHON=PYTHON),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert proc.stdout.startswith('SKIP:') and 'non-ELF' in proc.stdout and wrapper in proc.stdout


def test_is_elf() -> None:
    assert compare_mps.is_elf(PYTHON) or compare_mps.is_elf(os.path.realpath(PYTHON))
    assert not compare_mps.is_elf(SIM)


def test_two_simulator_runs_compare_equal(host: SimHost) -> None:
    write_ini(host.ini)
    env = {'CUDA_VISIBLE_DEVICES': 'GPU-9f00', 'FAKE_NVML_CONFIG': host.ini}
    first = compare_mps.run_side(os.path.join(host.base, 'a'), [PYTHON, SIM], [PYTHON, CLIENT], env)
    second = compare_mps.run_side(os.path.join(host.base, 'b'), [PYTHON, SIM], [PYTHON, CLIENT], env)
    report, differing, hard = compare_mps.compare(first, second)
    assert (differing, hard) == (0, 0), '\n'.join(report)


def test_a_pid_equal_to_a_uuid_digit_group_is_not_replaced_inside_the_uuid(tmp_path: object) -> None:
    # CI once drew server pid 4000 on one side only: the ps DEVICE column's "-4000" became "-<SERVER4>" there
    env = {'CUDA_MPS_PIPE_DIRECTORY': os.path.join(str(tmp_path), 'pipe'), 'CUDA_MPS_LOG_DIRECTORY': os.path.join(str(tmp_path), 'log'),
           'CUDA_VISIBLE_DEVICES': 'GPU-9f00'}
    runner = transcript.Runner([PYTHON, SIM], [PYTHON, CLIENT], env)
    runner.token('SERVER', 4000)
    runner.token('CLIENT', 2222)
    row = '4000\n2222      1         4000      GPU-9f00aa01-2222-4000  4026531836     python3\n[x Server 4000] up'
    assert runner.normalise(row) == ('<SERVER1>\n<CLIENT1>      1         <SERVER1>      <GPU0>aa01-2222-4000  4026531836     python3\n'
                                     '[x Server <SERVER1>] up')
    # nor a CUDA error code, which a low pid on a fresh machine may equal; a client list entry <pid>.<id> is a pid
    runner.token('CLIENT', 805)
    text = 'failed: {"code": 805, "detail": "x"} CUDA error 805\nclient 805 left\n805.1\n'
    assert runner.normalise(text) == 'failed: {"code": 805, "detail": "x"} CUDA error 805\nclient <CLIENT2> left\n<CLIENT2>.1\n'


def test_a_difference_is_reported_with_a_diff() -> None:
    real = [{'id': 'x', 'op': 'ui', 'tag': 'U', 'rc': 0, 'stdout': 'NORMAL\n', 'commands': ['get_default_client_priority']},
            {'id': 'y', 'op': 'ui', 'tag': 'C', 'rc': 0, 'stdout': '25.0\n'}]
    sim = [dict(real[0], stdout='0\n'), dict(real[1])]
    report, differing, hard = compare_mps.compare(real, sim)
    assert (differing, hard) == (1, 0)
    assert 'DIFFERS [U] x: stdout' in report[0]
    assert '    -NORMAL' in report and '    +0' in report
    assert report[-1] == 'same    [C] y'


def test_a_side_past_its_deadline_stops_and_leaves_no_process(host: SimHost) -> None:
    write_ini(host.ini)
    base = os.path.join(host.base, 'd')
    results = compare_mps.run_side(base, [PYTHON, SIM], [PYTHON, CLIENT], {'FAKE_NVML_CONFIG': host.ini}, deadline=1)
    assert results[-1]['id'] == 'deadline' and 'last step done' in results[-1]['data']
    assert len(results) < len(transcript.STEPS)
    assert not transcript.processes_with(base + os.sep)


def test_cuda_version_comes_from_the_nvidia_smi_banner(host: SimHost) -> None:
    smi = os.path.join(host.base, 'nvidia-smi')
    with open(smi, 'w', encoding='utf-8') as handle:
        handle.write('#!/bin/sh\necho "| NVIDIA-SMI 580.105.08   Driver Version: 580.105.08   CUDA Version: 13.0     |"\n')
    os.chmod(smi, 0o755)
    assert compare_mps.cuda_version(smi) == '13000'
    assert compare_mps.cuda_version('/bin/true') == '0'


def test_record_writes_a_recording_of_every_step_from_a_run(host: SimHost, tmp_path: object) -> None:
    write_ini(host.ini)
    env = {'CUDA_VISIBLE_DEVICES': 'GPU-9f00', 'FAKE_NVML_CONFIG': host.ini}
    base = os.path.join(host.base, 'r')
    results = compare_mps.run_side(base, [PYTHON, SIM], [PYTHON, CLIENT], env, until='start')
    run = os.path.join(str(tmp_path), 'run.json')
    with open(run, 'w', encoding='utf-8') as handle:
        json.dump({'host': {'driver': '560.35.03'}, 'real': results[:5], 'simulator': results[:5]}, handle)
    proc = subprocess.run([PYTHON, RECORD, run], capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(proc.stdout)
    assert list(out['steps']) == [s['id'] for s in transcript.STEPS]
    assert out['steps']['no-daemon'] == {'evidence': 'run.json: step no-daemon',
                                         'answer': {k: results[0][k] for k in ('rc', 'stdout', 'stderr')}}
    assert out['steps']['mkdirs'] == {'evidence': 'run.json: step mkdirs', 'answer': {}}
    assert out['steps']['files-running'] == {'unrecorded': 'run.json: the run stopped before this step'}
    assert out['recording']['driver'] == '560.35.03'


def test_record_refuses_a_file_that_is_not_a_run(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), 'x.json')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write('[]')
    proc = subprocess.run([PYTHON, RECORD, path], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and 'not a compare_mps.py --json file' in proc.stderr


def test_effects_without_a_gpu_report_the_failure_and_leave_nothing_running(host: SimHost) -> None:
    write_ini(host.ini)
    wrapper = os.path.join(host.base, 'nvidia-cuda-mps-control')
    with open(wrapper, 'w', encoding='utf-8') as handle:
        handle.write(f'#!/bin/sh\nexec {PYTHON} {SIM} "$@"\n')
    os.chmod(wrapper, 0o755)
    base = os.path.join(host.base, 'e')
    seen = compare_mps.effects(wrapper, [PYTHON, CLIENT], base, {'FAKE_NVML_CONFIG': host.ini})
    # the simulator's client has no memory to allocate (no --alloc); without PyTorch there is no throughput part
    assert 'bf16 8192x8192 matmul TFLOP/s' not in seen or importlib.util.find_spec('torch') is not None
    assert str(seen['pinned 3G, allocations of 2048, 3000 and 4096 MiB']).startswith('failed: ')
    assert not transcript.processes_with(base + os.sep)


def test_effects_are_held_to_the_recording() -> None:
    recorded = {'pinned 3G, allocations of 2048, 3000 and 4096 MiB': {'alloc_rc_by_mib': {'2048': 0, '3000': 2, '4096': 2}}}
    same = {'pinned 3G, allocations of 2048, 3000 and 4096 MiB': {'alloc_rc_by_mib': {'2048': 0, '3000': 2, '4096': 2}, 'free_mib': 2900},
            'bf16 8192x8192 matmul TFLOP/s': {'no MPS': 800, '25% active threads': 230}}
    assert not compare_mps.effects_differences(recorded, same)
    unlimited = dict(same, **{'pinned 3G, allocations of 2048, 3000 and 4096 MiB': {'alloc_rc_by_mib': {'2048': 0, '3000': 0, '4096': 0}}})
    assert 'pinned 3G' in compare_mps.effects_differences(recorded, unlimited)[0]
    uncapped = dict(same, **{'bf16 8192x8192 matmul TFLOP/s': {'no MPS': 800, '25% active threads': 790}})
    assert '790 vs 800' in compare_mps.effects_differences(recorded, uncapped)[0]

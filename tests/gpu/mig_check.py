# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG on a real GPU host: what NVML, nvidia-smi and an MPS daemon on a MIG device answer.

Checks the MIG facts the collection and its simulator rely on (tagged as in
``tests/fakes/nvml/README.md`` and ``shared/mps-reference.md``):

- [C] nvml.h: a MIG handle's ``nvmlDeviceGetIndex`` is its MIG index; ``GetAttributes`` answers
  for MIG handles; ``GetMaxMigDeviceCount`` is 0 when MIG is disabled; empty slots are NOT_FOUND.
- [I] a MIG handle's name is ``<GPU name> MIG <profile>`` (the collection falls back to the
  attributes otherwise); ``nvidia-smi -L``'s ``Device N`` is NVML's MIG index (the ``gpu:mig``
  address relies on it); compute mode and persistence calls on a MIG handle answer NOT_SUPPORTED;
  the max MIG device count is the GPU's compute slices (7).
- [C] MPS on a MIG device: a daemon with ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``; its client sees one
  device with the instance's memory. [I] the client cap: ``48 (60 from r590) x CI slices / max``,
  rounded down - the client after it must fail with CUDA_ERROR_MPS_MAX_CLIENTS_REACHED.

Changes nothing on the GPU: MIG mode and instances are an administrator's (nvidia-mig-parted);
without a GPU in MIG mode with a MIG device it prints ``SKIP: ...`` and exits 0. The MPS part
runs a daemon in a private pipe directory and quits it (and every client) at the end; it is
skipped without libcuda.so.1 or nvidia-cuda-mps-control. Standard library only.

Usage: mig_check.py [--json FILE] [--no-mps] [--no-cap]
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
NOT_FOUND, NOT_SUPPORTED = 6, 3


class Attributes(ctypes.Structure):  # nvmlDeviceAttributes_t
    _fields_ = [('multiprocessorCount', ctypes.c_uint), ('sharedCopyEngineCount', ctypes.c_uint),
                ('sharedDecoderCount', ctypes.c_uint), ('sharedEncoderCount', ctypes.c_uint),
                ('sharedJpegCount', ctypes.c_uint), ('sharedOfaCount', ctypes.c_uint),
                ('gpuInstanceSliceCount', ctypes.c_uint), ('computeInstanceSliceCount', ctypes.c_uint),
                ('memorySizeMB', ctypes.c_ulonglong)]


class Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [('total', ctypes.c_ulonglong), ('free', ctypes.c_ulonglong), ('used', ctypes.c_ulonglong)]


class Nvml:
    """The few NVML calls this check needs, through ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL('libnvidia-ml.so.1')
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise OSError('nvmlInit_v2 returned %d' % rc)

    def call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def text(self, name: str, handle: ctypes.c_void_p) -> Optional[str]:
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if self.call(name, handle, buf, ctypes.c_uint(96)) == 0 else None

    def uint(self, name: str, handle: ctypes.c_void_p) -> Any:
        value = ctypes.c_uint()
        rc = self.call(name, handle, ctypes.byref(value))
        return value.value if rc == 0 else {'rc': rc}


def nvml_facts(nvml: Nvml) -> List[Dict[str, Any]]:
    """Every GPU in MIG mode with what NVML says of each MIG slot."""
    count = ctypes.c_uint()
    nvml.call('nvmlDeviceGetCount_v2', ctypes.byref(count))
    gpus = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        nvml.call('nvmlDeviceGetHandleByIndex_v2', ctypes.c_uint(index), ctypes.byref(handle))
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        mig_rc = nvml.call('nvmlDeviceGetMigMode', handle, ctypes.byref(current), ctypes.byref(pending))
        gpu: Dict[str, Any] = {'index': index, 'name': nvml.text('nvmlDeviceGetName', handle),
                               'uuid': nvml.text('nvmlDeviceGetUUID', handle), 'mig_mode_rc': mig_rc,
                               'mig_current': current.value if mig_rc == 0 else None,
                               'max_mig_devices': nvml.uint('nvmlDeviceGetMaxMigDeviceCount', handle), 'migs': []}
        if gpu['mig_current'] == 1 and isinstance(gpu['max_mig_devices'], int):
            for slot in range(gpu['max_mig_devices']):
                mig = ctypes.c_void_p()
                rc = nvml.call('nvmlDeviceGetMigDeviceHandleByIndex', handle, ctypes.c_uint(slot), ctypes.byref(mig))
                if rc != 0:
                    gpu['migs'].append({'slot': slot, 'rc': rc})
                    continue
                attributes, memory, parent = Attributes(), Memory(), ctypes.c_void_p()
                mode = ctypes.c_uint()
                facts = {
                    'slot': slot, 'rc': 0, 'uuid': nvml.text('nvmlDeviceGetUUID', mig), 'name': nvml.text('nvmlDeviceGetName', mig),
                    'index': nvml.uint('nvmlDeviceGetIndex', mig), 'is_mig': nvml.uint('nvmlDeviceIsMigDeviceHandle', mig),
                    'gpu_instance_id': nvml.uint('nvmlDeviceGetGpuInstanceId', mig),
                    'compute_instance_id': nvml.uint('nvmlDeviceGetComputeInstanceId', mig),
                    'attributes_rc': nvml.call('nvmlDeviceGetAttributes_v2', mig, ctypes.byref(attributes)),
                    'memory_rc': nvml.call('nvmlDeviceGetMemoryInfo', mig, ctypes.byref(memory)),
                    'compute_mode_rc': nvml.call('nvmlDeviceGetComputeMode', mig, ctypes.byref(mode)),
                    'persistence_rc': nvml.call('nvmlDeviceGetPersistenceMode', mig, ctypes.byref(mode)),
                    'parent_rc': nvml.call('nvmlDeviceGetDeviceHandleFromMigDeviceHandle', mig, ctypes.byref(parent)),
                }
                facts['memory_total_mib'] = memory.total // 1048576 if facts['memory_rc'] == 0 else None
                if facts['attributes_rc'] == 0:
                    facts.update(multiprocessor_count=attributes.multiprocessorCount, gi_slices=attributes.gpuInstanceSliceCount,
                                 ci_slices=attributes.computeInstanceSliceCount, memory_size_mb=attributes.memorySizeMB)
                if facts['parent_rc'] == 0:
                    facts['parent_index'] = nvml.uint('nvmlDeviceGetIndex', parent)
                gpu['migs'].append(facts)
        gpus.append(gpu)
    return gpus


def smi_migs() -> Dict[str, Dict[str, Any]]:
    """MIG UUID -> (GPU index, Device N, profile) from ``nvidia-smi -L``; empty without nvidia-smi."""
    smi = shutil.which('nvidia-smi')
    if smi is None:
        return {}
    out = subprocess.run([smi, '-L'], capture_output=True, text=True, timeout=60, check=False).stdout
    found, gpu = {}, None
    for line in out.splitlines():
        head = re.match(r'GPU (\d+):', line)
        if head:
            gpu = int(head.group(1))
        mig = re.match(r'\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)', line)
        if mig and gpu is not None:
            found[mig.group(3)] = {'gpu': gpu, 'device': int(mig.group(2)), 'profile': mig.group(1)}
    return found


def check(gpus: List[Dict[str, Any]], smi: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each expectation with the tag it carries in the simulator, and whether this host meets it."""
    results = []

    def expect(what: str, tag: str, ok: bool, seen: Any) -> None:
        results.append({'check': what, 'tag': tag, 'ok': bool(ok), 'seen': seen})

    for gpu in gpus:
        if gpu['mig_current'] != 1:
            expect('GPU %d: GetMaxMigDeviceCount is 0 without MIG' % gpu['index'], 'C', gpu['max_mig_devices'] == 0, gpu['max_mig_devices'])
            continue
        expect('GPU %d: GetMaxMigDeviceCount is 7' % gpu['index'], 'I', gpu['max_mig_devices'] == 7, gpu['max_mig_devices'])
        for mig in gpu['migs']:
            where = 'GPU %d MIG slot %d' % (gpu['index'], mig['slot'])
            if mig['rc'] != 0:
                expect(where + ': an empty slot is NOT_FOUND', 'C', mig['rc'] == NOT_FOUND, mig['rc'])
                continue
            profile = (mig['name'] or '').split(' MIG ', 1)[-1]
            expect(where + ': GetIndex is the MIG index', 'C', mig['index'] == mig['slot'], mig['index'])
            expect(where + ': the name is "<GPU name> MIG <profile>"', 'I', mig['name'] == '%s MIG %s' % (gpu['name'], profile), mig['name'])
            expect(where + ': IsMigDeviceHandle', 'C', mig['is_mig'] == 1, mig['is_mig'])
            expect(where + ': the parent handle is the GPU', 'C', mig.get('parent_index') == gpu['index'], mig.get('parent_index'))
            expect(where + ': GetAttributes answers', 'C', mig['attributes_rc'] == 0, mig['attributes_rc'])
            expect(where + ': memory is the instance\'s', 'I', mig['memory_total_mib'] is not None and
                   abs(mig['memory_total_mib'] - mig.get('memory_size_mb', -10 ** 9)) <= 1024, [mig['memory_total_mib'], mig.get('memory_size_mb')])
            expect(where + ': compute mode on a MIG handle is NOT_SUPPORTED', 'I', mig['compute_mode_rc'] == NOT_SUPPORTED, mig['compute_mode_rc'])
            expect(where + ': persistence on a MIG handle is NOT_SUPPORTED', 'I', mig['persistence_rc'] == NOT_SUPPORTED, mig['persistence_rc'])
            gi, ci = mig.get('gi_slices'), mig.get('ci_slices')
            pattern = r'(?:%sc\.)?%sg\.\d+gb' % (ci if ci != gi else '\\d+', gi)
            expect(where + ': the profile\'s slices are the attributes\'', 'I', bool(gi) and re.fullmatch(pattern, profile) is not None,
                   [profile, gi, ci])
            listed = smi.get(mig['uuid'] or '')
            if smi:
                expect(where + ': nvidia-smi -L lists it as Device <MIG index> under its GPU', 'I',
                       listed == {'gpu': gpu['index'], 'device': mig['slot'], 'profile': profile}, listed)
    return results


def driver_major(nvml: Nvml) -> int:
    buf = ctypes.create_string_buffer(96)
    nvml.call('nvmlSystemGetDriverVersion', buf, ctypes.c_uint(96))
    head = buf.value.decode().split('.', 1)[0]
    return int(head) if head.isdigit() else 0


def mps_on_mig(mig: Dict[str, Any], cap: Optional[int], base: str) -> Dict[str, Any]:
    """A daemon on one MIG device: its client's view, and with ``cap`` the client after the cap."""
    control = shutil.which('nvidia-cuda-mps-control')
    if control is None:
        return {'skipped': 'no nvidia-cuda-mps-control'}
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=mig['uuid'], CUDA_MPS_PIPE_DIRECTORY=os.path.join(base, 'pipe'),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(base, 'log'))
    os.makedirs(env['CUDA_MPS_PIPE_DIRECTORY'])
    os.makedirs(env['CUDA_MPS_LOG_DIRECTORY'])
    result: Dict[str, Any] = {'uuid': mig['uuid'], 'name': mig['name']}
    started = subprocess.run([control, '-d'], env=env, capture_output=True, text=True, timeout=60, check=False)
    result['start'] = {'rc': started.returncode, 'out': started.stdout + started.stderr}
    clients: List[subprocess.Popen] = []
    try:
        for number in range((cap or 0) + 1 if cap else 1):
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, os.path.join(HERE, 'cuda_client.py')], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            clients.append(proc)
            line = proc.stdout.readline() if proc.stdout else ''
            reply = json.loads(line) if line.strip().startswith('{') else {'ok': False, 'raw': line}
            result.setdefault('clients', []).append(reply)
            if not reply.get('ok'):
                break
            if number == 0:
                result['first_client_mem_total_mib'] = reply.get('mem_total_mib')
        ok = [reply.get('ok') for reply in result.get('clients', [])]
        result['clients_accepted'] = ok.count(True)
        result['refused_with'] = next((reply.get('error') for reply in result.get('clients', []) if not reply.get('ok')), None)
    finally:
        for proc in clients:
            if proc.stdin:
                proc.stdin.close()
        for proc in clients:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run([control], input='quit\n', env=env, capture_output=True, text=True, timeout=60, check=False)
    return result


def main(argv: List[str]) -> int:
    out = argv[argv.index('--json') + 1] if '--json' in argv else None
    try:
        nvml = Nvml()
    except OSError as exc:
        print('SKIP: no working NVML (%s)' % exc)
        return 0
    gpus = nvml_facts(nvml)
    migs = [(gpu, mig) for gpu in gpus for mig in gpu['migs'] if mig['rc'] == 0]
    report: Dict[str, Any] = {'gpus': gpus, 'checks': check(gpus, smi_migs())}
    if not migs:
        print('SKIP: no GPU in MIG mode with a MIG device here (MIG mode and instances are an administrator\'s, e.g. '
              'nvidia-mig-parted; this check never changes them)')
        status = 0
    else:
        status = 0
        for item in report['checks']:
            print('%-4s %s %s%s' % ('ok' if item['ok'] else 'DIFF', item['tag'], item['check'], '' if item['ok'] else ' - seen %r' % (item['seen'],)))
            if not item['ok'] and item['tag'] == 'C':
                status = 1
        if '--no-mps' not in argv:
            try:
                ctypes.CDLL('libcuda.so.1')
            except OSError:
                report['mps'] = {'skipped': 'no libcuda.so.1'}
            else:
                gpu, smallest = min(migs, key=lambda pair: pair[1].get('ci_slices') or 99)
                cap = None
                if '--no-cap' not in argv and smallest.get('ci_slices'):
                    base_cap = 60 if driver_major(nvml) >= 590 else 48
                    cap = max(1, base_cap * smallest['ci_slices'] // (gpu['max_mig_devices'] or 7))
                base = tempfile.mkdtemp(prefix='migchk.', dir='/tmp')
                try:
                    report['mps'] = mps = mps_on_mig(smallest, cap, base)
                finally:
                    shutil.rmtree(base, ignore_errors=True)
                report['mps']['expected_cap'] = cap
                print('MPS on %s: start rc %s, %s client(s) accepted (expected cap %s), then %s; first client sees %s MiB (instance %s MiB)' % (
                    smallest['uuid'], mps.get('start', {}).get('rc'), mps.get('clients_accepted'), cap, mps.get('refused_with'),
                    mps.get('first_client_mem_total_mib'), smallest['memory_total_mib']))
    nvml.call('nvmlShutdown')
    if out:
        with open(out, 'w', encoding='utf-8') as handle:
            json.dump(report, handle, indent=1, sort_keys=True)
    return status


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

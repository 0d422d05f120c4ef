# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Play tests/gpu/transcript.py against the REAL nvidia-cuda-mps-control and the simulator; diff them.

Needs a GPU host: the real binary (an ELF file, not the simulator's wrapper) and a
working driver (nvidia-smi answers).  Without them it prints why and exits 0 (skip).

Both runs use private pipe/log directories and CUDA_VISIBLE_DEVICES set to one GPU
(by UUID); the simulator gets a FAKE_NVML_CONFIG written from nvidia-smi, so both see
the same device.  Pids and timestamps are normalised, then every step's exit code,
stdout, stderr, file modes and log lines are compared.

Exit status: 0 when every step tagged C (answered by a real run: its answer is recorded
in tests/fakes/mps/recorded/) matches the simulator, 1 when one differs (differences in
I / U steps are printed, not failed) or a side ran out of time, 2 on a usage error.
It also prints where this run differs from the recording and how many steps it answered
that the recording marks unrecorded; ``--json FILE`` writes both runs' results and the
host, from which ``tests/gpu/record.py FILE`` writes a new recording.
Each side has ``--deadline`` seconds; whatever a side started is killed when it ends.
"""
from __future__ import annotations

import argparse
import importlib.util
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
SIM_DIR = os.path.join(REPO, 'tests', 'fakes', 'mps')
sys.path.insert(0, HERE)

import transcript  # noqa: E402  pylint: disable=wrong-import-position

NAME = 'nvidia-cuda-mps-control'
EXTRA_DIRS = ['/usr/bin', '/usr/local/bin', '/usr/local/nvidia/bin', '/usr/local/cuda/bin']


def is_elf(path: str) -> bool:
    """The real tools are ELF binaries; the simulator's wrapper is a script."""
    try:
        with open(path, 'rb') as handle:
            return handle.read(4) == b'\x7fELF'
    except OSError:
        return False


def find_real(name: str) -> Tuple[Optional[str], List[str]]:
    """(first ELF called name on PATH or in the usual places, non-ELF candidates seen)."""
    seen: List[str] = []
    for directory in os.environ.get('PATH', '').split(os.pathsep) + EXTRA_DIRS:
        path = os.path.join(directory or '.', name)
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        real = os.path.realpath(path)
        if is_elf(real):
            return real, seen
        if real not in seen:
            seen.append(real)
    return None, seen


def query_gpus(smi: str) -> List[Dict[str, str]]:
    """GPUs as nvidia-smi reports them (index, uuid, name, memory, compute capability)."""
    fields = ['index', 'uuid', 'name', 'memory.total']
    proc = subprocess.run([smi, f'--query-gpu={",".join(fields + ["compute_cap"])}', '--format=csv,noheader,nounits'],
                          capture_output=True, text=True, timeout=60, check=False)
    with_cc = proc.returncode == 0
    if not with_cc:  # older drivers lack compute_cap
        proc = subprocess.run([smi, f'--query-gpu={",".join(fields)}', '--format=csv,noheader,nounits'],
                              capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout.strip() or proc.stderr.strip() or f'nvidia-smi exited {proc.returncode}')
    gpus = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(',')]
        if len(parts) >= 4:
            gpus.append({'index': parts[0], 'uuid': parts[1], 'name': parts[2], 'memory': parts[3],
                         'cc': parts[4] if with_cc and len(parts) > 4 else '7.0'})
    return gpus


def driver_version(smi: str) -> str:
    """Driver version for the simulator's INI."""
    proc = subprocess.run([smi, '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True, text=True, timeout=60, check=False)
    return proc.stdout.splitlines()[0].strip() if proc.returncode == 0 and proc.stdout.strip() else '0'


def cuda_version(smi: str) -> str:
    """The driver's CUDA version as NVML reports it (``CUDA Version: 13.0`` in nvidia-smi's banner -> 13000); '0' unknown."""
    proc = subprocess.run([smi], capture_output=True, text=True, timeout=60, check=False)
    match = re.search(r'CUDA Version:\s*(\d+)\.(\d+)', proc.stdout)
    return str(int(match.group(1)) * 1000 + int(match.group(2)) * 10) if match else '0'


def write_ini(path: str, gpus: List[Dict[str, str]], driver: str, cuda: str = '0') -> None:
    """A FAKE_NVML_CONFIG describing this host's GPUs (the driver decides the simulator's client cap and start lines)."""
    lines = ['[system]', f'driver_version = {driver}', f'cuda_driver_version = {cuda}', '']
    for gpu in gpus:
        lines += [f'[gpu{gpu["index"]}]', f'name = {gpu["name"]}', f'uuid = {gpu["uuid"]}', f'memory_total_mib = {gpu["memory"]}',
                  f'compute_capability = {gpu["cc"]}', 'compute_mode = default', 'mig_mode = disabled', '']
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write('\n'.join(lines))


class Deadline(Exception):
    """A side ran longer than --deadline."""


def _deadline(_signum: int, _frame: Optional[FrameType]) -> None:
    raise Deadline()


def run_side(base: str, control: List[str], client: List[str], extra_env: Dict[str, str],  # pylint: disable=too-many-positional-arguments
             deadline: int = 0, until: Optional[str] = None) -> List[dict]:
    """Play the transcript in base/{p,l}; results with base replaced by <BASE>.

    With a deadline (seconds) the run stops there: the steps played so far, then a ``deadline``
    step (tag C: a hard difference); the runner has killed what it started either way.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_MPS_'))}
    env.update({'CUDA_MPS_PIPE_DIRECTORY': os.path.join(base, 'p'), 'CUDA_MPS_LOG_DIRECTORY': os.path.join(base, 'l')})
    env.update(extra_env)
    runner = transcript.Runner(control, client, env)
    previous = signal.signal(signal.SIGALRM, _deadline)
    signal.alarm(deadline)
    try:
        results = runner.run(until=until)
    except Deadline:
        done = runner.results[-1]['id'] if runner.results else 'none'
        results = runner.results + [{'id': 'deadline', 'op': 'deadline', 'tag': 'C',
                                     'data': f'stopped by the {deadline}s deadline or a TERM; last step done: {done}'}]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return json.loads(json.dumps(results).replace(base, '<BASE>'))


def diff_text(name: str, real: object, sim: object) -> List[str]:
    """Unified diff of two values (as text)."""
    def lines(value: object) -> List[str]:
        if isinstance(value, str):
            return value.splitlines()
        return json.dumps(value, indent=1, sort_keys=True).splitlines()
    return list(difflib.unified_diff(lines(real), lines(sim), f'real {name}', f'simulator {name}', lineterm='', n=2))


def compare(real: List[dict], sim: List[dict]) -> Tuple[List[str], int, int]:
    """Report lines, number of differing steps, number of those tagged C."""
    report: List[str] = []
    differing = hard = 0
    for want, got in zip(real, sim):
        fields = [k for k in ('rc', 'stdout', 'stderr', 'data') if k in want or k in got]
        changed = [k for k in fields if want.get(k) != got.get(k)]
        if not changed:
            report.append(f'same    [{want["tag"]}] {want["id"]}')
            continue
        differing += 1
        hard += want['tag'] == 'C'
        report.append(f'DIFFERS [{want["tag"]}] {want["id"]}: {", ".join(changed)}')
        if 'commands' in want:
            report.append(f'    commands: {want["commands"]}')
        for key in changed:
            report.extend('    ' + line for line in diff_text(f'{want["id"]}.{key}', want.get(key), got.get(key)))
    return report, differing, hard


MATMUL = """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(30): a @ b
torch.cuda.synchronize(); print(round(30 * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12))
"""
ALLOC_MIB = '2048,3000,4096'


def effects(control: str, client: List[str], base: str, device: Dict[str, str], python: str = sys.executable) -> Dict[str, object]:
    """What the limits do to a real client: allocations under a 3G pinned limit and, where PyTorch is there,
    bf16 matmul throughput without MPS and at 25% active threads.  Real side only (the simulator has no memory
    and no SMs); everything it starts is ended."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_MPS_'))}
    env.update(device, CUDA_MPS_PIPE_DIRECTORY=os.path.join(base, 'p'), CUDA_MPS_LOG_DIRECTORY=os.path.join(base, 'l'))
    out: Dict[str, object] = {}

    def ui(*commands: str) -> str:
        return subprocess.run([control], input='\n'.join(commands) + '\n', env=env, capture_output=True, text=True, timeout=30,
                              check=False).stdout

    def matmul(environ: Dict[str, str]) -> object:
        proc = subprocess.run([python, '-c', MATMUL], env=environ, capture_output=True, text=True, timeout=120, check=False)
        return int(proc.stdout.split()[-1]) if proc.returncode == 0 and proc.stdout.split() else f'failed: {proc.stderr.strip()[-200:]}'

    try:
        for name in ('p', 'l'):
            os.makedirs(os.path.join(base, name), mode=0o755, exist_ok=True)
        subprocess.run([control, '-d'], env=env, capture_output=True, timeout=30, check=False)
        ui('set_default_device_pinned_mem_limit 0 3G')
        proc = subprocess.run(client + ['--alloc', ALLOC_MIB], env=env, capture_output=True, text=True, timeout=120, check=False)
        try:
            line = json.loads(proc.stdout.splitlines()[0])
            out['pinned 3G, allocations of 2048, 3000 and 4096 MiB'] = {
                'alloc_rc_by_mib': line.get('alloc_rc_by_mib'), 'free_mib': line.get('mem_free_mib'), 'total_mib': line.get('mem_total_mib')}
        except (ValueError, IndexError):
            out['pinned 3G, allocations of 2048, 3000 and 4096 MiB'] = f'failed: {proc.stdout.strip()} {proc.stderr.strip()}'[:300]
        ui('quit -t 5')
        if importlib.util.find_spec('torch') is not None:
            plain = {k: v for k, v in env.items() if k != 'CUDA_MPS_PIPE_DIRECTORY'}
            plain['CUDA_MPS_PIPE_DIRECTORY'] = os.path.join(base, 'none')  # no daemon there: CUDA runs without MPS
            throughput = {'no MPS': matmul(plain)}
            subprocess.run([control, '-d'], env=env, capture_output=True, timeout=30, check=False)
            ui('set_default_active_thread_percentage 25')
            throughput['25% active threads'] = matmul(env)
            ui('quit -t 5')
            out['bf16 8192x8192 matmul TFLOP/s'] = throughput
    finally:
        transcript.kill_all(transcript.processes_with(base + os.sep))
    return out


def effects_differences(recorded: Dict[str, object], seen: Dict[str, object]) -> List[str]:
    """Where the effects seen differ from the recording: the allocations' results exactly; throughput as a
    ratio (25% active threads must stay under half of no MPS, as 229/795 did)."""
    problems = []
    key = 'pinned 3G, allocations of 2048, 3000 and 4096 MiB'
    want, got = recorded.get(key), seen.get(key)
    if isinstance(want, dict) and (not isinstance(got, dict) or got.get('alloc_rc_by_mib') != want.get('alloc_rc_by_mib')):
        problems.append(f'{key}: recorded {want}, seen {got}')
    speed = seen.get('bf16 8192x8192 matmul TFLOP/s')
    if isinstance(speed, dict):
        full, cut = speed.get('no MPS'), speed.get('25% active threads')
        if not (isinstance(full, int) and isinstance(cut, int) and full > 0 and cut / full < 0.5):
            problems.append(f'matmul at 25% active threads against no MPS: {cut} vs {full} (recorded 229 vs 795)')
    return problems


def main(argv: List[str]) -> int:
    """Find the real stack or skip; run both sides; print the differences."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--json', help='write both runs here')
    parser.add_argument('--keep', action='store_true', help='keep the temporary directories')
    parser.add_argument('--recording', default=os.path.join(SIM_DIR, 'recorded', 'r580-h200.json'),
                        help='the recorded real answers to compare this run with (default: the r580 H200 recording)')
    parser.add_argument('--no-effects', action='store_true', help='skip the limits\' effects (allocations, matmul throughput)')
    parser.add_argument('--deadline', type=int, default=240, help='seconds each side may run (default 240)')
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _deadline)  # an outer timeout (run.sh) ends a side like its deadline: cleaned up

    real, others = find_real(NAME)
    if real is None:
        why = f' (found only non-ELF {", ".join(others)}: the simulator, not the real binary)' if others else ''
        print(f'SKIP: no real {NAME} on this host{why}')
        return 0
    smi = find_real('nvidia-smi')[0]
    if smi is None:
        print('SKIP: no real nvidia-smi on this host (no NVIDIA driver)')
        return 0
    try:
        gpus = query_gpus(smi)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f'SKIP: the NVIDIA driver does not answer: {exc}')
        return 0
    if not gpus:
        print('SKIP: nvidia-smi lists no GPU')
        return 0

    root = tempfile.mkdtemp(prefix='mpscmp', dir='/tmp')
    os.chmod(root, 0o755)
    try:
        ini = os.path.join(root, 'nvml.ini')
        driver, cuda = driver_version(smi), cuda_version(smi)
        write_ini(ini, gpus, driver, cuda)
        device = {'CUDA_VISIBLE_DEVICES': gpus[0]['uuid']}
        print(f'real binary: {real}; driver {driver}; device: {gpus[0]["name"]} {gpus[0]["uuid"]}; uid {os.geteuid()}; '
              f'python: {sys.executable}', flush=True)
        real_results = run_side(os.path.join(root, 'r'), [real], [sys.executable, os.path.join(HERE, 'cuda_client.py')], device,
                                args.deadline)
        sim_results = run_side(os.path.join(root, 's'), [sys.executable, os.path.join(SIM_DIR, 'mps_sim.py')],
                               [sys.executable, os.path.join(SIM_DIR, 'mps_client.py')], dict(device, FAKE_NVML_CONFIG=ini),
                               args.deadline)
        seen_effects = {} if args.no_effects else effects(real, [sys.executable, os.path.join(HERE, 'cuda_client.py')],
                                                          os.path.join(root, 'e'), device)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    host = {'binary': real, 'driver': driver, 'cuda': cuda, 'gpu': gpus[0]['name'], 'memory_mib': gpus[0]['memory'], 'uid': os.geteuid(),
            'date': time.strftime('%Y-%m-%d')}
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as handle:
            json.dump({'host': host, 'real': real_results, 'simulator': sim_results, 'effects': seen_effects}, handle, indent=1,
                      sort_keys=True)
    report, differing, hard = compare(real_results, sim_results)
    print('\n'.join(report))
    recording = transcript.load_recording(args.recording)
    recorded = recording['steps']
    for name, value in seen_effects.items():
        print(f'effect: {name}: {json.dumps(value, sort_keys=True)}')
    effect_problems = effects_differences(recording.get('effects', {}), seen_effects) if seen_effects else []
    for problem in effect_problems:
        print(f'this run differs from the recording ({os.path.basename(args.recording)}): {problem}')
    drift, new = len(effect_problems), 0
    for result in real_results:
        entry = recorded.get(result['id'], {})
        if entry.get('answer'):
            problems = transcript.differences(result['id'], entry['answer'], result)
            drift += bool(problems)
            for problem in problems:
                print(f'this run differs from the recording ({os.path.basename(args.recording)}): {problem}')
        elif 'unrecorded' in entry and result.get('op') not in ('mkdirs', 'rm_pipe', 'signal_daemon', 'client_kill', 'deadline'):
            new += 1
    late = [(side, r['data']) for side, rs in (('real', real_results), ('simulator', sim_results)) for r in rs if r['id'] == 'deadline']
    for side, text in late:
        print(f'DEADLINE ({side} run): {text}')
    print(f'SUMMARY: {len(real_results)} steps: {len(real_results) - differing} same, {differing} differ ({hard} of them tagged C); '
          f'{drift} differ from the recording; {new} answered that the recording marks unrecorded'
          + (' (tests/gpu/record.py RUN.json > tests/fakes/mps/recorded/<name>.json records them)' if new or drift else ''))
    return 1 if hard or late else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module-level benchmark: mps_limits and mps_daemon with nothing to change, on an 8-GPU daemon.

Run by fleetbench.py in a child process whose environment already points at a simulated host
(FAKE_NVML_CONFIG, LD_LIBRARY_PATH - the loader reads it at process start - and
FAKE_NVML_CALL_LOG), with the collection importable from ANSIBLE_COLLECTIONS_PATH.

It starts one daemon on all 8 GPUs (limits from replicas=4, one connected client so that one MPS
server runs), then alternates, ``--reps`` times:

- ``mps_limits`` no-op, its ``run()`` called in this process;
- the naive limits check (bench/naive.py): the same questions, one UI process each;
- ``mps_daemon`` no-op, its ``run()`` called in this process;
- the naive daemon check: one UI process, one ``nvidia-smi`` per GPU;

counting subprocesses started (subprocess.Popen, patched to count), control UI sessions (``NEW UI``
lines of control.log), NVML inits (the fake's call log) and the time spent. It also times whole
module processes (python start, imports, run) for mps_limits, mps_daemon and ansible.builtin.ping,
the per-task cost Ansible pays on top. Prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import typing as t

import naive

REPLICAS = 4
UI_SAMPLES = 20


class CountingPopen(subprocess.Popen):
    """subprocess.Popen that counts every process started through it (subprocess.run included)."""

    started = 0

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        CountingPopen.started += 1
        super().__init__(*args, **kwargs)


def _count_lines(path: str, needle: str) -> int:
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return sum(1 for line in handle if needle in line)
    except FileNotFoundError:
        return 0


class Probe:
    """Counters read before and after one measured call."""

    def __init__(self, control_log: str, nvml_log: str) -> None:
        self.control_log = control_log
        self.nvml_log = nvml_log

    def snapshot(self) -> t.Tuple[int, int, int, float]:
        return (CountingPopen.started, _count_lines(self.control_log, 'NEW UI'), _count_lines(self.nvml_log, ' nvmlInit'),
                time.perf_counter())

    def delta(self, before: t.Tuple[int, int, int, float]) -> t.Dict[str, float]:
        after = self.snapshot()
        return {'subprocesses': after[0] - before[0], 'ui_processes': after[1] - before[1], 'nvml_inits': after[2] - before[2],
                'seconds': after[3] - before[3]}


def _call(module: t.Any, args: t.Dict[str, t.Any]) -> t.Tuple[t.Dict[str, t.Any], float]:
    """Build the AnsibleModule for ``args`` (not timed), then time the module's ``run()``."""
    from ansible.module_utils.basic import AnsibleModule  # pylint: disable=import-outside-toplevel
    from ansible.module_utils.testing import patch_module_args  # pylint: disable=import-outside-toplevel

    with patch_module_args(args):
        ansible_module = AnsibleModule(argument_spec=module.argument_spec(), supports_check_mode=True)
    started = time.perf_counter()
    result = module.run(ansible_module)
    return result, time.perf_counter() - started


def _median_row(rows: t.Sequence[t.Dict[str, float]]) -> t.Dict[str, float]:
    keys = rows[0].keys()
    summary: t.Dict[str, float] = {key: statistics.median(row[key] for row in rows) for key in keys}
    summary['max_subprocesses'] = max(row['subprocesses'] for row in rows)
    summary['max_ui_processes'] = max(row['ui_processes'] for row in rows)
    summary['max_nvml_inits'] = max(row['nvml_inits'] for row in rows)
    return summary


def _process_seconds(argv: t.Sequence[str], env: t.Mapping[str, str], reps: int) -> t.Tuple[float, float]:
    """Median wall and CPU seconds of a whole module process (and what it runs)."""
    times, cpu = [], []
    for rep in range(reps):
        usage, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env), timeout=120, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(time.perf_counter() - started)
        cpu.append(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime)
        result = json.loads(proc.stdout or '{}') if proc.stdout.strip().startswith('{') else {}
        if proc.returncode != 0 or result.get('failed') or result.get('changed'):
            raise RuntimeError('module process %s (rep %d) failed or changed: rc=%d %s %s' % (
                argv[1], rep, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
    return statistics.median(times), statistics.median(cpu)


def _phases(argv: t.Sequence[str], env: t.Mapping[str, str]) -> t.Dict[str, float]:
    """One mps_host no-op process run under bench/phases.py: its phases, in seconds."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env), timeout=120, check=False)
    result = json.loads(proc.stdout) if proc.stdout.strip().startswith('{') else {}
    lines = [line for line in proc.stderr.splitlines() if line.startswith('PHASES ')]
    if proc.returncode != 0 or result.get('failed') or result.get('changed') or not lines:
        raise RuntimeError('mps_host under phases.py failed or changed: rc=%d %s %s' % (
            proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
    return json.loads(lines[-1][len('PHASES '):])


def main(argv: t.Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--sim-dir', required=True, help='the simulated host (its host/ laid out by make-simhost.sh)')
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--collections-path', required=True)
    args = parser.parse_args(argv)

    sys.path.insert(0, args.collections_path)
    subprocess.Popen = CountingPopen  # type: ignore[misc]
    # pylint: disable=import-outside-toplevel,import-error
    from ansible_collections.gpufleet.mps.plugins.modules import mps_daemon, mps_limits

    sim = args.sim_dir
    binary = os.path.join(sim, 'host', 'bin', 'nvidia-cuda-mps-control')
    nvidia_smi = os.path.join(sim, 'host', 'bin', 'nvidia-smi')
    root, config_dir = os.path.join(sim, 'root'), os.path.join(sim, 'etc')
    name = 'all8'
    pipe_dir, log_dir = os.path.join(root, name, 'pipe'), os.path.join(root, name, 'log')
    probe = Probe(os.path.join(log_dir, 'control.log'), os.environ['FAKE_NVML_CALL_LOG'])
    common = {'name': name, 'root': root, 'config_dir': config_dir, 'control_binary': binary}
    limits_args = dict(common, replicas=REPLICAS, create=True)
    daemon_args = dict(common, devices='all', supervisor='none', stop_timeout=5)

    # Set up: limits persisted, daemon started on all 8 GPUs, one client connected (one server).
    _call(mps_limits, limits_args)
    result, _seconds = _call(mps_daemon, daemon_args)
    if not result['changed'] or len(result['devices']) != 8:
        raise RuntimeError('the 8-GPU daemon did not start as expected: %r' % result)
    client_env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir)
    client = subprocess.Popen([os.path.join(sim, 'host', 'bin', 'mps-sim-client')], stdin=subprocess.PIPE,  # pylint: disable=consider-using-with
                              stdout=subprocess.PIPE, text=True, env=client_env)
    try:
        hello = json.loads(client.stdout.readline() if client.stdout else '{}')
        if not hello.get('ok'):
            raise RuntimeError('the MPS client did not connect: %r' % hello)
        gib = 40960 // REPLICAS
        rows: t.Dict[str, t.List[t.Dict[str, float]]] = {'mps_limits': [], 'naive_limits': [], 'mps_daemon': [], 'naive_daemon': []}
        for rep in range(args.reps):
            before = probe.snapshot()
            result, seconds = _call(mps_limits, limits_args)
            row = probe.delta(before)
            row['seconds'] = seconds
            if result['changed']:
                raise RuntimeError('mps_limits was not a no-op (rep %d): %r' % (rep, result))
            rows['mps_limits'].append(row)

            before = probe.snapshot()
            outcome = naive.naive_limits_noop(naive.Asker(binary, pipe_dir, log_dir), 8, 100.0 / REPLICAS, gib)
            rows['naive_limits'].append(probe.delta(before))
            if outcome['changed'] or outcome['servers'] != 1:
                raise RuntimeError('the naive limits check disagrees: %r' % outcome)

            before = probe.snapshot()
            result, seconds = _call(mps_daemon, daemon_args)
            row = probe.delta(before)
            row['seconds'] = seconds
            if result['changed']:
                raise RuntimeError('mps_daemon was not a no-op (rep %d): %r' % (rep, result))
            rows['mps_daemon'].append(row)

            before = probe.snapshot()
            outcome = naive.naive_daemon_noop(naive.Asker(binary, pipe_dir, log_dir), nvidia_smi, range(8))
            rows['naive_daemon'].append(probe.delta(before))
            if outcome['changed']:
                raise RuntimeError('the naive daemon check disagrees: %r' % outcome)

        # What one control UI process of the simulator costs: a Python process here, a native binary on a real host.
        asker = naive.Asker(binary, pipe_dir, log_dir)
        usage, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        for rep in range(UI_SAMPLES):
            asker.ask('get_default_active_thread_percentage')
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        ui_process = {'wall_s': (time.perf_counter() - started) / UI_SAMPLES,
                      'cpu_s': (after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime) / UI_SAMPLES}

        env = dict(os.environ, PYTHONPATH=args.collections_path)
        module_dir = os.path.join(args.collections_path, 'ansible_collections', 'gpufleet', 'mps', 'plugins', 'modules')
        measured = {
            'ping': _process_seconds([sys.executable, '-m', 'ansible.modules.ping', json.dumps({'ANSIBLE_MODULE_ARGS': {}})], env, args.reps),
            'mps_limits': _process_seconds([sys.executable, os.path.join(module_dir, 'mps_limits.py'),
                                            json.dumps({'ANSIBLE_MODULE_ARGS': limits_args})], env, args.reps),
            'mps_daemon': _process_seconds([sys.executable, os.path.join(module_dir, 'mps_daemon.py'),
                                            json.dumps({'ANSIBLE_MODULE_ARGS': daemon_args})], env, args.reps),
            # as the role's preflight asks it
            'mps_info': _process_seconds([sys.executable, os.path.join(module_dir, 'mps_info.py'), json.dumps({'ANSIBLE_MODULE_ARGS': {
                'root': root, 'config_dir': config_dir, 'control_binary': binary, 'gather': ['gpus', 'daemons']}})], env, args.reps),
        }
        # mps_host on the same daemon (its first run writes the ready mark, the local facts and the logrotate file):
        # where its module process spends the time of a no-op, phase by phase (bench/phases.py).
        host_args = {'root': root, 'config_dir': config_dir, 'control_binary': binary, 'supervisor': 'none', 'stop_timeout': 5,
                     'resources': [{'name': name, 'devices': 'all', 'replicas': REPLICAS}],
                     'local_facts_dir': os.path.join(sim, 'facts.d'), 'logrotate_dir': os.path.join(sim, 'logrotate.d')}
        host_argv = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'phases.py'),
                     json.dumps({'ANSIBLE_MODULE_ARGS': host_args})]
        subprocess.run(host_argv, capture_output=True, text=True, env=env, timeout=120, check=True)
        phases = [_phases(host_argv, env) for _rep in range(args.reps)]
        host_phases = {key: statistics.median(row[key] for row in phases) for key in phases[0]}
        measured['mps_host'] = _process_seconds([sys.executable, os.path.join(module_dir, 'mps_host.py'),
                                                 json.dumps({'ANSIBLE_MODULE_ARGS': host_args})], env, args.reps)
        measured['python'] = _process_seconds([sys.executable, '-c', 'print("{}")'], env, args.reps)
        processes = {name: wall for name, (wall, _cpu) in measured.items()}
        process_cpu = {name: cpu for name, (_wall, cpu) in measured.items()}
    finally:
        if client.stdin:
            client.stdin.close()
        client.wait(timeout=30)
        _call(mps_daemon, dict(daemon_args, state='stopped'))
    report = {
        'reps': args.reps,
        'gpus': 8,
        'servers': 1,
        'calls': {key: _median_row(value) for key, value in rows.items()},
        'process_seconds': processes,
        'process_cpu_seconds': process_cpu,
        'ui_process': ui_process,
        'mps_host_phases': host_phases,
    }
    json.dump(report, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

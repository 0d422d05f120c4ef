# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What MIG costs a no-op: the mps_host module on a MIG host against the same module on a host of whole GPUs.

Two simulated hosts, laid out by tests/fakes/make-simhost.sh in a fresh directory under ``--base``:

- ``whole``: h100x4.ini, three resources on GPUs 0, 1 and 2;
- ``mig``: mig-mixed.ini, three resources on GPU 0 (whole), MIG device 1:0 (3g.40gb) and MIG device 1:2 (1g.10gb),
  replicas by profile; GPU 2 is in MIG mode without instances (NVML is asked about its 7 empty slots).

Each host is provisioned once, then ``--reps`` rounds time, alternating, one whole module process of each
(``mps_host`` with nothing to change: python start, imports, NVML, one control UI process per daemon) and
one ``ansible.builtin.ping`` module process - the same-run baseline. Reported: median wall and CPU seconds,
NVML calls per run (the fake's call log) and control UI processes per run, and the ratios mig/whole and
each/ping. The hosts are torn down (state=absent) and every process of the run is ended at the end.

  ANSIBLE_COLLECTIONS_PATH=<tree> .venv/bin/python bench/migbench.py --reps 15 --out /tmp/migbench.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import typing as t

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKES = os.path.join(REPO, 'tests', 'fakes')

HOSTS = {
    'whole': ('h100x4.ini', [{'name': 'a', 'devices': [0], 'replicas': 4}, {'name': 'b', 'devices': [1], 'replicas': 4},
                             {'name': 'c', 'devices': [2], 'replicas': 4}]),
    'mig': ('mig-mixed.ini', [{'name': 'a', 'devices': [0], 'replicas': 4},
                              {'name': 'b', 'devices': ['1:0'], 'replicas': {'3g.40gb': 4, '1g.10gb': 2, 'default': 4}},
                              {'name': 'c', 'devices': ['1:2'], 'replicas': {'3g.40gb': 4, '1g.10gb': 2, 'default': 4}}]),
}


def _run(argv: t.Sequence[str], env: t.Mapping[str, str]) -> t.Tuple[t.Dict[str, t.Any], float, float]:
    """One module process: (its result, wall seconds, CPU seconds of it and its children)."""
    usage, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env), timeout=300, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - started
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    result = json.loads(proc.stdout) if proc.stdout.strip().startswith('{') else {}
    if proc.returncode != 0 or result.get('failed'):
        raise RuntimeError('%s failed: rc=%d %s %s' % (argv[1], proc.returncode, proc.stdout[-3000:], proc.stderr[-2000:]))
    return result, wall, cpu


class Host:
    """One simulated host and the module arguments for it."""

    def __init__(self, base: str, name: str, config: str, resources: t.List[t.Dict[str, t.Any]], lib: str, tree: str) -> None:
        self.dir = os.path.join(base, name)
        subprocess.run([os.path.join(FAKES, 'make-simhost.sh'), os.path.join(self.dir, 'host'), lib, sys.executable,
                        os.path.join(FAKES, 'nvml', 'configs', config)], check=True, capture_output=True)
        self.calls = os.path.join(self.dir, 'nvml-calls.log')
        self.env = dict(os.environ, FAKE_NVML_CONFIG=os.path.join(self.dir, 'host', 'nvml.ini'),
                        LD_LIBRARY_PATH=os.path.join(self.dir, 'host', 'lib'), FAKE_NVML_CALL_LOG=self.calls, PYTHONPATH=tree)
        self.args = {'resources': resources, 'root': os.path.join(self.dir, 'root'), 'config_dir': os.path.join(self.dir, 'etc'),
                     'control_binary': os.path.join(self.dir, 'host', 'bin', 'nvidia-cuda-mps-control'), 'supervisor': 'none',
                     'stop_timeout': 5, 'logrotate_dir': os.path.join(self.dir, 'logrotate.d'),
                     'local_facts_dir': os.path.join(self.dir, 'facts.d')}
        self.module = os.path.join(tree, 'ansible_collections', 'gpufleet', 'mps', 'plugins', 'modules', 'mps_host.py')

    def mps_host(self, **extra: t.Any) -> t.Tuple[t.Dict[str, t.Any], float, float, int]:
        before = _lines(self.calls)
        args_file = os.path.join(self.dir, 'args.json')  # a file: the arguments are too long for the command line form
        with open(args_file, 'w', encoding='utf-8') as handle:
            json.dump({'ANSIBLE_MODULE_ARGS': dict(self.args, **extra)}, handle)
        result, wall, cpu = _run([sys.executable, self.module, args_file], self.env)
        return result, wall, cpu, _lines(self.calls) - before


def _lines(path: str) -> int:
    try:
        with open(path, encoding='utf-8') as handle:
            return sum(1 for _line in handle)
    except FileNotFoundError:
        return 0


def main(argv: t.Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--reps', type=int, default=15)
    parser.add_argument('--out', help='write the results as JSON here too')
    parser.add_argument('--base', default=tempfile.gettempdir(), help='a fresh directory for the hosts is made in it')
    parser.add_argument('--lib', default=os.path.join(REPO, '.simhost', 'lib'), help='directory of the built fake libnvidia-ml.so.1')
    parser.add_argument('--collections-path', default=os.environ.get('ANSIBLE_COLLECTIONS_PATH', ''))
    args = parser.parse_args(argv)
    tree = args.collections_path.split(':')[0]
    if not os.path.isdir(os.path.join(tree, 'ansible_collections', 'gpufleet', 'mps')):
        parser.error('--collections-path (or ANSIBLE_COLLECTIONS_PATH) must hold ansible_collections/gpufleet/mps (make collection)')
    base = tempfile.mkdtemp(prefix='migb.', dir=args.base)
    hosts: t.Dict[str, Host] = {}
    try:
        for name, (config, resources) in HOSTS.items():
            hosts[name] = host = Host(base, name, config, resources, args.lib, tree)
            result, _wall, _cpu, _calls = host.mps_host()
            if not result.get('changed') or not result.get('ready'):
                raise RuntimeError('%s: the first run did not provision: %r' % (name, result))
        ping = [sys.executable, '-m', 'ansible.modules.ping', json.dumps({'ANSIBLE_MODULE_ARGS': {}})]
        rows: t.Dict[str, t.List[t.Tuple[float, float, int, int]]] = {'whole': [], 'mig': [], 'ping': []}
        for _rep in range(args.reps):
            for name, host in hosts.items():
                result, wall, cpu, calls = host.mps_host()
                if result.get('changed'):
                    raise RuntimeError('%s: not a no-op: %r' % (name, result.get('actions')))
                rows[name].append((wall, cpu, calls, int(result.get('ui_processes', -1))))
            _result, wall, cpu = _run(ping, os.environ)
            rows['ping'].append((wall, cpu, 0, 0))
        report: t.Dict[str, t.Any] = {'reps': args.reps, 'hosts': {name: {'config': HOSTS[name][0], 'resources': HOSTS[name][1]} for name in HOSTS}}
        for name, samples in rows.items():
            report[name] = {'wall_s': statistics.median(s[0] for s in samples), 'cpu_s': statistics.median(s[1] for s in samples),
                            'nvml_calls': max(s[2] for s in samples), 'ui_processes': max(s[3] for s in samples)}
        report['ratios'] = {
            'mig/whole wall': report['mig']['wall_s'] / report['whole']['wall_s'],
            'mig/whole cpu': report['mig']['cpu_s'] / report['whole']['cpu_s'],
            'whole/ping wall': report['whole']['wall_s'] / report['ping']['wall_s'],
            'mig/ping wall': report['mig']['wall_s'] / report['ping']['wall_s'],
        }
    finally:
        for host in hosts.values():
            try:
                host.mps_host(state='absent', resources=[])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print('teardown of %s failed: %s' % (host.dir, exc), file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(REPO, 'hacking', 'leftovers.py'), '--kill', base], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(report, indent=1, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, 'w', encoding='utf-8') as handle:
            handle.write(text + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where one mps_host module process spends its time, measured on the real AnsiballZ payload Ansible sends.

``phases.py`` imports the collection from a tree with compiled bytecode at hand; a module run by Ansible imports it
from the zip AnsiballZ writes to a temporary directory, with no bytecode, so every file is compiled on every run. This
runs that payload as Ansible does and splits its time:

- ``interpreter``: ``python -c pass`` (measured apart, the same interpreter), before anything below;
- ``ansiballz``: the wrapper until the module's own code starts (the payload written, the loader imported);
- ``compile_ansible`` / ``compile_collection``: compiling the payload's source (ansible's module_utils, the
  collection's), timed around every ``compile()`` of a file of the payload;
- ``exec_ansible`` / ``exec_collection``: running their module-level code (their import time less their compile time);
- ``nvml``: NVML init and the GPU list; ``observe`` (of which ``ui``: control UI processes), ``decide``, ``results``:
  as in ``phases.py``;
- ``rest``: argument parsing, the lock, execute, the result's JSON, the exit.

usage:
  payload_phases.py build --out FILE 'ARGS_JSON'   write an AnsiballZ file for mps_host with these module args
                                                     (ansible-playbook with ANSIBLE_KEEP_REMOTE_FILES; needs the
                                                     collection on ANSIBLE_COLLECTIONS_PATH)
  payload_phases.py run FILE                        run it once, timed (PHASES json on stderr, the result on stdout)
  payload_phases.py report FILE [--reps N]          run it N times as fresh processes (default 5): medians, JSON
"""

from __future__ import annotations

import builtins
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STARTED = time.perf_counter()
COLLECTION = 'ansible_collections/gpufleet/'
PHASES = ('ansiballz', 'compile_ansible', 'compile_collection', 'exec_ansible', 'exec_collection', 'nvml', 'observe', 'ui',
          'decide', 'results', 'rest')


def build(out: str, args: str) -> None:
    """One mps_host task run by ansible-playbook on localhost, its AnsiballZ file kept, copied to ``out``."""
    work = tempfile.mkdtemp(prefix='payload-')
    play = os.path.join(work, 'play.yml')
    with open(play, 'w', encoding='utf-8') as handle:
        json.dump([{'hosts': 'localhost', 'gather_facts': False,
                    'tasks': [{'gpufleet.mps.mps_host': json.loads(args)}]}], handle)
    env = dict(os.environ, ANSIBLE_KEEP_REMOTE_FILES='1', ANSIBLE_REMOTE_TMP=os.path.join(work, 'remote'))
    done = subprocess.run(['ansible-playbook', '-i', 'localhost,', '-c', 'local', '-e', 'ansible_python_interpreter=' + sys.executable,
                           play], env=env, capture_output=True, text=True, check=False)
    found = [os.path.join(top, name) for top, _, names in os.walk(os.path.join(work, 'remote')) for name in names
             if name == 'AnsiballZ_mps_host.py']
    if not found:
        sys.exit('payload_phases.py: no AnsiballZ_mps_host.py kept (ansible-playbook exit %d):\n%s' % (done.returncode, done.stdout[-2000:]))
    with open(found[0], 'rb') as source, open(out, 'wb') as target:
        target.write(source.read())
    print(out)


def run(path: str) -> None:
    """Run the AnsiballZ file in this process, as ``python FILE`` would, with the timers below."""
    phases = dict.fromkeys(PHASES, 0.0)
    compiled = {'ansible': 0.0, 'collection': 0.0}
    imported = {'ansible': 0.0, 'collection': 0.0}
    first_import = [None]
    real_compile = builtins.compile
    real_import = builtins.__import__
    depth = [0]
    patched = [False]

    def timed_compile(source, filename, *args, **kwargs):
        began = time.perf_counter()
        try:
            return real_compile(source, filename, *args, **kwargs)
        finally:
            name = str(filename)
            if '_payload.zip' in name:
                compiled['collection' if COLLECTION in name else 'ansible'] += time.perf_counter() - began

    def timed(owner, name, phase, first_only=False):
        real = getattr(owner, name)
        calls = [0]

        def wrapper(*args, **kwargs):
            calls[0] += 1
            if first_only and calls[0] > 1:
                return real(*args, **kwargs)
            began = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                phases[phase] += time.perf_counter() - began
        setattr(owner, name, wrapper)

    def patch_run_phases() -> None:
        host = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._host.manager')
        gpus = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._gpus')
        framing = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing')
        if patched[0] or host is None or gpus is None or framing is None:
            return
        patched[0] = True
        timed(gpus.Nvml, '__enter__', 'nvml')
        timed(gpus.Nvml, 'gpus', 'nvml', first_only=True)
        timed(host.HostManager, 'observe', 'observe')
        timed(host.HostManager, 'decide', 'decide')
        timed(host.HostManager, '_results', 'results')
        timed(framing.ControlClient, 'batch', 'ui')

    def timed_import(name, globals_=None, locals_=None, fromlist=(), level=0):
        # The outermost import of a package of the payload is timed whole (its own imports included): ansible's or the
        # collection's, by the importing module's package.
        package = (globals_ or {}).get('__name__', '') or ''
        if level:
            package = (globals_ or {}).get('__package__', '') or package
        target = name if not level else package + '.' + name
        owner = 'collection' if target.startswith('ansible_collections.gpufleet') or package.startswith(
            'ansible_collections.gpufleet') else 'ansible' if target.startswith('ansible') else None
        if owner is None or depth[0]:
            return real_import(name, globals_, locals_, fromlist, level)
        if first_import[0] is None:
            first_import[0] = time.perf_counter()
        depth[0] += 1
        began = time.perf_counter()
        try:
            return real_import(name, globals_, locals_, fromlist, level)
        finally:
            depth[0] -= 1
            imported[owner] += time.perf_counter() - began
            patch_run_phases()

    def report() -> None:
        total = time.perf_counter() - STARTED
        phases['ansiballz'] = (first_import[0] or STARTED) - STARTED
        phases['compile_ansible'] = compiled['ansible']
        phases['compile_collection'] = compiled['collection']
        phases['exec_ansible'] = max(imported['ansible'] - compiled['ansible'], 0.0)
        phases['exec_collection'] = max(imported['collection'] - compiled['collection'], 0.0)
        phases['total'] = total
        phases['rest'] = total - sum(phases[key] for key in PHASES if key not in ('ui', 'rest'))
        sys.stderr.write('PHASES ' + json.dumps(phases) + '\n')

    builtins.compile = timed_compile
    builtins.__import__ = timed_import
    sys.argv = [path]
    import runpy  # pylint: disable=import-outside-toplevel
    try:
        runpy.run_path(path, run_name='__main__')
    finally:
        builtins.compile = real_compile
        builtins.__import__ = real_import
        report()


def report_runs(path: str, reps: int) -> None:
    """``reps`` fresh processes of ``run``, and ``python -c pass`` as many times: the medians, one JSON document."""
    samples = []
    interpreter = []
    for _ in range(reps):
        began = time.perf_counter()
        subprocess.run([sys.executable, '-c', 'pass'], check=True)
        interpreter.append(time.perf_counter() - began)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), 'run', path], capture_output=True, text=True, check=False)
        line = next((line for line in done.stderr.splitlines() if line.startswith('PHASES ')), None)
        if line is None:
            sys.exit('payload_phases.py: the run reported no phases (exit %d):\n%s' % (done.returncode, done.stderr[-2000:]))
        samples.append(json.loads(line[len('PHASES '):]))
    medians = {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
    medians['interpreter'] = statistics.median(interpreter)
    print(json.dumps({'reps': reps, 'medians_s': medians, 'samples': samples}, indent=1, sort_keys=True))


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == 'build' and sys.argv[2] == '--out':
        build(sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else '{}')
    elif len(sys.argv) == 3 and sys.argv[1] == 'run':
        run(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == 'report':
        reps = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == '--reps' else 5
        report_runs(sys.argv[2], reps)
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main()

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
  payload_phases.py run FILE [--pyc DIR]            run it once, timed (PHASES json on stderr, the result on stdout)
  payload_phases.py report FILE [--reps N] [--pyc DIR]
                                                    run it N times as fresh processes (default 5): medians, JSON

``--pyc DIR`` measures what a bytecode cache would save before one is built into the modules (issue 42): a finder put
in front of the payload's zip serves each module's code object from DIR, keyed by the SHA-256 of its source and the
interpreter's magic number, compiling and storing it on a miss; ``load_cached`` is the time spent reading and
unmarshalling. A bench-only spike: nothing of it ships.
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
import typing as t

from phases import timed  # bench/phases.py, beside this script

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
    found = [os.path.join(top, name) for top, _dirs, names in os.walk(os.path.join(work, 'remote')) for name in names
             if name == 'AnsiballZ_mps_host.py']
    if not found:
        sys.exit('payload_phases.py: no AnsiballZ_mps_host.py kept (ansible-playbook exit %d):\n%s' % (done.returncode, done.stdout[-2000:]))
    with open(found[0], 'rb') as source, open(out, 'wb') as target:
        target.write(source.read())
    print(out)


class _CachedLoader:
    """A payload module's loader that takes its code object from the cache directory (stores it on a miss)."""

    def __init__(self, real, fullname, cache, phases):
        self.real, self.fullname, self.cache, self.phases = real, fullname, cache, phases

    def create_module(self, spec):  # pylint: disable=unused-argument
        return None

    def exec_module(self, module):
        import hashlib  # pylint: disable=import-outside-toplevel
        import importlib.util  # pylint: disable=import-outside-toplevel
        import marshal  # pylint: disable=import-outside-toplevel
        source = self.real.get_source(self.fullname)
        key = hashlib.sha256(importlib.util.MAGIC_NUMBER + source.encode('utf-8')).hexdigest()
        entry = os.path.join(self.cache, key)
        began = time.perf_counter()
        try:
            with open(entry, 'rb') as handle:
                code = marshal.loads(handle.read())
            self.phases['load_cached'] += time.perf_counter() - began
        except OSError:
            code = compile(source, module.__file__, 'exec', dont_inherit=True)
            with open(entry + '.tmp', 'wb') as handle:
                handle.write(marshal.dumps(code))
            os.replace(entry + '.tmp', entry)
        exec(code, module.__dict__)  # pylint: disable=exec-used

    def __getattr__(self, name):
        return getattr(self.real, name)


def _install_cache(cache: str, phases: dict) -> t.Any:
    """A finder in front of the payload's zip. Python 3.11's zipimporter compiles a module's source as soon as its spec
    is asked for (find_spec -> get_filename -> _get_module_code), so the spec is built here, from the zip's listing,
    and the zipimporter is only asked for the source."""
    import importlib.machinery  # pylint: disable=import-outside-toplevel
    import zipimport  # pylint: disable=import-outside-toplevel
    importers: dict = {}

    class Finder:  # pylint: disable=too-few-public-methods
        @staticmethod
        def find_spec(fullname, path=None, target=None):  # pylint: disable=unused-argument
            if not fullname.startswith(('ansible.', 'ansible_collections.')):
                return None
            payload = next((entry for entry in sys.path if entry.endswith('_payload.zip')), None)
            if payload is None:
                return None
            # a zipimporter answers for one directory of the zip, by a name's last component
            where = os.path.join(payload, fullname.rpartition('.')[0].replace('.', '/'))
            try:
                if where not in importers:
                    importers[where] = zipimport.zipimporter(where)
                real = importers[where]
                package = real.is_package(fullname)
            except zipimport.ZipImportError:
                return None  # not a file of the payload (a namespace package): the normal machinery finds it
            relative = fullname.replace('.', '/') + ('/__init__.py' if package else '.py')
            spec = importlib.machinery.ModuleSpec(fullname, _CachedLoader(real, fullname, cache, phases),
                                                  origin=os.path.join(payload, relative), is_package=package)
            if package:
                spec.submodule_search_locations = [os.path.join(payload, fullname.replace('.', '/'))]
            spec.has_location = True
            return spec

    os.makedirs(cache, mode=0o700, exist_ok=True)
    finder = Finder()
    sys.meta_path.insert(0, finder)
    return finder


def run(path: str, cache: str = '') -> None:
    """Run the AnsiballZ file in this process, as ``python FILE`` would, with the timers below."""
    phases = dict.fromkeys(PHASES, 0.0)
    phases['load_cached'] = 0.0
    compiled = {'ansible': 0.0, 'collection': 0.0}
    imported = {'ansible': 0.0, 'collection': 0.0}
    first_import = [None]
    real_compile = builtins.compile
    real_import = builtins.__import__
    depth = [0]
    patched = [False]
    finder = [None]

    def timed_compile(source, filename, *args, **kwargs):
        began = time.perf_counter()
        try:
            return real_compile(source, filename, *args, **kwargs)
        finally:
            name = str(filename)
            if '_payload.zip' in name:
                compiled['collection' if COLLECTION in name else 'ansible'] += time.perf_counter() - began

    def patch_run_phases() -> None:
        host = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._host.manager')
        gpus = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._gpus')
        framing = sys.modules.get('ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing')
        if patched[0] or host is None or gpus is None or framing is None:
            return
        patched[0] = True
        timed(phases, gpus.Nvml, '__enter__', 'nvml')
        timed(phases, gpus.Nvml, 'gpus', 'nvml', first_only=True)
        timed(phases, host.HostManager, 'observe', 'observe')
        timed(phases, host.HostManager, 'decide', 'decide')
        timed(phases, host.HostManager, '_results', 'results')
        timed(phases, framing.ControlClient, 'batch', 'ui')

    def timed_import(name, globals_=None, locals_=None, fromlist=(), level=0):
        # The outermost import of a package of the payload is timed whole (its own imports included): ansible's or the
        # collection's, by the importing module's package.
        package = (globals_ or {}).get('__name__', '') or ''
        if level:
            package = (globals_ or {}).get('__package__', '') or package
        target = name if not level else package + '.' + name
        owner = 'collection' if target.startswith('ansible_collections.gpufleet') or package.startswith(
            'ansible_collections.gpufleet') else 'ansible' if target.startswith('ansible') else None
        if finder[0] is not None and sys.meta_path[0] is not finder[0]:
            # AnsiballZ's loader puts finders of its own first: the cache's goes back in front of them
            sys.meta_path.remove(finder[0])
            sys.meta_path.insert(0, finder[0])
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
        # what a cache served is neither compiled nor run at import: counted apart (load_cached), out of both
        cached_share = phases['load_cached'] * imported['collection'] / max(imported['collection'] + imported['ansible'], 1e-9)
        phases['exec_ansible'] = max(imported['ansible'] - compiled['ansible'] - (phases['load_cached'] - cached_share), 0.0)
        phases['exec_collection'] = max(imported['collection'] - compiled['collection'] - cached_share, 0.0)
        phases['total'] = total
        phases['rest'] = total - sum(phases[key] for key in PHASES if key not in ('ui', 'rest')) - phases['load_cached']
        sys.stderr.write('PHASES ' + json.dumps(phases) + '\n')

    builtins.compile = timed_compile
    builtins.__import__ = timed_import
    if cache:
        finder[0] = _install_cache(cache, phases)
    sys.argv = [path]
    import runpy  # pylint: disable=import-outside-toplevel
    try:
        runpy.run_path(path, run_name='__main__')
    finally:
        builtins.compile = real_compile
        builtins.__import__ = real_import
        report()


def report_runs(path: str, reps: int, cache: str = '') -> None:
    """``reps`` fresh processes of ``run``, and ``python -c pass`` as many times: the medians, one JSON document."""
    samples = []
    interpreter = []
    for _rep in range(reps):
        began = time.perf_counter()
        subprocess.run([sys.executable, '-c', 'pass'], check=True)
        interpreter.append(time.perf_counter() - began)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), 'run', path] + (['--pyc', cache] if cache else []),
                              capture_output=True, text=True, check=False)
        line = next((line for line in done.stderr.splitlines() if line.startswith('PHASES ')), None)
        if line is None:
            sys.exit('payload_phases.py: the run reported no phases (exit %d):\n%s' % (done.returncode, done.stderr[-2000:]))
        samples.append(json.loads(line[len('PHASES '):]))
    medians = {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
    medians['interpreter'] = statistics.median(interpreter)
    print(json.dumps({'reps': reps, 'medians_s': medians, 'samples': samples}, indent=1, sort_keys=True))


def main() -> None:
    argv = sys.argv[1:]
    cache = ''
    if '--pyc' in argv:
        at = argv.index('--pyc')
        cache = os.path.abspath(argv[at + 1])
        del argv[at:at + 2]
    if len(argv) >= 3 and argv[0] == 'build' and argv[1] == '--out':
        build(argv[2], argv[3] if len(argv) > 3 else '{}')
    elif len(argv) == 2 and argv[0] == 'run':
        run(argv[1], cache)
    elif len(argv) >= 2 and argv[0] == 'report':
        reps = int(argv[3]) if len(argv) > 3 and argv[2] == '--reps' else 5
        report_runs(argv[1], reps, cache)
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main()

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where one mps_host module process spends its time: run as the module process itself, with timers around its phases.

``python phases.py '<module args as JSON>'`` behaves as ``python mps_host.py '<module args>'`` (the result JSON on stdout)
and prints, on stderr, one JSON line: seconds since the interpreter started running this script, split into

- ``import_ansible``: ``ansible.module_utils.basic`` (AnsibleModule and what it pulls in);
- ``import_collection``: mps_host and the module_utils it imports at the top (pynvml included);
- ``nvml_init``: NVML init and the GPU list (``Nvml.__enter__`` and ``Nvml.gpus``, first call);
- ``observe``: the host read into its view (``HostManager.observe``), of which ``ui`` is spent in control UI processes;
- ``decide``: the plan from the view (``HostManager.decide``: no I/O);
- ``results``: each resource observed again for the result (``HostManager._results``);
- ``rest``: argument parsing, the lock, the result's JSON, everything else.

modbench.py runs it as a whole process (so that imports are cold, as in every module execution) and reports medians,
beside the interpreter's own start (``python -c pass``), which comes before all of them.
"""

from __future__ import annotations

import json
import sys
import time

STARTED = time.perf_counter()


def timed(phases, owner, name, phase, first_only=False):
    """``owner.name`` replaced by a wrapper that adds the time of each call (only the first: ``first_only``) to
    ``phases[phase]`` (payload_phases.py times the same phases this way)."""
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


def main() -> None:
    phases = {'import_ansible': 0.0, 'import_collection': 0.0, 'nvml_init': 0.0, 'observe': 0.0, 'decide': 0.0, 'ui': 0.0,
              'results': 0.0}
    mark = time.perf_counter()
    import ansible.module_utils.basic  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    phases['import_ansible'] = time.perf_counter() - mark
    mark = time.perf_counter()
    # pylint: disable=import-outside-toplevel,import-error
    from ansible_collections.gpufleet.mps.plugins.modules import mps_host
    from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.manager import HostManager
    from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing import ControlClient
    phases['import_collection'] = time.perf_counter() - mark

    timed(phases, _gpus.Nvml, '__enter__', 'nvml_init')
    timed(phases, _gpus.Nvml, 'gpus', 'nvml_init', first_only=True)
    timed(phases, HostManager, 'observe', 'observe')
    timed(phases, HostManager, 'decide', 'decide')
    timed(phases, HostManager, '_results', 'results')
    timed(phases, ControlClient, 'batch', 'ui')

    def report():
        total = time.perf_counter() - STARTED
        phases['total'] = total
        phases['rest'] = total - sum(phases[key] for key in ('import_ansible', 'import_collection', 'nvml_init', 'observe', 'decide',
                                                             'results'))
        sys.stderr.write('PHASES ' + json.dumps(phases) + '\n')
    try:
        mps_host.main()
    finally:
        report()


if __name__ == '__main__':
    main()

# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every message the troubleshooting guide quotes is one that was really printed.

``tests/docs/messages.yml`` makes the guide's situations on a simulated GPU host of its own (a daemon
started by hand without its directories, another manager's daemon on a GPU, a daemon restarted behind the
collection's back, a crashed, a hung, an orphaned daemon, no driver, no nvidia-ml-py, MIG, ...) and writes
everything the modules, the control UI and the simulated daemon printed to ``messages.json``. This test then
takes, from the guide:

- every ``.. code-block:: text`` (tagged ``.. docs-test: message``),
- every inline literal (double back-quotes) of five words or more,
- every section title in double quotes,

and requires each to be found in one printed string, or to be in ``NOT_PRODUCED`` with the reason and the
test that produces it instead. Compared with whitespace collapsed (the guide wraps lines), ``...`` standing
for any text, any number after ``pid``, ``kill`` and ``CLIENT`` (a process id) and before ``s`` (a
duration), and the test's base directory cut from what was printed, so ``/run/nvidia/mps`` in the guide is
``<base>/main/run/nvidia/mps`` on the simulated host.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Dict, Iterator, List, Tuple

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
from private_host import PYTHON, private_host  # noqa: E402  pylint: disable=wrong-import-position

GUIDE = 'docs/docsite/rst/guide_troubleshooting.rst'

# Quoted texts this playbook does not make, each with why, and the test that produces it instead.
NOT_PRODUCED: Dict[str, str] = {
    'echo quit | CUDA_MPS_PIPE_DIRECTORY=<its pipe directory> nvidia-cuda-mps-control':
        'a command the guide tells the user to run, not a message',
    'all CUDA-capable devices are busy or unavailable':
        "the CUDA runtime's text for CUDA_ERROR_DEVICE_UNAVAILABLE, printed by a real CUDA process; the simulator has "
        'no CUDA runtime (recorded on the H200: ../shared/gpu-evidence, cuda_exclusive)',
    'gpufleet-mps: the daemon rejected a limit of ...':
        'printed by the systemd unit, which needs systemd: tests/unit/plugins/module_utils/test_systemd.py runs the '
        "unit's own start script and checks it",
    'another MPS control daemon started on /run/nvidia/mps/train/pipe at the same time':
        'a race between two managers in one instant: tests/unit/plugins/module_utils/test_daemon.py::'
        'test_a_start_that_loses_the_race_to_another_manager_says_so_and_touches_nothing_of_its_daemon',
    'the MPS control daemon for train (pid 11375) did not exit within 60s after quit; it was left running (see '
    '/run/nvidia/mps/train/log/control.log)':
        'needs a daemon that takes quit and stays (the simulator either answers quit and exits, or never answers it: '
        'the hung quit below): tests/unit/plugins/module_utils/test_daemon.py::'
        'test_a_quit_whose_ui_fails_while_the_daemon_lives_on_fails_naming_the_ui_error',
    'MPS daemons not healthy: train: ... (see the control.log in each one\'s log directory under /run/nvidia/mps)':
        'needs a daemon that answers its start and is gone before the same run ends; mps_host checks every listed '
        'daemon at its end (plugins/module_utils/_host/manager.py, _check_healthy)',
    'the MPS control daemon of train (pid 4242) was started with MPS protocol 3 (MPS v3: -p 3 or CUDA_MPS_PROTOCOL_VERSION=3), '
    'and this resource is managed with the legacy protocol: it was neither asked nor changed. Stop it with '
    '"nvidia-cuda-mps-control -q" with CUDA_MPS_PIPE_DIRECTORY set to its pipe directory (or by whatever started it), then run again':
        'needs a control binary with protocol 3 (binary 13040): tests/unit/plugins/modules/test_protocol.py starts a v3 '
        'daemon in a resource pipe directory by hand and checks this message from mps_host, mps_daemon and mps_info',
    'driver upgrade pending: NVML answers "RM has detected an NVML/RM version mismatch." - the NVIDIA driver\'s libraries '
    'were upgraded while the old kernel module is still loaded (a driver package upgraded without a reboot). Running MPS '
    'daemons keep serving with the old driver; nothing can be read or changed safely until the new module is loaded, so '
    'nothing was (a stop or teardown included): reboot (or stop every GPU process - each MPS daemon with "echo quit | '
    'nvidia-cuda-mps-control" and its CUDA_MPS_PIPE_DIRECTORY - reload the nvidia kernel modules and start '
    'nvidia-persistenced), then run again; each daemon still running from before is then restarted under the busy policy':
        'needs NVML to answer NVML_ERROR_LIB_RM_VERSION_MISMATCH (a fault of the fake NVML): '
        'tests/unit/plugins/modules/test_driver_state.py checks this message from mps_host, mps_daemon and mps_info',
    'driver upgrade pending: the MPS control daemon of train (pid 4242) runs /usr/bin/nvidia-cuda-mps-control, which '
    'was replaced or removed after it started ...':
        'needs the daemon\'s program removed under it: tests/unit/plugins/modules/test_driver_state.py runs the simulator '
        'from a hard link of the interpreter and removes it',
}

NUMBERS = re.compile(r'(?<=\bpid )\d+|(?<=\bkill )\d+|(?<=\bCLIENT )\d+|\b\d+(?=s\b)')


def squeeze(text: str) -> str:
    return ' '.join(text.split())


def guide_quotes() -> List[Tuple[int, str, str]]:
    """(line, kind, text) of every quoted message of the guide."""
    with open(os.path.join(REPO, GUIDE), encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    quotes: List[Tuple[int, str, str]] = []
    prose: List[str] = []
    i = 0
    while i < len(lines):
        block = re.match(r'^(\s*)\.\. code-block:: (\w+)\s*$', lines[i])
        if not block:
            title = re.match(r'^"(.+)"\s*$', lines[i])
            if title and i + 1 < len(lines) and re.match(r'^-{3,}\s*$', lines[i + 1]):
                quotes.append((i + 1, 'title', title.group(1)))
            prose.append(lines[i])
            i += 1
            continue
        j = i + 1
        body: List[str] = []
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith(block.group(1) + ' ')):
            body.append(lines[j])
            j += 1
        if block.group(2) == 'text':
            tag = next((line for line in lines[max(i - 3, 0):i] if 'docs-test:' in line), '')
            assert 'docs-test: message' in tag, f'{GUIDE}:{i + 1}: a text block that is not tagged ".. docs-test: message"'
            quotes.append((i + 1, 'block', squeeze('\n'.join(body))))
        prose.extend([''] * (j - i))
        i = j
    text = '\n'.join(prose)
    for found in re.finditer(r'``(.+?)``', text, re.S):
        literal = squeeze(found.group(1))
        if len(literal.split()) >= 5:
            quotes.append((text.count('\n', 0, found.start()) + 1, 'literal', literal))
    return quotes


def as_regex(quote: str) -> str:
    """The quoted text as a regular expression for a printed one (both whitespace-collapsed)."""
    out = ''
    for part in re.split(r'(\.\.\.)', quote):
        if part == '...':
            out += '.*?'
            continue
        at = 0
        for number in NUMBERS.finditer(part):
            out += re.escape(part[at:number.start()]) + r'\d+'
            at = number.end()
        out += re.escape(part[at:])
    return out


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.fixture(scope='module')
def printed() -> List[str]:
    """Everything the situations of messages.yml printed, base cut, whitespace collapsed (runs the playbook once)."""
    _work, base, sim = private_host('messages', 'docs-commands')
    sim_env = {'GPUFLEET_SIMHOST': sim, 'PATH': '%s/bin:%s:/usr/sbin:/usr/bin:/sbin:/bin' % (sim, os.path.dirname(PYTHON)),
               'LD_LIBRARY_PATH': os.path.join(sim, 'lib'), 'FAKE_NVML_CONFIG': os.path.join(sim, 'nvml.ini')}
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_'))}
    env.update(ANSIBLE_COLLECTIONS_PATH=os.environ['TEST_ROOT'], ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0')
    proc = subprocess.run([os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), os.path.join(REPO, 'tests', 'docs', 'messages.yml'),
                           '-e', 'python=' + PYTHON, '-e', 'base=' + base, '-e', json.dumps({'sim_env': sim_env})],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    with open(os.path.join(base, 'messages.json'), encoding='utf-8') as handle:
        situations = json.load(handle)
    missing = [name for name, result in situations.items() if not result]
    assert not missing, 'situations that did not run: %s' % ', '.join(missing)
    cut = re.compile(re.escape(base) + r'(?:/(?:main|hang|quithang|mig|trav|silent|noperm)(?=/))?')
    return [squeeze(cut.sub('', text)) for text in strings(situations)]


QUOTES = guide_quotes()


def test_the_guide_quotes_messages_and_every_exemption_is_still_quoted() -> None:
    assert len(QUOTES) >= 30
    quoted = {quote[2] for quote in QUOTES}
    assert not set(NOT_PRODUCED) - quoted, 'exemptions for texts the guide no longer quotes: %s' % (set(NOT_PRODUCED) - quoted)


@pytest.mark.parametrize('line, kind, quote', [q for q in QUOTES if q[2] not in NOT_PRODUCED],
                         ids=['%s:%d' % (q[1], q[0]) for q in QUOTES if q[2] not in NOT_PRODUCED])
def test_a_quoted_message_is_one_a_situation_printed(printed: List[str], line: int, kind: str, quote: str) -> None:
    regex = re.compile(as_regex(quote))
    if any(regex.search(text) for text in printed):
        return
    words = quote.split()[:4]
    near = [text for text in printed if ' '.join(words[:2]) in text][:3]
    pytest.fail('%s:%d: the %s %r is not what any situation printed%s' % (
        GUIDE, line, kind, quote, ''.join('\n  printed: ' + text[:400] for text in near)), pytrace=False)


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-q']))

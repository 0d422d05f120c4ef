# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""hacking/failed-task.py, which make molecule runs on failure so that CI's tail names the failed task: a molecule
log (colors, box drawing, folded headers) with an ignored failure, a rescued one and the real one."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / 'hacking' / 'failed-task.py'
BOX = '  \x1b[2m\u2502\x1b[0m '

LOG = [
    'PLAY [Units enabled and running, daemons healthy; a killed daemon comes back with',
    '  its limits] ***',
    '',
    'TASK [Refused as it should be] ****',
    '\x1b[31mfailed: [guest] (item=1) => {"msg": "no"}\x1b[0m',
    '\x1b[31mfailed: [guest] (item=2) => {"msg": "no"}\x1b[0m',
    '...ignoring',
    '',
    'TASK [Rescued] ****',
    'fatal: [guest]: FAILED! => {"msg": "rescued"}',
    '',
    'TASK [Wait for systemd to restart it] ****',
    'fatal: [guest]: FAILED! => {"attempts": 30, "changed": false,',
    '  "msg": "still inactive"}',
    '',
    'PLAY RECAP ****',
    'guest : ok=3 changed=0 unreachable=0 failed=1',
]


def run(tmp_path: Path, lines: list[str]) -> list[str]:
    log = tmp_path / 'molecule.log'
    log.write_text(''.join(BOX + line + '\n' for line in lines))
    done = subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_last_failure_not_ignored_is_named_with_its_play_and_task(tmp_path):
    assert run(tmp_path, LOG) == [
        'the last failed task:',
        '  PLAY [Units enabled and running, daemons healthy; a killed daemon comes back with its limits]',
        '  TASK [Wait for systemd to restart it]',
        '  fatal: [guest]: FAILED! => {"attempts": 30, "changed": false,',
        '    "msg": "still inactive"}',
    ]


def test_a_log_whose_only_failure_was_ignored_says_so(tmp_path):
    assert run(tmp_path, LOG[:8]) == ['failed-task.py: no failed task in %s' % (tmp_path / 'molecule.log')]


def test_a_playbook_that_does_not_parse_is_named_with_ansible_playbook_s_own_error(tmp_path):
    lines = LOG[:8] + ['\x1b[31m[ERROR]: YAML parsing failed: Colons in unquoted values must be followed by\x1b[0m',
                       '  a non-space character.', 'Origin: verify.yml:553:55', '',
                       '553         that: a: b', '\u2514\u2500 Return code: 4 \u2500\u2500\u2500', 'never read']
    log = tmp_path / 'molecule.log'
    log.write_text(''.join((BOX + line if not line.startswith(('\u2514', 'never')) else '  ' + line) + '\n' for line in lines)
                   + '\x1b[31mCRITICAL\x1b[0m Ansible return code was 4\n')
    done = subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        'no task failed; ansible-playbook said:',
        '  [ERROR]: YAML parsing failed: Colons in unquoted values must be followed by',
        '    a non-space character.',
        '  Origin: verify.yml:553:55',
        '  553         that: a: b',
    ]

# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role names no file of a module's: teardown is mps_daemon state=absent, which knows them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROLE = Path(__file__).resolve().parents[3] / 'roles' / 'fleet'

# What only the modules may know: the unit and its instances, drop-ins, the start record, the lock files,
# the pipe directory and its files, the persisted limits and environment files of the config directory.
INTERNAL = re.compile(r'\.service|\.started|\.lock\b|control_lock|/pipe\b|\.limits\b|\.limits\.json|\.env\b|service\.d|'
                      r'nvidia-cuda-mps-control\.pid')


def _task_files():
    """Tasks, defaults and handlers: what runs (the argument specs document the public layout, <root>/<name>/pipe)."""
    return sorted(path for part in ('tasks', 'defaults', 'handlers') for path in (ROLE / part).rglob('*.yml') if path.is_file())


def test_the_role_has_task_files_to_look_at():
    assert any(path.parent.name == 'tasks' for path in _task_files())


@pytest.mark.parametrize('path', _task_files(), ids=lambda path: str(path.relative_to(ROLE)))
def test_no_role_file_names_a_modules_internal_file(path):
    hits = [(number, line.strip()) for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
            if INTERNAL.search(line)]
    assert hits == [], '%s names files that belong to the modules: %s' % (path.relative_to(ROLE), hits)

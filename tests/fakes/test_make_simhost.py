# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""make-simhost.sh as a user calls it by hand: relative paths and a bare interpreter name give wrappers that work from
any directory and with the minimal environment the modules (and an SSH session) start them with."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent
LIBDIR = Path(os.environ.get('GPUFLEET_SIMHOST', '')) / 'lib'


@pytest.mark.parametrize('python', ['relative', 'bare'])
def test_the_wrappers_name_the_interpreter_by_an_absolute_path(tmp_path, python):
    if not (LIBDIR / 'libnvidia-ml.so.1').exists():
        pytest.skip('needs the simulated host of make simhost (GPUFLEET_SIMHOST)')
    venv_bin = Path(sys.executable).parent
    if python == 'relative':
        given, cwd, env = os.path.relpath(sys.executable, tmp_path), tmp_path, dict(os.environ)
    else:
        given, cwd, env = Path(sys.executable).name, tmp_path, dict(os.environ, PATH='%s:%s' % (venv_bin, os.environ['PATH']))
    subprocess.run([str(FAKES / 'make-simhost.sh'), 'host', os.path.relpath(LIBDIR, tmp_path), given], cwd=cwd, env=env,
                   check=True, capture_output=True)
    wrapper = (tmp_path / 'host' / 'bin' / 'nvidia-smi').read_text()
    exec_line = [line for line in wrapper.splitlines() if line.startswith('exec ')][0]
    assert exec_line.split()[1].strip('"').startswith('/'), exec_line
    # From another directory, with the bare environment of a module's subprocess or a non-interactive SSH command.
    proc = subprocess.run([str(tmp_path / 'host' / 'bin' / 'nvidia-smi'), '-L'], cwd='/', env={'PATH': '/usr/bin:/bin'},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and 'GPU 0' in proc.stdout, proc.stderr


def test_an_interpreter_that_is_not_there_is_refused(tmp_path):
    proc = subprocess.run([str(FAKES / 'make-simhost.sh'), str(tmp_path / 'host'), str(tmp_path), 'no-such-python3'],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and 'no-such-python3 is not on PATH' in proc.stderr

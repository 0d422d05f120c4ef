# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared transcript (tests/gpu/transcript.py) against the simulator: every expectation holds.

On a GPU host, tests/gpu/compare_mps.py plays the same transcript against the real
binary and prints where the two differ.
"""
from __future__ import annotations

import json
import re
from typing import Iterator

import pytest

from conftest import CLIENT, PYTHON, SIM, SimHost, new_base, remove_tree, write_ini
import transcript


@pytest.fixture(name='results', scope='module')
def fixture_results() -> Iterator[list[dict]]:
    """The transcript played once against the simulator (an r580 driver; the daemon sees GPUs 1 and 0, in that order)."""
    host = SimHost(new_base('tr'))
    write_ini(host.ini, driver='580.65.06', cuda='13000')
    try:
        runner = transcript.Runner([PYTHON, SIM], [PYTHON, CLIENT], host.environ(CUDA_VISIBLE_DEVICES='1,0'))
        yield runner.run()
    finally:
        host.kill_all()
        remove_tree(host.base)


def test_every_step_ran(results: list[dict]) -> None:
    assert [r['id'] for r in results] == [s['id'] for s in transcript.STEPS]


@pytest.mark.parametrize('step', [s for s in transcript.STEPS if 'expect' in s], ids=lambda s: s['id'])
def test_simulator_meets_the_transcript(results: list[dict], step: dict) -> None:
    result = next(r for r in results if r['id'] == step['id'])
    assert not transcript.check(step, result)


def test_ps_rows_are_normalised(results: list[dict]) -> None:
    out = next(r for r in results if r['id'] == 'ps')['stdout']
    assert out == ('PID ID SERVER DEVICE NAMESPACE COMMAND\n'
                   f'<CLIENT1> 0 <SERVER1> GPU-6a2b5c1e-1111-4000 {out.split()[10]} <COMMAND>\n')


def test_terminated_client_exits_non_zero(results: list[dict]) -> None:
    assert next(r for r in results if r['id'] == 'terminated-client')['data'] == 'exited non-zero'


def test_logs_are_fully_normalised(results: list[dict]) -> None:
    for which in ('control-log', 'server-log'):
        text = next(r for r in results if r['id'] == which)['data']
        assert text
        for line in text.splitlines():
            assert re.match(r'^\[<TS> (Control|Server|Other) <(DAEMON|SERVER)\d>\] ', line), line
            rest = re.sub(r'/tmp/\S*|GPU-[0-9a-f-]+|0x[0-9a-f]+|(?i:binary version: \d+)| \d{10} /\S+.*$|\d+\.\d', '', line)
            assert not re.search(r'\b\d{4,}\b', rest), line


def test_control_log_has_the_quoted_real_lines(results: list[dict]) -> None:
    text = next(r for r in results if r['id'] == 'control-log')['data']
    assert '] Starting control daemon using socket ' in text
    assert '] To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=' in text
    assert '] CUDA MPS Control binary version: 13000\n' in text
    assert '] NEW CLIENT <CLIENT1> from user 0: Server is not ready, push client to pending list\n' in text
    assert '[<TS> Control <SERVER1>] Starting new server <SERVER1> for user 0\n' in text
    assert '] NEW SERVER <SERVER1>: Ready\n' in text
    assert '] Cmd:set_default_device_pinned_mem_limit 0 3840M\n' in text


def test_the_questions_for_a_gpu_run_are_all_answered(results: list[dict]) -> None:
    answers = dict(line.split(': ', 1) for line in transcript.answers(results))  # labels hold no ': '
    assert [label for label, _step, _field in transcript.QUESTIONS] == list(answers)
    assert 'not run' not in answers.values()
    assert answers['lock on control_lock in /proc/locks (daemon running)'] == '["POSIX ADVISORY WRITE <DAEMON1>"]'
    assert json.loads(answers['pipe dir of 88 bytes'])['data']['files'] == ['control_lock', 'log']
    assert json.loads(answers['quit -t 2 with a client held - UI exit status and output'])['rc'] == 0
    assert 'CUDA MPS Control binary version: 13000' in json.loads(answers['control.log start lines (binary version line?)'])


def test_the_pipe_length_steps_leave_no_process(results: list[dict]) -> None:
    assert next(r for r in results if r['id'] == 'pipe-87')['data']['daemon'] == 'running'
    assert not transcript.processes_with('/pipe87-')

# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shared transcript (tests/gpu/transcript.py) against the simulator: every expectation holds.

On a GPU host, tests/gpu/compare_mps.py plays the same transcript against the real
binary and prints where the two differ.
"""
from __future__ import annotations

import re
from typing import Iterator

import pytest

from conftest import CLIENT, PYTHON, SIM, SimHost, new_base, remove_tree
import transcript


@pytest.fixture(name='results', scope='module')
def fixture_results() -> Iterator[list[dict]]:
    """The transcript played once against the simulator (daemon sees GPUs 1 and 0, in that order)."""
    host = SimHost(new_base('tr'))
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
            rest = re.sub(r'/tmp/\S*|GPU-[0-9a-f-]+|0x[0-9a-f]+|Binary version: \d+| \d{10} /\S+.*$|\d+\.\d', '', line)
            assert not re.search(r'\b\d{4,}\b', rest), line


def test_control_log_has_the_quoted_real_lines(results: list[dict]) -> None:
    text = next(r for r in results if r['id'] == 'control-log')['data']
    assert '] Starting control daemon using socket ' in text
    assert '] To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=' in text
    assert '] NEW CLIENT <CLIENT1> from user 0: Server is not ready, push client to pending list\n' in text
    assert '[<TS> Control <SERVER1>] Starting new server <SERVER1> for user 0\n' in text
    assert '] NEW SERVER <SERVER1>: Ready\n' in text
    assert '] Cmd:set_default_device_pinned_mem_limit 0 3840M\n' in text

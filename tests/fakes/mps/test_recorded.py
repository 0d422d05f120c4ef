# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulator against what a real daemon answered: recorded/r580-h200.json (an NVIDIA H200, driver 580.159.04).

The transcript (tests/gpu/transcript.py) is played once against the simulator, set up as
that host was (one GPU by UUID, the same name, driver and CUDA version), and every
recorded answer must come back exactly.  A step the real binary has not answered is
marked unrecorded in the file, never filled in from the simulator.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterator

import pytest

from conftest import CLIENT, HERE, PYTHON, SIM, SimHost, new_base, remove_tree, write_ini
import transcript

RECORDING = os.path.join(HERE, 'recorded', 'r580-h200.json')
RECORDED = transcript.load_recording(RECORDING)
UUID = 'GPU-5c0ffee0-2026-4204-8000-000000000200'
H200 = [('NVIDIA H200', UUID, 143155, '9.0')]
ANSWERED = [(step_id, entry) for step_id, entry in RECORDED['steps'].items() if entry.get('answer')]


BASES: list[str] = []  # the directories of the runs, to look for leftovers


def play(until: str | None = None, **switches: str) -> list[dict]:
    """The transcript against a simulated host like the recorded one (with FAKE_MPS_* switches); results."""
    host = SimHost(new_base('rec'))
    BASES.append(host.base)
    write_ini(host.ini, gpus=H200, driver='580.159.04', cuda='13000')
    os.chmod(host.base, 0o755)  # the uid 65534 client reaches the pipe dir, as under the real run's /tmp
    try:
        env = host.environ(CUDA_VISIBLE_DEVICES=UUID, **switches)
        return transcript.Runner([PYTHON, SIM], [PYTHON, CLIENT], env).run(until=until)
    finally:
        host.kill_all()
        remove_tree(host.base)


@pytest.fixture(name='results', scope='module')
def fixture_results() -> Iterator[dict[str, dict]]:
    """The whole transcript played once against the simulator's defaults, by step id."""
    yield {r['id']: r for r in play()}


def test_every_step_ran(results: dict[str, dict]) -> None:
    assert list(results) == [s['id'] for s in transcript.STEPS]


@pytest.mark.parametrize('step', [s for s in transcript.STEPS if 'expect' in s], ids=lambda s: s['id'])
def test_the_simulator_meets_what_is_expected_where_nothing_is_recorded(results: dict[str, dict], step: dict) -> None:
    assert not transcript.check(step, results[step['id']])


def test_no_pid_path_or_uuid_of_the_run_is_left_in_the_results(results: dict[str, dict]) -> None:
    text = json.dumps(list(results.values()))
    # modes, the GPU's memory, the binary version, a uid, the help's copyright years, the UUID no GPU has
    numbers = re.sub(r'(socket|file|fifo) 0[0-7]{3}|143155|13000|65534|2003 - 2025', '', text.replace(transcript.MISSING_UUID, ''))
    assert not re.search(r'(?<![\w.])\d{4,}(?![\w.])', numbers)
    assert '/tmp/' not in text and UUID not in text and UUID[:22] not in text


def test_nothing_the_transcript_started_is_left_running(results: dict[str, dict]) -> None:
    assert results
    assert not [pid for base in BASES for pid in transcript.processes_with(base + os.sep)]


def test_the_recording_has_an_entry_for_every_step_in_order() -> None:
    assert list(RECORDED['steps']) == [s['id'] for s in transcript.STEPS]


def test_each_entry_cites_its_evidence_or_says_why_it_is_unrecorded() -> None:
    for step_id, entry in RECORDED['steps'].items():
        if 'unrecorded' in entry:
            assert set(entry) == {'unrecorded'} and entry['unrecorded'].strip(), step_id
        else:
            assert set(entry) == {'evidence', 'answer'} and entry['evidence'].split(': ', 1)[0].endswith(('.txt', '.json', '(side "real")')), step_id


def test_a_step_a_real_run_answered_is_tagged_c_and_has_no_other_expectation() -> None:
    for step in transcript.STEPS:
        recorded = 'answer' in RECORDED['steps'][step['id']]
        assert (step['tag'] == 'C') == recorded, step['id']
        assert not (recorded and 'expect' in step), step['id']


@pytest.mark.parametrize('step_id,entry', ANSWERED, ids=[entry[0] for entry in ANSWERED])
def test_the_simulator_gives_the_recorded_answer(results: dict[str, dict], step_id: str, entry: dict) -> None:
    assert step_id in results, 'the transcript stopped before this step'
    assert not transcript.differences(step_id, entry['answer'], results[step_id]), entry['evidence']


# Each simulated answer the recording pins, switched back to the simulator's old one: the recording catches it
# (played up to the first step that shows it).
OLD_ANSWERS = [
    ('FAKE_MPS_NO_DAEMON_STREAM', 'stdout', 'no-daemon'),
    ('FAKE_MPS_MISSING_DIRS', 'create', 'start-no-dirs'),
    ('FAKE_MPS_UNSET_MEM_LIMIT', '0M', 'defaults'),
    ('FAKE_MPS_ERROR_STYLE', 'text', 'unknown-and-bad'),
    ('FAKE_MPS_DEVICE_CLIENT_LIST_FORMAT', 'uuid', 'server-state'),
    ('FAKE_MPS_CLIENT_ON_SERVER_LOSS', 'exits', 'quit-t-client'),
    ('FAKE_MPS_QUIT_REMOVES', 'all-but-lock', 'files-after-quit-t'),
    ('FAKE_MPS_LONG_PIPE', 'forum', 'pipe-88'),
    ('FAKE_MPS_LOCK_KIND', 'ofd', 'locks-running'),
]


@pytest.mark.parametrize('name,value,until', OLD_ANSWERS, ids=[f'{entry[0]}={entry[1]}' for entry in OLD_ANSWERS])
def test_an_old_simulated_answer_differs_from_the_recording(name: str, value: str, until: str) -> None:
    results = {r['id']: r for r in play(until=until, **{name: value})}
    assert until in results
    differing = [step_id for step_id, entry in ANSWERED if step_id in results and transcript.differences(step_id, entry['answer'], results[step_id])]
    assert until in differing

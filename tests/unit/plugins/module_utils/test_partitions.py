# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Static SM partitions: the option, lspart in both known layouts, the pure decision, the replies, the record."""
from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import ControlCommandError, InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import Limits
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.partitions import (
    decide_partitions, parse_lspart, parse_partitions, partitions_view,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.commands import check_applied, sm_partition_rm
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing import Reply
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.batch import parse_batch, batch_commands
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.store import start_environment

A = 'GPU-74d43ed3-cdf7-e667-3644-bf5b4f46ed65'
B = 'GPU-8f0e1d2c-0000-1111-2222-333344445555'
CODE = """GPU Partition free used free used clients
chunks chunks SM SM
GPU-74d43ed3 3 13 24 104
GPU-74d43ed3 Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA 7 56 Yes
GPU-74d43ed3 D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA 6 48 No
GPU-8f0e1d2c 16 0 128 0
"""
# NVIDIA's documented example's shape: '-' placeholders, 'chunk' in the second header line
DOCS = """GPU Partition free used free used clients
chunk chunk SM SM
GPU-74d43ed3 - 3 13 24 104 -
GPU-74d43ed3 Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA - 7 - 56 Yes
GPU-74d43ed3 D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA - 6 - 48 -
GPU-8f0e1d2c - 16 0 128 0 -
"""


@pytest.mark.parametrize('text', [CODE, DOCS], ids=['client code', 'NVIDIA docs'])
def test_lspart_is_read_in_both_known_layouts(text):
    seen = parse_lspart(text, [A, B])
    assert (seen[A].free_chunks, seen[A].used_chunks, seen[A].total_chunks, seen[B].total_chunks) == (3, 13, 16, 16)
    assert [(p.ident, p.chunks, p.sms, p.in_use) for p in seen[A].partitions] == [
        ('Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA', 7, 56, True), ('D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA', 6, 48, False)]
    assert partitions_view(seen)[1]['id'] == A + '/D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA'  # only the first slash is the UUID's
    assert seen[B].partitions == []


@pytest.mark.parametrize('text', ['Unknown command "lspart"', 'Static partitioning is not enabled', ''])
def test_an_answer_that_is_no_partition_table_is_none(text):
    assert parse_lspart(text, [A]) is None


def test_the_decision_keeps_listed_sizes_removes_idle_others_first_and_names_busy_ones():
    seen = parse_lspart(CODE, [A, B])
    out = decide_partitions((7, 4), seen, [A, B])  # A keeps its 7 (busy), loses the idle 6, gets a 4; B gets both
    assert out.commands == ['sm_partition rm %s D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA' % A, 'sm_partition add %s 4' % A,
                            'sm_partition add %s 7' % B, 'sm_partition add %s 4' % B]
    assert out.busy == [] and out.too_big == []
    busy = decide_partitions((6,), seen, [A])
    assert [part.chunks for part in busy.busy] == [7] and busy.commands == []  # the 6 is kept, the busy 7 cannot go
    assert decide_partitions((7, 6), seen, [A]).commands == []  # as wanted: nothing
    assert decide_partitions((16, 1), seen, [B]).too_big == ['%s has 16 chunks (128 SMs), 17 wanted' % B]


@pytest.mark.parametrize('value, message', [
    ('8', 'must be a list of partition sizes'), ({'a': 1}, 'must be a list'), ([0], '0 is not a positive number'),
    ([True], 'True is not a number of chunks'), (['x'], "'x' is not a number of chunks"), ([1] * 65, 'at most 64'),
])
def test_bad_partition_lists_are_refused_naming_the_parameter(value, message):
    with pytest.raises(InvalidParameterError, match=message) as caught:
        parse_partitions(value, 'resources[train].sm_partitions')
    assert caught.value.param == 'resources[train].sm_partitions'


def test_partition_lists_are_normalised_largest_first():
    assert parse_partitions([4, '8', 2]) == (8, 4, 2) and parse_partitions([]) == () and parse_partitions(None) == ()


def test_the_replay_creates_the_partitions_on_every_gpu_and_asks_for_dash_s():
    limits = Limits(active_thread_percentage=None, sm_partitions=(8, 4))
    cmds = limits.commands([A, B])
    assert cmds == ['sm_partition add %s 8' % A, 'sm_partition add %s 4' % A, 'sm_partition add %s 8' % B, 'sm_partition add %s 4' % B]
    assert start_environment(cmds) == {'MPS_STATIC_ARGS': '-S'}
    assert start_environment(Limits(active_thread_percentage=50.0).commands([A])) == {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '50.0'}


def test_records_without_partitions_read_and_write_as_before():
    plain = Limits(25.0, {'*': 1024}, 4)
    assert 'sm_partitions' not in plain.to_json()
    with_parts = Limits(25.0, {}, None, None, (8, 4))
    assert json.loads(with_parts.to_json())['sm_partitions'] == [8, 4]
    assert Limits.from_data(json.loads(with_parts.to_json())) == with_parts and not with_parts.empty
    assert 'static_partitioning' not in StartRecord(devices=[A]).to_json()
    record = StartRecord(devices=[A], static_partitioning=True)
    assert StartRecord.from_data(json.loads(record.to_json())).static_partitioning is True


@pytest.mark.parametrize('reply, ok', [
    ('Partition %s/Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA created' % A, True),
    ('%s/D/79e/DgwYMDAAAAAAAAAAAAAAAAAAAAAAAA' % A, True),  # NVIDIA's example prints the bare id
    ('Failed to fulfill the requested SM partition of 40 chunks, error CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION', False),
    ('Unknown command "sm_partition"', False),
    ('', False),
])
def test_a_partition_created_is_recognised_and_a_failure_raises_with_the_daemons_text(reply, ok):
    replies = [Reply('sm_partition add %s 7' % A, (reply,) if reply else ())]
    if ok:
        check_applied(replies)
    else:
        with pytest.raises(ControlCommandError, match='rejected'):
            check_applied(replies)


def test_a_removal_prints_nothing_and_its_refusal_raises():
    check_applied([Reply(sm_partition_rm(A, 'D/79e/Dgw+A='), ())])
    with pytest.raises(ControlCommandError, match='in use'):
        check_applied([Reply(sm_partition_rm(A, 'Dx4A'), ('Partition %s/Dx4A in use. Terminate all clients before removing.' % A,))])
    with pytest.raises(InvalidParameterError):
        sm_partition_rm(A, 'Dx4A\nquit')


def test_the_state_batch_asks_lspart_only_of_a_static_daemon():
    assert 'lspart' not in batch_commands(1, [])
    cmds = batch_commands(1, [], partitions=True)
    assert cmds[-1] == 'lspart'
    replies = [Reply(cmd, lines) for cmd, lines in zip(cmds, [('100.0',), ('',), ('',), ('0',), tuple(CODE.splitlines())])]
    assert parse_batch(replies, 1, [], partitions=True).lspart_text == CODE.strip()

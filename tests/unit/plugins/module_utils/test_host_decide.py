# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host plan's own decisions as tables - the ready mark, and the order of the changes. No process, no file."""
from __future__ import annotations

import itertools

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._host.decide import ReadyDecision, decide_ready, order_steps, pending_warning

# (id, absent, listed, down, ready=, the mark exists) -> decision
READY = [
    ('a no-op keeps the mark', False, ['train'], [], True, True, ReadyDecision(None, False)),
    ('the first run writes it', False, ['train'], ['train'], True, False, ReadyDecision(None, True)),
    ('a run that brings a resource down withdraws it first and writes it last', False, ['train', 'infer'], ['infer'], True,
     True, ReadyDecision('down during this run: infer', True)),
    ('a removed resource is down too', False, ['train'], ['old'], True, True, ReadyDecision('down during this run: old', True)),
    ('a lost mark comes back', False, ['train'], [], True, False, ReadyDecision(None, True)),
    ('an empty list is not ready', False, [], ['old'], True, True, ReadyDecision('no resource is listed', False)),
    ('an empty list without a mark', False, [], [], True, False, ReadyDecision(None, False)),
    ('a teardown withdraws it', True, [], ['train'], True, True, ReadyDecision('state=absent', False)),
    ('ready=false leaves it to the user', False, ['train'], ['train'], False, True, ReadyDecision(None, False)),
]


@pytest.mark.parametrize('absent, listed, down, enabled, exists, expected', [row[1:] for row in READY], ids=[row[0] for row in READY])
def test_decide_ready_table(absent, listed, down, enabled, exists, expected):
    assert decide_ready(absent=absent, listed=listed, down=down, enabled=enabled, exists=exists) == expected


def test_the_mark_never_stands_over_a_down_resource():
    """Property over every small case: after a run, a mark exists only when every listed resource is up and the list is
    not empty; while the run brings one down, no mark is left from before."""
    names = ['a', 'b']
    for absent, enabled, exists in itertools.product([False, True], repeat=3):
        for listed in ([], ['a'], names):
            for down in ([], ['a'], ['b'], names):
                decision = decide_ready(absent=absent, listed=listed, down=down, enabled=enabled, exists=exists)
                if not enabled:
                    continue
                during = exists and decision.withdraw is None  # the old mark stays during the run
                assert not (during and down), (absent, listed, down, exists)
                after = decision.mark or during
                assert after == (not absent and bool(listed)), (absent, listed, down, exists, decision)


def test_order_steps_puts_waits_first_then_head_body_tail():
    body = ['stop a', 'wait b', 'start a', 'wait c', 'start b']
    ordered = order_steps(body, ['withdraw'], ['logrotate', 'mark'], lambda step: step.startswith('wait'))
    assert ordered == ['wait b', 'wait c', 'withdraw', 'stop a', 'start a', 'start b', 'logrotate', 'mark']


def test_a_failed_change_keeps_its_kind_of_error_and_says_what_was_done_undone_and_not_done():
    """The one executor: the error raised is of the failed change's kind (a parameter's error keeps naming it), with the
    account of the run; what the failed change's resource had done is undone, in reverse order."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
    from ansible_collections.gpufleet.mps.plugins.module_utils._execute import execute
    from ansible_collections.gpufleet.mps.plugins.module_utils._outcome import Outcome
    done = []
    out = Outcome()
    first = out.act('write a', lambda: done.append('a'))
    first.undo = lambda: done.append('undo a')

    def refuse():
        raise InvalidParameterError('size', 'too small for what its files use')
    out.act('remount b', refuse)
    out.act('write c', lambda: done.append('c'))
    with pytest.raises(InvalidParameterError) as caught:
        execute(out)
    assert caught.value.param == 'size' and caught.value.msg.startswith('size: too small')
    assert 'undone: : write a' in caught.value.msg and 'not done: : remount b; : write c' in caught.value.msg
    assert done == ['a', 'undo a'] and [change.action for change in out.executed] == ['write a']


def test_one_pending_warning_names_each_resource_whose_running_servers_keep_their_limits():
    assert pending_warning([('train', []), ('infer', [])]) == []
    [warning] = pending_warning([('train', [{'pid': 7}, {'pid': 9}]), ('idle', []), ('infer', [{'pid': 11}])])
    assert warning.startswith('running MPS servers keep the limits they started with')
    assert 'train: 2 server(s) (pid 7, 9); infer: 1 server(s) (pid 11); running_servers=update' in warning
    assert 'idle' not in warning

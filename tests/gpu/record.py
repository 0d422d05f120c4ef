# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write a recording (tests/fakes/mps/recorded/*.json) from a real run of compare_mps.py --json.

    tests/gpu/run.sh --json /tmp/run.json                     # on the GPU host
    python3 tests/gpu/record.py /tmp/run.json > tests/fakes/mps/recorded/r580-h200.json

Every step of tests/gpu/transcript.py gets the real side's answer (rc, stdout, stderr,
data as the run normalised them) and cites the run's file; a step the run did not reach
(a deadline) or could not play (``not run: ...``) is marked unrecorded, never filled in.
The run's ``effects`` (allocations under a pinned limit, throughput: real side only, not
played against the simulator) are kept as they are; ``--keep-effects OLD`` takes those of an
existing recording instead (a run made with ``--no-effects``).  Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transcript  # noqa: E402  pylint: disable=wrong-import-position

ACTIONS = ('mkdirs', 'rm_pipe', 'signal_daemon', 'client_kill')
FIELDS = ('rc', 'stdout', 'stderr', 'data')


def recording(run: dict, source: str) -> dict:
    """The recording of one compare_mps.py --json run."""
    results = {r['id']: r for r in run['real']}
    steps = {}
    for step in transcript.STEPS:
        result = results.get(step['id'])
        if result is None:
            steps[step['id']] = {'unrecorded': f'{source}: the run stopped before this step'}
        elif isinstance(result.get('data'), str) and result['data'].startswith('not run'):
            steps[step['id']] = {'unrecorded': f'{source}: {result["data"]}'}
        else:
            answer = {} if step['op'] in ACTIONS else {k: result[k] for k in FIELDS if k in result}
            steps[step['id']] = {'evidence': f'{source}: step {step["id"]}', 'answer': answer}
    host = run.get('host', {})
    return {
        'recording': dict(host, evidence=source, how='tests/gpu/record.py from tests/gpu/run.sh --json'),
        'normalised': 'as tests/gpu/transcript.py Runner.normalise: pids as tokens in order of first sight, <BASE>, <GPU0>, <GPU0-SHORT>',
        'steps': steps,
    }


def main(argv: List[str]) -> int:
    """Print the recording of a run."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('run', help='the JSON file compare_mps.py --json (tests/gpu/run.sh --json) wrote')
    parser.add_argument('--keep-effects', metavar='OLD', help='a recording whose effects section to carry over')
    args = parser.parse_args(argv)
    with open(args.run, encoding='utf-8') as handle:
        run = json.load(handle)
    if not isinstance(run, dict) or not isinstance(run.get('real'), list):
        print(f'{args.run}: not a compare_mps.py --json file (no "real" list)', file=sys.stderr)
        return 2
    out = recording(run, os.path.basename(args.run))
    if args.keep_effects:
        out['effects'] = transcript.load_recording(args.keep_effects).get('effects', {})
    elif run.get('effects'):
        out['effects'] = dict(run['effects'], evidence=os.path.basename(args.run))
    json.dump(out, sys.stdout, indent=1, ensure_ascii=True)
    sys.stdout.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

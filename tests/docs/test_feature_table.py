# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The feature table says where each peer entry comes from (issue 44).

docs/docsite/rst/guide_features.rst compares this collection with five other MPS tools in one ``list-table``. Every
cell of the five peer columns (columns 3-7) names its source by a key in brackets (``N [dp-daemon]``), and every key
is defined once in the *Sources* list under the table (``- [dp-daemon] <repository>, <path or issue/PR>: <what it
shows>``). This test fails when a peer cell has no key, a key used is not defined, a defined key is never used or
defined twice, a row does not have 7 cells, or this collection's cell of the static SM partitions or MIG row does not
say it is simulated only. The parser is held to the number of rows the page has, so the test cannot pass on a table
it failed to read, and the checks are run on broken copies of the page, so each can be seen to fail.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PAGE = os.path.join(REPO, 'docs', 'docsite', 'rst', 'guide_features.rst')

COLUMNS = 7
PEERS = range(2, COLUMNS)  # columns 3-7: device plugin, DRA driver, Slurm, ECS, DeepOps
# Data rows of the table (the header row not counted): update with the table.
EXPECTED_ROWS = 20
# Rows whose gpufleet.mps cell must say it has not run on a real GPU: feature name prefix -> why.
SIMULATED_ONLY = {
    'Static SM partitions': 'no real GPU with a CUDA 13.1 driver has run them',
    'MIG devices': 'tests/gpu/mig_check.py needs a GPU in MIG mode and has not been run',
}
# Features the table must keep (a sample, so a parser that reads another table fails).
KNOWN = ('One daemon per resource', 'Client priority', 'Per-client slices', 'Restart after a driver upgrade',
         'Attribution of clients to containers and jobs', 'Job-scoped namespaces (MPS v3)', 'MPS v3 (named servers')
MARKS = ('Y', 'P', 'N', 'U', 'n/a')
KEY = re.compile(r'\[([a-z][a-z0-9]*(?:-[a-z0-9]+)+)\]')
DEFINITION = re.compile(r'^- \[([a-z][a-z0-9]*(?:-[a-z0-9]+)+)\] \S')


def page() -> str:
    with open(PAGE, encoding='utf-8') as handle:
        return handle.read()


def parse_table(text: str) -> Tuple[List[str], int, List[List[str]]]:
    """(options lines, widths count, rows) of the page's one list-table; each row a list of its cells' text (the
    continuation lines of a cell joined with a space), the header row first."""
    lines = text.split('\n')
    starts = [i for i, line in enumerate(lines) if line.strip() == '.. list-table::']
    assert len(starts) == 1, 'expected one list-table on the page, found %d' % len(starts)
    options: List[str] = []
    rows: List[List[str]] = []
    i = starts[0] + 1
    while i < len(lines) and lines[i].startswith('   :'):
        options.append(lines[i].strip())
        i += 1
    for line in lines[i:]:
        if not line.strip():
            continue
        if not line.startswith('   '):
            break  # the first line back at the margin ends the table
        if line.startswith('   * - '):
            rows.append([line[len('   * - '):].strip()])
        elif line.startswith('     - '):
            assert rows, 'a cell before the first row: %r' % line
            rows[-1].append(line[len('     - '):].strip())
        elif line.startswith('       ') and rows:
            rows[-1][-1] += ' ' + line.strip()
        else:
            raise AssertionError('a line of the table the parser does not know: %r' % line)
    widths = next((option for option in options if option.startswith(':widths:')), '')
    return options, len(widths.split()) - 1 if widths else 0, rows


def parse_sources(text: str) -> List[Tuple[str, str]]:
    """(key, the whole definition) of every item of the Sources list under the table, in order."""
    lines = text.split('\n')
    table_end = text.index('.. list-table::')
    heading = [i for i, line in enumerate(lines) if line == 'Sources' and i + 1 < len(lines)
               and set(lines[i + 1]) == {'-'} and len('\n'.join(lines[:i])) > table_end]
    assert len(heading) == 1, 'expected one "Sources" section under the table, found %d' % len(heading)
    found: List[Tuple[str, str]] = []
    for line in lines[heading[0] + 2:]:
        if not line.strip():
            continue
        if line.startswith('- '):
            match = DEFINITION.match(line)
            assert match, 'an item of the Sources list without a [key] at its start: %r' % line
            found.append((match.group(1), line))
        elif line.startswith('  ') and found:
            found[-1] = (found[-1][0], found[-1][1] + ' ' + line.strip())
        elif found:
            break  # the first paragraph after the list ends it (one before it introduces it)
    return found


def problems(text: str) -> List[str]:
    """Everything wrong with the table and its sources, as messages; empty when all is well."""
    found: List[str] = []
    options, widths, rows = parse_table(text)
    if ':header-rows: 1' not in options:
        found.append('the list-table has no ":header-rows: 1"')
    if widths != COLUMNS:
        found.append('the widths line has %d widths, not %d' % (widths, COLUMNS))
    sources = parse_sources(text)
    defined: Dict[str, int] = {}
    for key, _definition in sources:
        defined[key] = defined.get(key, 0) + 1
    found += ['[%s] is defined %d times in the Sources list' % (key, count)
              for key, count in sorted(defined.items()) if count > 1]
    used = set()
    for number, row in enumerate(rows):
        name = row[0] if row else '?'
        if len(row) != COLUMNS:
            found.append('row %d (%s) has %d cells, not %d' % (number, name, len(row), COLUMNS))
            continue
        if number == 0:
            continue  # the header
        for column in PEERS:
            cell = row[column]
            keys = KEY.findall(cell)
            used.update(keys)
            if not keys:
                found.append('%s, column %d (%s): no source key in %r' % (name, column + 1, rows[0][column], cell))
            if not cell.startswith(MARKS):
                found.append('%s, column %d (%s): no mark (%s) at its start: %r' % (
                    name, column + 1, rows[0][column], '/'.join(MARKS), cell))
            found += ['%s, column %d (%s): [%s] is not defined in the Sources list' % (
                name, column + 1, rows[0][column], key) for key in keys if key not in defined]
        for prefix, why in SIMULATED_ONLY.items():
            if name.startswith(prefix) and 'simulated only' not in row[1]:
                found.append('%s: the gpufleet.mps cell does not say "simulated only" (%s): %r' % (name, why, row[1]))
    found += ['[%s] is defined in the Sources list but used in no peer cell' % key
              for key in sorted(set(defined) - used)]
    return found


def test_the_parser_reads_the_whole_table():
    """Not vacuous: the parser sees every row, the header and the known features, and every source."""
    _options, widths, rows = parse_table(page())
    assert len(rows) - 1 == EXPECTED_ROWS, 'the parser read %d data rows, the page has %d (update EXPECTED_ROWS with ' \
        'the table)' % (len(rows) - 1, EXPECTED_ROWS)
    assert rows[0] == ['Feature', 'gpufleet.mps', 'device plugin', 'DRA driver', 'Slurm gres/mps', 'ECS GPU AMI',
                       'DeepOps'], rows[0]
    assert widths == COLUMNS
    names = [row[0] for row in rows[1:]]
    missing = [known for known in KNOWN if not any(name.startswith(known) for name in names)]
    assert missing == [], 'rows the table should have: %s' % missing
    for prefix in SIMULATED_ONLY:
        assert sum(name.startswith(prefix) for name in names) == 1, prefix
    assert len(parse_sources(page())) >= 10


def test_every_peer_cell_cites_a_defined_source_and_every_source_is_used():
    assert problems(page()) == []


def test_every_source_names_where_it_is_and_what_it_shows():
    """A definition names a repository (owner/name) and a path, an issue or a pull request, and says what it shows."""
    wrong = []
    for key, definition in parse_sources(page()):
        body = definition.split('] ', 1)[1]
        if not re.search(r'\b[\w.-]+/[\w.-]+\b', body) or ':' not in body:
            wrong.append(key)
        elif not re.search(r'``[^`]+``|#\d+', body.split(':', 1)[0]):
            wrong.append(key)
    assert wrong == [], 'sources that do not say repository, path or number, and what they show: %s' % wrong


def _broken(old: str, new: str, count: int = 1) -> str:
    text = page()
    assert old in text, 'the page no longer holds %r: update this test' % old
    return text.replace(old, new, count)


def test_each_check_fails_on_a_page_that_breaks_it():
    """The checks catch what they are for, each on a copy of the page broken for it."""
    cases = [
        # a peer cell without its key
        (_broken('     - N (one host-wide unit) [ecs-unit]\n', '     - N (one host-wide unit)\n'),
         'One daemon per resource, each seeing only its GPUs, column 6 (ECS GPU AMI): no source key'),
        # a key used in a cell that the Sources list does not define
        (_broken('[dra-gate]\n', '[dra-gates]\n'), '[dra-gates] is not defined in the Sources list'),
        # a defined key that no cell uses
        (_broken('- [ecs-mig] ', '- [ecs-mig] x\n- [ecs-unused] '), '[ecs-unused] is defined in the Sources list but '
         'used in no peer cell'),
        # a key defined twice
        (_broken('- [ecs-mig] ', '- [ecs-mig] x\n- [ecs-mig] '), '[ecs-mig] is defined 2 times'),
        # a row with a cell too few
        (_broken('     - N [do-prolog]\n   * - Pinned device memory limit', '   * - Pinned device memory limit'),
         'row 2 (Active thread percentage) has 6 cells'),
        # the widths line out of step with the columns
        (_broken(':widths: 22 14 14 14 12 12 12', ':widths: 22 14 14 14 12 12'), 'the widths line has 6 widths'),
        # this collection's static SM partitions and MIG cells no longer saying simulated only
        (_broken('- Y, simulated only (``sm_partitions``', '- Y (``sm_partitions``'),
         'Static SM partitions (CUDA 13.1): the gpufleet.mps cell does not say "simulated only"'),
        (_broken('- Y, simulated only (``tests/gpu/mig_check.py``', '- Y (``tests/gpu/mig_check.py``'),
         'MIG devices: the gpufleet.mps cell does not say "simulated only"'),
    ]
    for text, expected in cases:
        found = problems(text)
        assert any(expected in problem for problem in found), 'expected %r among %s' % (expected, found)
